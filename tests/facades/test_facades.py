"""Facade port rules (docs/ports.md) on a MemoryReactor: defaults, persistence, moves, bind
races."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactor, MemoryReactorClock
from twisted.python.usage import UsageError

from nvpair.facades.facade import RequestHandler
from nvpair.facades.manager import FacadeError, FacadeManager
from nvpair.facades.ports import parse_alias
from nvpair.wire.server.body_budget import BodyBudget


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object]]] = []

    def notify(self, method: str, params: dict[str, object]) -> None:
        self.sent.append((method, params))

    def call(self, method: str, params: dict[str, object]) -> Any:
        raise AssertionError("not used")


class BusyReactor(MemoryReactorClock):
    """A MemoryReactor on which some ports are taken."""

    def __init__(self, taken: set[int]) -> None:
        super().__init__()
        self.taken = taken

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if port in self.taken:
            raise CannotListenError(interface, port, OSError(98, "Address already in use"))
        return super().listenTCP(port, factory, backlog, interface)


def manager(
    tmp_path: Path, taken: set[int] | None = None
) -> tuple[FacadeManager, BusyReactor, Outbox]:
    reactor, outbox = BusyReactor(taken or set()), Outbox()
    return built(reactor, outbox, tmp_path), reactor, outbox


def built(reactor: MemoryReactor, outbox: Outbox, state_dir: Path) -> FacadeManager:
    return FacadeManager(
        reactor,
        RequestHandler(),
        outbox,
        state_dir=state_dir,
        bind="::",
        max_request_body=10,
        bodies=BodyBudget(),
    )


def ports(reactor: MemoryReactor) -> list[int]:
    return [entry[0] for entry in reactor.tcpServers]


@pytest.mark.parametrize(
    ("engine", "default"), [("ollama", 11435), ("lmstudio", 1234), ("llamacpp", 8080)]
)
def test_absent_or_zero_port_is_the_standalone_default(
    tmp_path: Path, engine: str, default: int
) -> None:
    facades, reactor, outbox = manager(tmp_path)
    assert facades.enable(engine, None, [], False)["port"] == default
    assert ports(reactor) == [default]
    assert outbox.sent == [(f"{engine}:ready", {"port": default, "aliases": [], "tls": False})]


def test_persisted_port_wins_unless_ignored(tmp_path: Path) -> None:
    (tmp_path / "proxy-port.json").write_text(json.dumps({"port": 11500}))
    facades, _, _ = manager(tmp_path)
    assert facades.enable("ollama", 11434, [], False)["port"] == 11500
    facades2, _, _ = manager(tmp_path)
    assert facades2.enable("ollama", 11434, [], True)["port"] == 11434


def test_enable_is_idempotent_on_the_same_port(tmp_path: Path) -> None:
    facades, reactor, outbox = manager(tmp_path)
    facades.enable("llamacpp", 9000, [], False)
    assert facades.enable("llamacpp", 9000, [], False)["port"] == 9000
    assert ports(reactor) == [9000] and len(outbox.sent) == 1
    with pytest.raises(FacadeError) as refused:
        facades.enable("llamacpp", 9001, [], False)
    assert refused.value.tag == "conflict"


def test_bind_race_is_tagged_and_touches_no_other_facade(tmp_path: Path) -> None:
    facades, reactor, outbox = manager(tmp_path, taken={11434})
    facades.enable("llamacpp", 9000, [], False)
    with pytest.raises(FacadeError) as refused:
        facades.enable("ollama", 11434, [], False)
    error = refused.value
    assert (error.tag, error.engine, error.port) == ("bind", "ollama", 11434)
    assert outbox.sent[-1][0] == "ollama:error" and outbox.sent[-1][1]["tag"] == "bind"
    assert facades.enabled("llamacpp") and not facades.enabled("ollama")
    assert ports(reactor) == [9000]


def test_a_port_another_facade_listens_on_is_named_as_its(tmp_path: Path) -> None:
    """Two facades on one port (a persisted port, a broker's enable or move): the refusal names
    the facade that has it, not the address in use a bind would report (issue 20 item 2)."""
    facades, reactor, outbox = manager(tmp_path)
    facades.enable("ollama", 9000, [], False)
    facades.enable("lmstudio", 9001, [], False)
    with pytest.raises(FacadeError) as refused:
        facades.enable("llamacpp", 9000, [], False)
    error = refused.value
    assert (error.tag, error.engine, error.port) == ("bind", "llamacpp", 9000)
    assert error.message == "cannot listen on port 9000: the Ollama facade listens there"
    assert outbox.sent[-1] == (
        "llamacpp:error",
        {"tag": "bind", "port": 9000, "message": error.message},
    )
    with pytest.raises(FacadeError) as moving:
        facades.set_port("lmstudio", 9000)
    assert moving.value.message == "cannot listen on port 9000: the Ollama facade listens there"
    assert ports(reactor) == [9000, 9001] and facades.facades["lmstudio"].port == 9001


def test_set_port_moves_and_persists_atomically(tmp_path: Path) -> None:
    facades, reactor, outbox = manager(tmp_path)
    facades.enable("lmstudio", 1234, [], False)
    assert facades.set_port("lmstudio", 1300) == {"engine": "lmstudio", "port": 1300}
    assert json.loads((tmp_path / "lmstudio-proxy-port.json").read_text()) == {"port": 1300}
    assert ports(reactor) == [1234, 1300]
    assert outbox.sent[-1] == ("lmstudio:ready", {"port": 1300, "aliases": [], "tls": False})


def test_failed_move_keeps_the_old_port_and_persists_nothing(tmp_path: Path) -> None:
    facades, _, _ = manager(tmp_path, taken={1300})
    facades.enable("lmstudio", 1234, [], False)
    with pytest.raises(FacadeError):
        facades.set_port("lmstudio", 1300)
    assert facades.facades["lmstudio"].port == 1234
    assert not (tmp_path / "lmstudio-proxy-port.json").exists()


def test_corrupt_port_file_is_reported_and_ignored(tmp_path: Path) -> None:
    (tmp_path / "llamacpp-proxy-port.json").write_text('{"port": "eighty"}')
    facades, _, outbox = manager(tmp_path)
    assert facades.enable("llamacpp", 9000, [], False)["port"] == 9000
    method, params = outbox.sent[0]
    assert method == "llamacpp:errors:report" and params["code"] == "port-file-corrupt"


def test_occupied_alias_is_a_warning_and_the_primary_stays(tmp_path: Path) -> None:
    facades, reactor, outbox = manager(tmp_path, taken={11434})
    result = facades.enable("ollama", 11435, ["127.0.0.1:11434", "[::1]:11436"], False)
    assert result["aliases"] == ["[::1]:11436"]
    assert "ollama:errors:report" in [m for m, _ in outbox.sent]
    assert [(e[0], e[3]) for e in reactor.tcpServers] == [(11435, "::"), (11436, "::1")]


@pytest.mark.parametrize(
    "alias",
    ["192.168.1.2:11434", "localhost", "127.0.0.1:0", "127.0.0.1:99999", 5, "example.com:80"],
)
def test_aliases_must_be_loopback_host_port(alias: object) -> None:
    with pytest.raises(ValueError):
        parse_alias(alias)


class StoppablePorts(MemoryReactorClock):
    """A MemoryReactor whose listeners record being stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[int] = []

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        listener = super().listenTCP(port, factory, backlog, interface)
        stopped = self.stopped
        original = listener.stopListening

        def stop() -> Any:
            stopped.append(port)
            return original()

        listener.stopListening = stop
        return listener


def test_a_move_that_cannot_be_persisted_does_not_happen(tmp_path: Path) -> None:
    """set-port is one step: the facade stays where it was and the broker hears why."""
    state = tmp_path / "state"
    reactor, outbox = StoppablePorts(), Outbox()
    facades = built(reactor, outbox, state)
    facades.enable("lmstudio", 1234, [], False)
    state.rmdir() if state.exists() else None
    state.write_text("a file where the state directory should be")
    sent = len(outbox.sent)
    with pytest.raises(FacadeError) as refused:
        facades.set_port("lmstudio", 1300)
    assert refused.value.tag == "persist"
    assert facades.facades["lmstudio"].port == 1234
    assert reactor.stopped == [1300]  # the new listener, never the old one
    assert len(outbox.sent) == sent  # no ready for a move that did not happen


def test_an_alias_port_in_other_scripts_digits_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_alias("127.0.0.1:\u0661\u0661\u0664\u0663\u0664")


def test_facades_listen_with_a_backlog_sized_for_bursts(tmp_path: Path) -> None:
    """Twisted's default backlog of 50 overflows when hundreds of clients connect at once."""
    facades, reactor, _ = manager(tmp_path)
    facades.enable("ollama", 11500, ["127.0.0.1:11434"], False)
    assert [entry[2] for entry in reactor.tcpServers] == [4096, 4096]


def test_the_backlog_is_an_option(tmp_path: Path) -> None:
    from nvpair.tap import Options

    options = Options(environ={"HOME": str(tmp_path)})
    options.parseOptions(["--listen-backlog", "1024"])
    assert options.config is not None and options.config.listen_backlog == 1024
    with pytest.raises(UsageError):
        Options(environ={}).parseOptions(["--listen-backlog", "0"])


@pytest.mark.parametrize(
    "aliases",
    [
        ["127.0.0.1:11434", "127.0.0.1:11434"],
        [f"127.0.0.1:{20000 + n}" for n in range(17)],
        "127.0.0.1:11434",
    ],
)
def test_aliases_are_few_distinct_and_a_list(aliases: object) -> None:
    from nvpair.facades.ports import parse_aliases

    with pytest.raises(ValueError):
        parse_aliases(aliases)
