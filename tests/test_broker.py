"""The broker link's framing, envelope and addressing (contract broker-protocol.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from twisted.internet.testing import StringTransport

from nvpair.broker import (
    MAX_LINE,
    Address,
    BrokerProtocol,
    Handler,
    MethodTable,
    RpcError,
    invalid_params,
    resolve_address,
)


class Table(MethodTable):
    def __init__(self) -> None:
        self.calls: list[tuple[Address, Mapping[str, Any]]] = []
        self.enabled = {"ollama"}
        self.lost = 0

    def handler(self, address: Address) -> Handler | None:
        if address.method in ("echo", "discovery:nodes", "node/set-priority"):
            return self._record
        if address.method == "refuse":
            return self._refuse
        if address.method == "crash":
            return self._crash
        return None

    def _record(self, address: Address, params: Mapping[str, Any]) -> object:
        self.calls.append((address, params))
        return {"ok": True}

    def _refuse(self, address: Address, params: Mapping[str, Any]) -> object:
        raise invalid_params("port", "bad port")

    def _crash(self, address: Address, params: Mapping[str, Any]) -> object:
        raise ZeroDivisionError

    def facade_enabled(self, engine: str) -> bool:
        return engine in self.enabled

    def link_lost(self) -> None:
        self.lost += 1


@pytest.fixture
def link() -> tuple[BrokerProtocol, StringTransport, Table]:
    table = Table()
    protocol = BrokerProtocol(table)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, table


def frames(transport: StringTransport) -> list[dict[str, Any]]:
    out = [json.loads(line) for line in transport.value().splitlines()]
    transport.clear()
    return out


def send(protocol: BrokerProtocol, message: object) -> None:
    protocol.dataReceived(json.dumps(message).encode() + b"\n")


@pytest.mark.parametrize(
    ("method", "engine", "rest"),
    [
        ("ollama:ready", "ollama", "ready"),
        ("llamacpp:node/select", "llamacpp", "node/select"),
        ("lmstudio:errors:report", "lmstudio", "errors:report"),
        ("errors:report", None, "errors:report"),
        ("workload:submitted", None, "workload:submitted"),
        ("facade/enable", None, "facade/enable"),
        ("vllm:ready", None, "vllm:ready"),
    ],
)
def test_only_a_known_engine_id_is_an_address(method: str, engine: str | None, rest: str) -> None:
    """Spec §4: errors:report is not engine "errors"."""
    assert resolve_address(method) == Address(engine, rest)


def test_request_gets_its_result(link: Any) -> None:
    protocol, transport, table = link
    send(protocol, {"jsonrpc": "2.0", "id": 7, "method": "node/set-priority", "params": {"a": 1}})
    assert frames(transport) == [{"jsonrpc": "2.0", "id": 7, "result": {"ok": True}}]
    assert table.calls == [(Address(None, "node/set-priority"), {"a": 1})]


def test_lines_may_arrive_split_and_batched(link: Any) -> None:
    protocol, transport, _ = link
    data = b"".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": "echo"}).encode() + b"\n" for i in (1, 2)
    )
    for index in range(len(data)):
        protocol.dataReceived(data[index : index + 1])
    assert [f["id"] for f in frames(transport)] == [1, 2]


def test_invalid_json_answers_parse_error_and_link_stays_up(link: Any) -> None:
    protocol, transport, _ = link
    protocol.dataReceived(b"{nope\n")
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "echo"})
    answers = frames(transport)
    assert answers[0] == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "parse error"},
    }
    assert answers[1]["result"] == {"ok": True}


def test_batches_are_invalid_requests(link: Any) -> None:
    protocol, transport, _ = link
    send(protocol, [{"jsonrpc": "2.0", "id": 1, "method": "echo"}])
    assert frames(transport)[0]["error"]["code"] == -32600


def test_over_long_line_is_answered_and_discarded(link: Any) -> None:
    """A line over 1 MiB: -32600, the rest of it discarded, the next line served."""
    protocol, transport, table = link
    protocol.dataReceived(b'{"x":"' + b"a" * (MAX_LINE + 10))
    protocol.dataReceived(b"a" * 1000 + b'"}\n')
    send(protocol, {"jsonrpc": "2.0", "id": 2, "method": "echo"})
    answers = frames(transport)
    assert [a.get("error", {}).get("code") for a in answers] == [-32600, None]
    assert answers[1]["id"] == 2
    assert len(table.calls) == 1


def test_over_long_line_arriving_whole_is_refused(link: Any) -> None:
    """A valid JSON line over 1 MiB delivered in one read is still -32600, not served."""
    protocol, transport, table = link
    pad = b"a" * MAX_LINE
    protocol.dataReceived(
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"p":"' + pad + b'"}}\n'
    )
    assert [a["error"]["code"] for a in frames(transport)] == [-32600]
    assert table.calls == []


def test_line_of_exactly_one_mib_is_accepted(link: Any) -> None:
    protocol, transport, _ = link
    head = b'{"jsonrpc":"2.0","id":3,"method":"echo","params":{"pad":"'
    tail = b'"}}'
    protocol.dataReceived(head + b"p" * (MAX_LINE - len(head) - len(tail)) + tail + b"\n")
    assert frames(transport)[0]["id"] == 3


def test_unknown_method_request_and_notification(link: Any) -> None:
    protocol, transport, _ = link
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "nope"})
    send(protocol, {"jsonrpc": "2.0", "method": "nope"})
    answers = frames(transport)
    assert len(answers) == 1 and answers[0]["error"]["code"] == -32601


def test_invalid_params_names_the_field(link: Any) -> None:
    protocol, transport, _ = link
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "refuse"})
    error = frames(transport)[0]["error"]
    assert error["code"] == -32602 and error["data"] == {"field": "port"}


def test_handler_bug_is_an_internal_error_not_a_crash(link: Any) -> None:
    protocol, transport, _ = link
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "crash"})
    send(protocol, {"jsonrpc": "2.0", "id": 2, "method": "echo"})
    answers = frames(transport)
    assert answers[0]["error"]["code"] == -32603 and answers[1]["result"] == {"ok": True}


def test_unaddressed_facade_method_resolves_to_no_facade(link: Any) -> None:
    """Never "the only facade": -32004 unaddressed, even with one facade enabled."""
    protocol, transport, table = link
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "discovery:nodes", "params": {}})
    send(protocol, {"jsonrpc": "2.0", "method": "discovery:nodes", "params": {}})
    answers = frames(transport)
    assert answers == [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32004,
                "message": "discovery:nodes resolves to no facade",
                "data": {"reason": "unaddressed"},
            },
        }
    ]
    assert table.calls == []


def test_facade_not_enabled(link: Any) -> None:
    protocol, transport, table = link
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "llamacpp:discovery:nodes"})
    assert frames(transport)[0]["error"]["data"] == {"reason": "facade-not-enabled"}
    send(protocol, {"jsonrpc": "2.0", "id": 2, "method": "ollama:discovery:nodes"})
    assert frames(transport)[0]["result"] == {"ok": True}
    assert table.calls[0][0] == Address("ollama", "discovery:nodes")


def test_answers_match_the_proxys_own_requests(link: Any) -> None:
    protocol, transport, _ = link
    results: list[object] = []
    protocol.call("ollama:discovery:subscribe", {}).addCallback(results.append)
    sent = frames(transport)[0]
    assert sent["method"] == "ollama:discovery:subscribe"
    send(protocol, {"jsonrpc": "2.0", "id": 99999, "result": "stray"})
    send(protocol, {"jsonrpc": "2.0", "id": sent["id"], "result": {}})
    send(protocol, {"jsonrpc": "2.0", "id": sent["id"], "result": "again"})
    assert results == [{}]
    assert frames(transport) == []


def test_error_answer_fails_the_call(link: Any) -> None:
    protocol, transport, _ = link
    failures: list[Any] = []
    protocol.call("x", {}).addErrback(failures.append)
    request_id = frames(transport)[0]["id"]
    send(protocol, {"jsonrpc": "2.0", "id": request_id, "error": {"code": 5, "message": "no"}})
    assert failures and failures[0].check(RpcError)


def test_half_close_keeps_output_open(link: Any) -> None:
    """stdin EOF: link_lost once, and the proxy can still write its final events."""
    protocol, transport, table = link
    protocol.readConnectionLost()
    protocol.readConnectionLost()
    assert table.lost == 1
    protocol.notify("workload:errored", {"x": 1})
    assert frames(transport)[0]["method"] == "workload:errored"
