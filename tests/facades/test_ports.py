"""Tests for nvpair.facades.ports: persisted per-engine ports
(docs/ports.md#persisted-port-files)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from nvpair.facades.ports import (
    PortAbsent,
    PortCorrupt,
    PortFound,
    bind_host,
    read_persisted_port,
    write_persisted_port,
)


def test_round_trip(tmp_path: Path) -> None:
    """A written port reads back as that port."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)
    assert read_persisted_port(path) == PortFound(11500)


def test_file_format(tmp_path: Path) -> None:
    """The file is the documented {"port": 11500}."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)
    assert json.loads(path.read_bytes()) == {"port": 11500}


def test_overwrite(tmp_path: Path) -> None:
    """A second write replaces the first."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)
    write_persisted_port(path, 11501)
    assert read_persisted_port(path) == PortFound(11501)


def test_overwrite_a_corrupt_file(tmp_path: Path) -> None:
    """A corrupt file is ignored and then simply replaced by the next write."""
    path = tmp_path / "proxy-port.json"
    path.write_text("garbage")
    write_persisted_port(path, 11500)
    assert read_persisted_port(path) == PortFound(11500)


@pytest.mark.parametrize("port", [1, 65535])
def test_port_bounds_round_trip(tmp_path: Path, port: int) -> None:
    """The whole range 1-65535 is storable, ends included."""
    path = tmp_path / "p.json"
    write_persisted_port(path, port)
    assert read_persisted_port(path) == PortFound(port)


def test_write_creates_missing_directories(tmp_path: Path) -> None:
    """The state directory (and its parents) is created on first write."""
    path = tmp_path / "state" / "nvpair" / "proxy-port.json"
    write_persisted_port(path, 11500)
    assert read_persisted_port(path) == PortFound(11500)


def test_missing_file_is_absent(tmp_path: Path) -> None:
    """No file means nothing was persisted: absent, not corrupt."""
    assert read_persisted_port(tmp_path / "proxy-port.json") == PortAbsent()


def test_missing_directory_is_absent(tmp_path: Path) -> None:
    """A state directory that does not exist yet is the same as a missing file."""
    assert read_persisted_port(tmp_path / "nope" / "proxy-port.json") == PortAbsent()


@pytest.mark.parametrize(
    "content",
    [
        b'{"port": 11500, "engine": "ollama"}',
        b'  {"port": 11500}  \n',
        b'\xef\xbb\xbf{"port": 11500}',  # UTF-8 BOM, as some editors write it
        b'{"port": 1, "port": 11500}',  # duplicate key: the last wins, as in every JSON reader
    ],
    ids=["extra-key", "whitespace", "bom", "duplicate-key"],
)
def test_tolerated_forms(tmp_path: Path, content: bytes) -> None:
    """Harmless variations of the format still give the port."""
    path = tmp_path / "p.json"
    path.write_bytes(content)
    assert read_persisted_port(path) == PortFound(11500)


CORRUPT: list[tuple[bytes, str]] = [
    (b"", "not JSON"),
    (b"garbage", "not JSON"),
    (b'{"port": 11500', "not JSON"),
    (b'{"port": 11500}{"port": 1}', "not JSON"),
    (b"\xff\xfe\xfa", "not JSON"),
    (b"[" * 4000, "not JSON"),  # json.loads raises RecursionError on this
    (b"11500", "not a JSON object"),
    (b'[{"port": 11500}]', "not a JSON object"),
    (b"null", "not a JSON object"),
    (b'"11500"', "not a JSON object"),
    (b"{}", 'no "port" key'),
    (b'{"Port": 11500}', 'no "port" key'),
    (b'{"port": "11500"}', '"port" is not an integer'),
    (b'{"port": 11500.0}', '"port" is not an integer'),
    (b'{"port": 1.15e4}', '"port" is not an integer'),
    (b'{"port": null}', '"port" is not an integer'),
    (b'{"port": [11500]}', '"port" is not an integer'),
    (b'{"port": true}', '"port" is not an integer'),
    (b'{"port": false}', '"port" is not an integer'),
    (b'{"port": NaN}', '"port" is not an integer'),
    (b'{"port": Infinity}', '"port" is not an integer'),
    (b'{"port": 0}', '"port" is outside 1-65535'),
    (b'{"port": -1}', '"port" is outside 1-65535'),
    (b'{"port": 65536}', '"port" is outside 1-65535'),
    (b'{"port": 1' + b"0" * 4000 + b"}", '"port" is outside 1-65535'),
    (b'{"port": 11500, "x": "' + b"a" * 5000 + b'"}', "larger than 4096 bytes"),
]


@pytest.mark.parametrize(("content", "reason"), CORRUPT, ids=[repr(c)[:30] for c, _ in CORRUPT])
def test_corrupt_forms(tmp_path: Path, content: bytes, reason: str) -> None:
    """
    A file that is not JSON, not an object, or whose port is missing, not an int (bools
    included) or outside 1-65535 is corrupt, with a short one-line reason to report.
    """
    path = tmp_path / "proxy-port.json"
    path.write_bytes(content)
    result = read_persisted_port(path)
    assert result == PortCorrupt(reason)
    assert isinstance(result, PortCorrupt)
    assert len(result.reason) <= 60
    assert "\n" not in result.reason


def test_unreadable_is_corrupt(tmp_path: Path) -> None:
    """A file that exists but cannot be read (here: a directory) is reported, not absent."""
    path = tmp_path / "proxy-port.json"
    path.mkdir()
    result = read_persisted_port(path)
    assert isinstance(result, PortCorrupt)
    assert result.reason.startswith("unreadable: ")


class Crash(Exception):
    """The simulated crash between writing the temp file and renaming it."""


def test_crash_before_rename_keeps_old_file(tmp_path: Path) -> None:
    """A failure between the temp write and the rename leaves the old file intact."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)

    def crash(source: str, destination: str) -> None:
        raise Crash()

    with pytest.raises(Crash):
        write_persisted_port(path, 11600, replace=crash)
    assert read_persisted_port(path) == PortFound(11500)


def test_temp_file_is_complete_and_beside_the_target_at_rename(tmp_path: Path) -> None:
    """
    When the rename happens the temp file is fully written and in the target's directory
    (a rename is only atomic within one filesystem).
    """
    path = tmp_path / "proxy-port.json"
    seen: list[tuple[Path, bytes, str]] = []

    def inspect(source: str, destination: str) -> None:
        seen.append((Path(source).parent, Path(source).read_bytes(), destination))
        raise Crash()

    with pytest.raises(Crash):
        write_persisted_port(path, 11500, replace=inspect)
    [(directory, content, destination)] = seen
    assert directory == tmp_path
    assert json.loads(content) == {"port": 11500}
    assert destination == str(path)


def test_no_temp_file_left_after_success(tmp_path: Path) -> None:
    """A successful write leaves only the port file in the directory."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)
    write_persisted_port(path, 11501)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy-port.json"]


def test_no_temp_file_left_after_failure(tmp_path: Path) -> None:
    """A failed write removes its temp file: a crash-loop cannot fill the state dir."""
    path = tmp_path / "proxy-port.json"
    write_persisted_port(path, 11500)

    def crash(source: str, destination: str) -> None:
        raise Crash()

    for _ in range(3):
        with pytest.raises(Crash):
            write_persisted_port(path, 11600, replace=crash)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy-port.json"]


def test_failure_on_first_write_leaves_nothing(tmp_path: Path) -> None:
    """With no previous file, a failed write leaves the port absent and no temp file."""
    path = tmp_path / "proxy-port.json"

    def crash(source: str, destination: str) -> None:
        raise Crash()

    with pytest.raises(Crash):
        write_persisted_port(path, 11500, replace=crash)
    assert read_persisted_port(path) == PortAbsent()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("port", [0, -1, 65536, True, False])
def test_write_rejects_invalid_port(tmp_path: Path, port: int) -> None:
    """Writing a port the reader would call corrupt is a bug: refused, nothing written."""
    path = tmp_path / "proxy-port.json"
    with pytest.raises(ValueError, match="1-65535"):
        write_persisted_port(path, port)
    assert list(tmp_path.iterdir()) == []


def _resolver(known: dict[str, str]) -> Any:
    def resolve(host: str, port: None, family: int, kind: int) -> object:
        assert family == socket.AF_INET and kind == socket.SOCK_STREAM
        if host not in known:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(family, kind, 6, "", (known[host], 0))]

    return resolve


def test_bind_host_takes_addresses_as_they_are_and_resolves_names() -> None:
    """``--bind``: an address is not looked up; a name must resolve (to IPv4, as the listener
    binds it); one that does not is refused naming it (issue 20 item 2)."""
    resolve = _resolver({"gpu-box": "10.0.0.5"})
    for address in ("::", "0.0.0.0", "127.0.0.1", "::1", "fe80::1%eth0"):
        assert bind_host(address, _resolver({})) == address
    assert bind_host("gpu-box", resolve) == "gpu-box"
    with pytest.raises(
        ValueError, match=r"^cannot resolve host 'gpu-bx': Name or service not known$"
    ):
        bind_host("gpu-bx", resolve)
    with pytest.raises(ValueError, match=r"^must not be empty$"):
        bind_host(" ", resolve)


def test_bind_host_refuses_what_cannot_even_be_looked_up() -> None:
    with pytest.raises(ValueError, match=r"^cannot resolve host 'a\.\.b': "):
        bind_host("a..b")
