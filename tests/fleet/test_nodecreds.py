"""Node credentials (issue 22 item 2; docs/fleet-scheduling.md#node-credentials): a fleet
file's ``[nodes.credentials]`` names an environment variable, never the secret; the secret is
sent as ``Authorization: Bearer`` on every request to that node and to no other, in place of
whatever the caller sent; no message and no repr ever shows it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import task

from nvpair.control.state import ControlState
from nvpair.fleet.credentials import Credential, read_credential
from nvpair.fleet.file import FleetFileError, load_fleet
from nvpair.fleet.polls import FleetService
from nvpair.wire.client.bodies import read_body
from nvpair.wire.client.framing import request_head
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import Answer, Fields
from tests.fleet.test_fleet_poll import Facades
from tests.rawengine import Engine, listening, reactor

SECRET = "sk-live-0123456789abcdef"

# -- env:NAME, read (pure) ------------------------------------------------------------------------


def test_a_variable_set_is_a_bearer_credential_whose_repr_hides_it() -> None:
    credential = read_credential("env:GPU1_KEY", {"GPU1_KEY": SECRET})
    assert credential == Credential("env:GPU1_KEY", b"Bearer " + SECRET.encode())
    assert SECRET not in repr(credential) and "GPU1_KEY" in repr(credential)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (SECRET, 'must be "env:NAME"'),
        ("Bearer " + SECRET, 'must be "env:NAME"'),
        (7, 'must be "env:NAME"'),
        (["env:K"], 'must be "env:NAME"'),
        ("env:", "NAME is letters, digits and _"),
        ("env:" + SECRET, "NAME is letters, digits and _"),
        ("env:1KEY", "NAME is letters, digits and _"),
        ("env:UNSET", "environment variable UNSET is not set"),
        ("env:EMPTY", "environment variable EMPTY is empty"),
        ("env:SPACED", "environment variable SPACED holds what a bearer token cannot"),
        ("env:BROKEN", "environment variable BROKEN holds what a bearer token cannot"),
        ("env:ACCENTED", "environment variable ACCENTED holds what a bearer token cannot"),
    ],
)
def test_what_is_wrong_is_said_and_the_secret_never(value: object, why: str) -> None:
    environ = {
        "EMPTY": "",
        "SPACED": SECRET + " x",
        "BROKEN": SECRET + "\r\nX-Injected: 1",
        "ACCENTED": SECRET + "é",
    }
    with pytest.raises(ValueError) as refused:
        read_credential(value, environ)
    message = str(refused.value)
    assert why in message
    assert SECRET not in message and "sk-live" not in message


# -- file:PATH and credential:NAME ----------------------------------------------------------------


def test_a_file_beside_the_fleet_file_with_its_trailing_newline_dropped(tmp_path: Path) -> None:
    (tmp_path / "gpu1.key").write_text(SECRET + "\n")
    credential = read_credential("file:gpu1.key", {}, tmp_path)
    assert credential == Credential("file:gpu1.key", b"Bearer " + SECRET.encode())


def test_a_systemd_credential_is_read_from_its_directory(tmp_path: Path) -> None:
    (tmp_path / "gpu1.key").write_text(SECRET)
    environ = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    credential = read_credential("credential:gpu1.key", environ, tmp_path / "elsewhere")
    assert credential == Credential("credential:gpu1.key", b"Bearer " + SECRET.encode())


@pytest.mark.parametrize(
    ("value", "environ", "why"),
    [
        ("file:", {}, "PATH is empty"),
        ("file:missing.key", {}, "file missing.key: cannot read"),
        ("file:empty.key", {}, "file empty.key is empty"),
        ("file:newline.key", {}, "file newline.key is empty"),
        ("file:two.key", {}, "file two.key holds what a bearer token cannot"),
        ("credential:k", {}, "credential k: CREDENTIALS_DIRECTORY is not set"),
        ("credential:missing", {"CREDENTIALS_DIRECTORY": "."}, "credential missing: cannot"),
        ("credential:../two.key", {"CREDENTIALS_DIRECTORY": "."}, "is not a file name"),
        ("credential:", {"CREDENTIALS_DIRECTORY": "."}, "is not a file name"),
    ],
)
def test_a_source_that_cannot_be_used_is_named_never_shown(
    tmp_path: Path, value: str, environ: dict[str, str], why: str
) -> None:
    (tmp_path / "empty.key").write_text("")
    (tmp_path / "newline.key").write_text("\n")
    (tmp_path / "two.key").write_text(SECRET + "\n\n")
    if "CREDENTIALS_DIRECTORY" in environ:
        environ = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    with pytest.raises(ValueError) as refused:
        read_credential(value, environ, tmp_path)
    assert why in str(refused.value) and "sk-live" not in str(refused.value)


def test_two_sources_for_one_url_are_refused_even_if_they_hold_the_same_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "k").write_text(SECRET)
    text = FILE.format(value="env:K") + SAME_URL.replace("env:OTHER", "file:k")
    assert refused(tmp_path, text, {"K": SECRET}) == (
        "nodes[2].credentials.llamacpp: nodes[0].credentials.llamacpp names another "
        "source for the same URL"
    )


# -- the fleet file -------------------------------------------------------------------------------


def node(node_id: str, url: str, credential: str | None = None) -> str:
    """One ``[[nodes]]`` table of llama.cpp at ``url``, with a credential when given."""
    text = f'[[nodes]]\nid = "{node_id}"\n[nodes.engines]\nllamacpp = "{url}"\n'
    if credential is not None:
        text += f'[nodes.credentials]\nllamacpp = "{credential}"\n'
    return text


FIRST, SECOND = "http://192.168.1.20:8080", "http://192.168.1.21:8080"

#: Two nodes, the first with a credential whose value the test fills in (``{value}``).
FILE = "[facades.llamacpp]\n" + node("gpu-box-1", FIRST, "{value}") + node("gpu-box-2", SECOND)

#: A third node at the first one's URL, with another variable.
SAME_URL = node("gpu-box-3", FIRST, "env:OTHER")


def refused(tmp_path: Path, text: str, environ: dict[str, str]) -> str:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(FleetFileError) as error:
        load_fleet(path, environ)
    return str(error.value).removeprefix(f"{path}: ")


def test_a_node_credential_is_read_from_the_environment_given(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FILE.format(value="env:GPU1_KEY"))
    fleet = load_fleet(path, {"GPU1_KEY": SECRET})
    assert fleet.authorizations() == {"http://192.168.1.20:8080": b"Bearer " + SECRET.encode()}
    assert fleet.nodes[0].credentials["llamacpp"].source == "env:GPU1_KEY"
    assert fleet.nodes[1].credentials == {}
    # Nothing that shows the fleet shows the secret.
    assert SECRET not in repr(fleet)


def test_without_credentials_nothing_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FILE.split("[nodes.credentials]")[0])
    assert load_fleet(path, {}).authorizations() == {}


def test_the_process_environment_is_read_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGHUP re-read passes no environment: the process's own is read then."""
    path = tmp_path / "fleet.toml"
    path.write_text(FILE.format(value="env:NVPAIR_TEST_NODE_KEY"))
    monkeypatch.setenv("NVPAIR_TEST_NODE_KEY", "k1")
    assert load_fleet(path).authorizations() == {"http://192.168.1.20:8080": b"Bearer k1"}
    monkeypatch.delenv("NVPAIR_TEST_NODE_KEY")
    with pytest.raises(FleetFileError, match="NVPAIR_TEST_NODE_KEY is not set"):
        load_fleet(path)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            FILE.format(value="env:GPU1_KEY"),
            "nodes[0].credentials.llamacpp: environment variable GPU1_KEY is not set",
        ),
        (FILE.format(value=SECRET), 'nodes[0].credentials.llamacpp: must be "env:NAME"'),
        (
            FILE.replace('llamacpp = "{value}"', 'lmstudio = "env:K"'),
            "nodes[0].credentials.lmstudio: the node has no engines.lmstudio URL",
        ),
        (
            FILE.replace('llamacpp = "{value}"', 'llama = "env:K"'),
            "nodes[0].credentials.llama: unknown engine 'llama'",
        ),
        (
            '[facades.llamacpp]\n[[nodes]]\nid = "a"\ncredentials = 5\n'
            '[nodes.engines]\nllamacpp = "http://h:1"\n',
            'nodes[0].credentials: must be a table of engine = "env:NAME"',
        ),
        (
            FILE.format(value="env:K") + SAME_URL,
            "nodes[2].credentials.llamacpp: nodes[0].credentials.llamacpp names another "
            "source for the same URL",
        ),
        (
            FILE.format(value="env:K").replace(
                "http://192.168.1.21:8080", f"http://admin:{SECRET}@192.168.1.21:8080"
            ),
            "nodes[1].engines.llamacpp: holds a user name or password: a node's secret is "
            'named in [nodes.credentials] as "env:NAME", never written in the file',
        ),
    ],
)
def test_a_credential_mistake_is_one_line_without_the_secret(
    tmp_path: Path, text: str, why: str
) -> None:
    environ = {"K": "k", "OTHER": "o"}
    message = refused(tmp_path, text, environ)
    assert message.startswith(why), message
    assert SECRET not in message and "\n" not in message


# -- the head sent to a node (pure) ---------------------------------------------------------------


def test_the_nodes_credential_replaces_the_callers_whatever_its_case() -> None:
    headers = Fields()
    headers.add(b"authorization", b"Bearer caller-one")
    headers.add(b"AUTHORIZATION", b"Bearer caller-two")
    headers.add(b"X-Keep", b"1")
    head = request_head(b"POST", b"/v1/chat/completions", b"h", headers, 2, b"Bearer node")
    assert b"caller" not in head
    assert head.lower().count(b"\r\nauthorization: ") == 1
    assert b"\r\nAuthorization: Bearer node\r\n" in head and b"\r\nX-Keep: 1\r\n" in head


def test_without_a_credential_the_callers_authorization_goes_as_before() -> None:
    headers = Fields.of({b"Authorization": [b"Bearer caller"]})
    with_none = request_head(b"GET", b"/", b"h", headers, None, None)
    assert with_none == request_head(b"GET", b"/", b"h", headers, None)
    assert b"\r\nAuthorization: Bearer caller\r\n" in with_none


def test_a_credential_that_would_break_the_head_is_refused() -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        request_head(b"GET", b"/", b"h", Fields(), None, b"Bearer a\r\nX: 1")


# -- over a real socket: every request to that node, and none to another --------------------------


@pytest.fixture
def keyed() -> Iterator[Engine]:
    yield from listening()


@pytest.fixture
def other() -> Iterator[Engine]:
    yield from listening()


def authorizations(engine: Engine) -> list[list[bytes]]:
    """The Authorization values of each request the engine read, in order."""
    out = []
    for request in engine.requests:
        lines = request.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
        out.append(
            [
                v
                for n, _, v in (line.partition(b": ") for line in lines)
                if n.lower() == b"authorization"
            ]
        )
    return out


@pytest_twisted.ensureDeferred
async def test_the_upstream_sends_a_nodes_credential_to_it_alone(
    keyed: Engine, other: Engine
) -> None:
    """One Headers object sent to both nodes (as a failover sends its attempts): the keyed
    node gets its credential in place of the caller's, the other the caller's, and the
    caller's headers are left as they were."""
    upstream = Upstream(reactor, 5.0)
    try:
        upstream.set_credentials({keyed.url: b"Bearer node-secret"})
        headers = Fields.of({b"Authorization": [b"Bearer caller"]})
        for url in (keyed.url, other.url, keyed.url):
            response = await upstream.request(url, b"POST", b"/v1/chat/completions", headers, b"{}")
            await _drain(response)
        assert authorizations(keyed) == [[b"Bearer node-secret"]] * 2
        assert authorizations(other) == [[b"Bearer caller"]]
        assert list(headers.items()) == [(b"Authorization", [b"Bearer caller"])]
        # Dropped by a reload: sent as the caller's again.
        upstream.set_credentials({})
        await _drain(await upstream.request(keyed.url, b"GET", b"/v1/models", headers, None))
        assert authorizations(keyed)[-1] == [b"Bearer caller"]
    finally:
        await upstream.close()


async def _drain(answer: Answer) -> None:
    await read_body(answer, reactor, 5.0, 1024)


@pytest_twisted.ensureDeferred
async def test_fleet_polls_carry_the_credential_and_a_reload_changes_it(
    keyed: Engine, tmp_path: Path
) -> None:
    """The fleet hands its credentials to the upstream at once and at each reload: every poll
    of the node (model list and load routes) carries the current one."""
    keyed.default = b'HTTP/1.1 200 OK\r\nContent-Length: 28\r\n\r\n{"object":"list","data":[]}\n'
    text = FILE.format(value="env:K").replace("http://192.168.1.20:8080", keyed.url)
    text = text.split('[[nodes]]\nid = "gpu-box-2"')[0]
    text = 'inventory-interval = "50ms"\n' + text
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    upstream = Upstream(reactor, 5.0)
    service = FleetService(
        reactor,
        load_fleet(path, {"K": "first"}),
        ControlState(),
        Facades(),
        upstream,
        5.0,
        credentials=upstream.set_credentials,
    )
    service.startService()
    try:
        # The model list, and the load routes /health, /slots and /v1/models.
        await keyed.until(lambda: len(keyed.requests) >= 4)
        assert authorizations(keyed)[:4] == [[b"Bearer first"]] * 4
        service.reload(load_fleet(path, {"K": "second"}))
        seen = len(keyed.requests)
        await keyed.until(lambda: len(keyed.requests) >= seen + 8)
        assert authorizations(keyed)[-4:] == [[b"Bearer second"]] * 4
    finally:
        service.stopService()
        await upstream.close()
        # Let the closed connections' ends run before the reactor is checked clean.
        await task.deferLater(reactor, 0.05, lambda: None)
