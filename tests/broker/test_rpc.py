"""Broker method params: every refusal names its field (-32602), and nothing odd gets stored."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from nvpair.broker.envelope import RpcError
from nvpair.broker.link import BrokerProtocol
from nvpair.broker.methods import MAX_GENERATION, BrokerMethods, parse_nodes, parse_priority
from nvpair.common.logs import LogObserver
from nvpair.control.state import ControlState
from nvpair.engines.table import LMSTUDIO, OLLAMA
from nvpair.facades.facade import RequestHandler
from nvpair.facades.manager import FacadeManager
from nvpair.wire.server.body_budget import BodyBudget

#: A port the stack's reactor refuses to bind, so bind failures (-32001) are reachable.
TAKEN_PORT = 9999


class _Reactor(MemoryReactorClock):
    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if port == TAKEN_PORT:
            raise CannotListenError(interface, port, OSError(98, "Address already in use"))
        return super().listenTCP(port, factory, backlog, interface)


class _Outbox:
    """The proxy → broker direction, wired to the link once it exists (as service.py does)."""

    def __init__(self) -> None:
        self.protocol: BrokerProtocol | None = None

    def notify(self, method: str, params: dict[str, object]) -> None:
        assert self.protocol is not None
        self.protocol.notify(method, params)

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        assert self.protocol is not None
        return self.protocol.call(method, params)


@frozen
class Stack:
    """The real link: BrokerProtocol over the real BrokerMethods, facades on a MemoryReactor.

    :ivar log: where ``observer`` writes; the caller decides whether it sees global events.
    :ivar lost: one entry per ``link_lost``.
    :ivar subscribe_failures: how the proxy's own ``discovery:subscribe`` calls failed.
    """

    protocol: BrokerProtocol
    transport: StringTransport
    control: ControlState
    facades: FacadeManager
    observer: LogObserver
    log: io.StringIO
    lost: list[None]
    subscribe_failures: list[Failure]

    def send(self, message: object) -> None:
        self.protocol.dataReceived(json.dumps(message).encode() + b"\n")

    def frames(self) -> list[dict[str, Any]]:
        out = [json.loads(line) for line in self.transport.value().splitlines()]
        self.transport.clear()
        return out

    def request(self, method: str, params: object) -> dict[str, Any]:
        """Send one request and return its answer (every other frame is dropped)."""
        self.transport.clear()
        self.send({"jsonrpc": "2.0", "id": "q", "method": method, "params": params})
        answers = [f for f in self.frames() if f.get("id") == "q" and "method" not in f]
        assert len(answers) == 1
        return answers[0]


def build_stack(state_dir: Path) -> Stack:
    reactor = _Reactor()
    log = io.StringIO()
    observer = LogObserver(log)
    control = ControlState()
    outbox = _Outbox()
    facades = FacadeManager(
        reactor,
        RequestHandler(),
        outbox,
        state_dir=state_dir,
        bind="127.0.0.1",
        max_request_body=64,
        bodies=BodyBudget(),
    )
    lost: list[None] = []
    failures: list[Failure] = []

    def enabled(engine: str) -> None:
        # As service.py: every newly enabled facade asks the broker for its discovery.
        outbox.call(f"{engine}:discovery:subscribe", {}).addErrback(failures.append)

    methods = BrokerMethods(control, facades, observer, lambda: lost.append(None), enabled)
    protocol = BrokerProtocol(methods)
    outbox.protocol = protocol
    transport = StringTransport()
    protocol.makeConnection(transport)
    return Stack(protocol, transport, control, facades, observer, log, lost, failures)


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    return build_stack(tmp_path)


def refused_field(call: Any) -> str:
    with pytest.raises(RpcError) as refused:
        call()
    assert refused.value.code == -32602
    assert refused.value.data is not None
    return str(refused.value.data["field"])


def answer_field(answer: Mapping[str, Any]) -> str:
    assert answer["error"]["code"] == -32602, answer
    return str(answer["error"]["data"]["field"])


def test_nodes_are_parsed_with_normalized_keys() -> None:
    nodes = parse_nodes(
        OLLAMA,
        {
            "nodes": [
                {"id": "a", "local": True, "models": ["Llama3"]},
                {"id": "b", "url": "https://10.0.0.2:11434", "models": []},
            ]
        },
    )
    assert nodes[0].local and nodes[0].models == ("Llama3",)
    assert nodes[0].model_keys == {OLLAMA.model_key("llama3:latest")}
    assert nodes[1].url == "https://10.0.0.2:11434" and nodes[1].model_keys == frozenset()


def test_lmstudio_keys_are_exact() -> None:
    nodes = parse_nodes(LMSTUDIO, {"nodes": [{"id": "a", "url": "http://h:1", "models": ["Q"]}]})
    assert nodes[0].model_keys == {"Q"}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "nodes"),
        ({"nodes": {}}, "nodes"),
        ({"nodes": [1]}, "nodes[0]"),
        ({"nodes": [{"url": "http://h:1"}]}, "nodes[0].id"),
        (
            {"nodes": [{"id": "a", "url": "http://h:1"}, {"id": "a", "url": "http://h:2"}]},
            "nodes[1].id",
        ),
        ({"nodes": [{"id": "a"}]}, "nodes[0].url"),
        ({"nodes": [{"id": "a", "url": "ftp://h"}]}, "nodes[0].url"),
        ({"nodes": [{"id": "a", "local": "yes"}]}, "nodes[0].local"),
        ({"nodes": [{"id": "a", "local": True, "models": "m"}]}, "nodes[0].models"),
        ({"nodes": [{"id": "a", "local": True, "models": [1]}]}, "nodes[0].models"),
    ],
)
def test_bad_nodes_name_the_field(params: dict[str, Any], field: str) -> None:
    assert refused_field(lambda: parse_nodes(OLLAMA, params)) == field


@pytest.mark.parametrize("node_id", ["", None, 1, True, [], {}, ["a"]])
def test_node_id_must_be_a_non_empty_string(node_id: object) -> None:
    params = {"nodes": [{"id": node_id, "local": True}]}
    assert refused_field(lambda: parse_nodes(OLLAMA, params)) == "nodes[0].id"


@pytest.mark.parametrize(
    "url",
    [
        "http://[",  # urlsplit raises ValueError on an unbalanced bracket
        "https://h:99999",  # .port raises later, per peer connection
        "https://h:abc",
        "http://h:0",
        "http://h:1/v1?x=1",  # the request path is appended to this URL
        "http://h:1#f",
        "http://user:pw@h:1",
        "http://h\x00:1",
        "http://h :1",
        "http://h\u00e9:1",
        "http:///path",
        "",
        1,
        True,
        ["http://h:1"],
        {"url": "http://h:1"},
    ],
)
def test_node_url_that_cannot_be_dialled_is_refused(url: object) -> None:
    params = {"nodes": [{"id": "a", "url": url}]}
    assert refused_field(lambda: parse_nodes(OLLAMA, params)) == "nodes[0].url"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:21434", "https://[::1]:8443", "https://h", "http://h:1/prefix"]
)
def test_dialable_node_urls_are_kept(url: str) -> None:
    assert parse_nodes(OLLAMA, {"nodes": [{"id": "a", "url": url}]})[0].url == url


def test_a_refused_url_never_reaches_the_peer_lookup(stack: Stack) -> None:
    """node_for_address reads .port of every https URL whose host matches: one bad port there
    would break the pin check of every peer connection from that host."""
    stack.request("facade/enable", {"engine": "ollama", "port": 11434})
    bad = {"nodes": [{"id": "a", "url": "https://10.0.0.2:99999"}]}
    assert answer_field(stack.request("ollama:discovery:nodes", bad)) == "nodes[0].url"
    good = {"nodes": [{"id": "b", "url": "https://10.0.0.2:8443"}]}
    assert stack.request("ollama:discovery:nodes", good)["result"] == {}
    assert stack.control.node_for_address("10.0.0.2", 8443) == "b"


@pytest.mark.parametrize("models", [[None], [["m"]], [{"m": 1}], {"m": 1}, None])
def test_models_must_be_a_list_of_strings(models: object) -> None:
    params = {"nodes": [{"id": "a", "local": True, "models": models}]}
    assert refused_field(lambda: parse_nodes(OLLAMA, params)) == "nodes[0].models"


def test_priority_snapshot() -> None:
    generation, entries = parse_priority(
        {"generation": 4, "nodes": [{"id": "a", "pending": 2, "gpuPressure": 0.5}]}
    )
    assert generation == 4 and entries[0].pending == 2 and entries[0].gpu_pressure == 0.5


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"nodes": []}, "generation"),
        ({"generation": True, "nodes": []}, "generation"),
        ({"generation": 1}, "nodes"),
        ({"generation": 1, "nodes": [{"id": "a", "pending": -1}]}, "nodes[0].pending"),
        ({"generation": 1, "nodes": [{"id": "a", "gpuPressure": "x"}]}, "nodes[0].gpuPressure"),
    ],
)
def test_bad_priority_names_the_field(params: dict[str, Any], field: str) -> None:
    assert refused_field(lambda: parse_priority(params)) == field


@pytest.mark.parametrize(
    "generation",
    [1.0, 1.5, -1, MAX_GENERATION + 1, pytest.param(10**400, id="10**400"), "1", None, [1], {}],
)
def test_generation_is_an_int64_counter(generation: object) -> None:
    """A float is no generation; one past int64 would make every later snapshot stale."""
    params = {"generation": generation, "nodes": []}
    assert refused_field(lambda: parse_priority(params)) == "generation"


def test_largest_generation_is_accepted() -> None:
    assert parse_priority({"generation": MAX_GENERATION, "nodes": []})[0] == MAX_GENERATION


@pytest.mark.parametrize(
    "value",
    [
        float("inf"),
        float("nan"),
        -float("inf"),
        pytest.param(10**400, id="10**400"),
        -0.5,
        True,
        None,
        "1",
        [1],
    ],
)
@pytest.mark.parametrize("name", ["pending", "gpuPressure"])
def test_load_figures_are_finite_and_not_negative(name: str, value: object) -> None:
    """Routing adds and compares these: inf and NaN would make the order meaningless, and an
    integer beyond any float used to raise OverflowError out of the handler."""
    params = {"generation": 1, "nodes": [{"id": "a", name: value}]}
    assert refused_field(lambda: parse_priority(params)) == f"nodes[0].{name}"


@pytest.mark.parametrize(
    ("nodes", "field"),
    [
        ([{"id": ""}], "nodes[0].id"),
        ([{"id": 1}], "nodes[0].id"),
        ([1], "nodes[0].id"),
        ([{"id": "a"}, {"id": "a"}], "nodes[1].id"),
    ],
)
def test_priority_ids_are_unique_non_empty_strings(nodes: list[object], field: str) -> None:
    params = {"generation": 1, "nodes": nodes}
    assert refused_field(lambda: parse_priority(params)) == field


def test_out_of_range_load_through_the_link_is_refused_and_not_applied(stack: Stack) -> None:
    """1e400 is valid JSON (it parses to inf): -32602 naming the field, state untouched."""
    line = b'{"jsonrpc":"2.0","id":1,"method":"node/set-priority","params":'
    line += b'{"generation":3,"nodes":[{"id":"a","pending":1e400}]}}\n'
    stack.protocol.dataReceived(line)
    assert answer_field(stack.frames()[0]) == "nodes[0].pending"
    assert stack.control.priority.generation == 0


@pytest.mark.parametrize("port", [True, 1.0, 65536, -1, "80", [80], {"p": 80}, 10**30])
def test_enable_port_must_be_an_integer_in_range(stack: Stack, port: object) -> None:
    answer = stack.request("facade/enable", {"engine": "ollama", "port": port})
    assert answer_field(answer) == "port"
    assert not stack.facades.enabled("ollama")


@pytest.mark.parametrize("engine", [None, "", "OLLAMA", "vllm", ["ollama"], {"ollama": 1}, 1])
def test_enable_engine_must_be_a_known_id(stack: Stack, engine: object) -> None:
    assert answer_field(stack.request("facade/enable", {"engine": engine})) == "engine"


@pytest.mark.parametrize(
    "aliases", ["127.0.0.1:1", [None], [["127.0.0.1:1"]], ["10.0.0.1:1"], ["127.0.0.1:0"], {}]
)
def test_enable_aliases_are_loopback_host_port_strings(stack: Stack, aliases: object) -> None:
    answer = stack.request("facade/enable", {"engine": "ollama", "aliases": aliases})
    assert answer_field(answer) == "aliases"


@pytest.mark.parametrize("flag", [1, "true", None, []])
def test_ignore_persisted_port_is_a_boolean(stack: Stack, flag: object) -> None:
    answer = stack.request("facade/enable", {"engine": "ollama", "ignorePersistedPort": flag})
    assert answer_field(answer) == "ignorePersistedPort"


@pytest.mark.parametrize("level", [None, 1, "", "DEBUG", ["debug"], "critical"])
def test_log_level_is_one_of_the_documented_names(stack: Stack, level: object) -> None:
    assert answer_field(stack.request("log/set-level", {"level": level})) == "level"


@pytest.mark.parametrize(
    ("method", "params", "field"),
    [
        ("ollama:node/select", {}, "nodeId"),
        ("ollama:node/select", {"nodeId": ""}, "nodeId"),
        ("ollama:node/select", {"nodeId": 1}, "nodeId"),
        ("ollama:node/select", {"nodeId": ["a"]}, "nodeId"),
        ("ollama:node/set-local-backend", {"url": 1}, "url"),
        ("ollama:node/set-local-backend", {"url": ""}, "url"),
        ("ollama:node/set-local-backend", {"url": "https://h:1"}, "url"),
        ("ollama:node/set-local-backend", {"url": "http://h:99999"}, "url"),
        ("ollama:node/set-local-backend", {"url": "http://["}, "url"),
        ("ollama:set-port", {}, "port"),
        ("ollama:set-port", {"port": True}, "port"),
        ("ollama:set-port", {"port": 70000}, "port"),
        ("ollama:set-port", {"port": 11500.0}, "port"),
    ],
)
def test_facade_methods_refuse_wrong_types(
    stack: Stack, method: str, params: dict[str, object], field: str
) -> None:
    assert "result" in stack.request("facade/enable", {"engine": "ollama", "port": 11434})
    assert answer_field(stack.request(method, params)) == field
    assert stack.control.pin("ollama") is None
    assert stack.control.local_backend("ollama") is None
    assert stack.facades.facades["ollama"].port == 11434


def test_bind_failure_is_tagged(stack: Stack) -> None:
    answer = stack.request("facade/enable", {"engine": "ollama", "port": TAKEN_PORT})
    assert answer["error"]["code"] == -32001
    assert answer["error"]["data"] == {"tag": "bind", "engine": "ollama", "port": TAKEN_PORT}


@pytest.mark.parametrize(
    ("tag", "code", "data"),
    [
        ("bind", -32001, {"tag": "bind", "engine": "ollama", "port": 11434}),
        ("persist", -32603, {"tag": "persist", "engine": "ollama", "port": 11434}),
        ("conflict", -32602, {"field": "port"}),
    ],
)
def test_a_facade_refusal_becomes_the_documented_error(
    tag: str, code: int, data: dict[str, object]
) -> None:
    """The facade manager speaks in domain terms; the broker edge alone knows JSON-RPC."""
    from nvpair.broker.methods import rpc_error
    from nvpair.facades.manager import FacadeError

    error = rpc_error(FacadeError(tag, "ollama", 11434, "why"))
    assert (error.code, error.data) == (code, data)
