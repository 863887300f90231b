"""The broker link's framing, envelope and addressing (docs/broker-protocol.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import pytest
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, Logger, LogLevel
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.broker.addressing import Address, Handler, MethodTable, resolve_address
from nvpair.broker.envelope import NO_CODE, RpcError, invalid_params
from nvpair.broker.framing import MAX_LINE, parse_line
from nvpair.broker.link import BrokerProtocol


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
        if address.method == "nan":
            return lambda address, params: {"load": float("nan")}
        if address.method == "opaque":
            return lambda address, params: object()
        if address.method == "table-bug":
            # A bug in the method table itself, outside any handler's Deferred.
            raise KeyError(address.method)
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


@implementer(ILogObserver)
class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def capture_log(protocol: BrokerProtocol) -> list[dict[str, Any]]:
    """The protocol's log events, instead of the global publisher's."""
    recorder = Recorder()
    protocol.log = Logger(observer=recorder)
    return recorder.events


ECHO = {"jsonrpc": "2.0", "id": "after", "method": "echo"}


def still_serves(protocol: BrokerProtocol, transport: StringTransport) -> None:
    """The link answers a well-formed request after whatever came before."""
    transport.clear()
    send(protocol, ECHO)
    assert frames(transport) == [{"jsonrpc": "2.0", "id": "after", "result": {"ok": True}}]


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
    """errors:report is not engine "errors" (docs/broker-protocol.md#addressing)."""
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


# -- hardening: nothing one line does reaches the transport ---------------------------------

PARSE_ERROR_FRAME = {
    "jsonrpc": "2.0",
    "id": None,
    "error": {"code": -32700, "message": "parse error"},
}


def test_line_nested_past_the_recursion_limit_is_a_parse_error(link: Any) -> None:
    """100,000 "[" used to raise RecursionError out of dataReceived, which drops stdin."""
    protocol, transport, _ = link
    protocol.dataReceived(b"[" * 100_000 + b"\n")
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":' + b"{" * 50_000)
    protocol.dataReceived(b"\n")
    assert frames(transport) == [PARSE_ERROR_FRAME, PARSE_ERROR_FRAME]
    still_serves(protocol, transport)


@pytest.mark.parametrize(
    "literal", [b"NaN", b"Infinity", b"-Infinity", b"[NaN]", b'{"a":Infinity}']
)
def test_nan_and_infinity_literals_are_parse_errors(link: Any, literal: bytes) -> None:
    """JSON has no such literals, although Python's json.loads accepts them."""
    protocol, transport, table = link
    line = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":' + literal + b"}}\n"
    protocol.dataReceived(line)
    assert frames(transport) == [PARSE_ERROR_FRAME]
    assert table.calls == []


def test_integer_past_the_digit_limit_is_a_parse_error(link: Any) -> None:
    """json.loads raises ValueError beyond Python's int digit limit: -32700, not a crash."""
    protocol, transport, table = link
    line = b'{"jsonrpc":"2.0","id":' + b"7" * 5000 + b',"method":"echo"}\n'
    protocol.dataReceived(line)
    assert frames(transport) == [PARSE_ERROR_FRAME]
    assert table.calls == []
    still_serves(protocol, transport)


def test_large_number_that_parses_is_served(link: Any) -> None:
    """1e400 is valid JSON (it reads as inf): refusing it is each field's business."""
    protocol, transport, table = link
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"x":1e400}}\n')
    assert frames(transport)[0]["result"] == {"ok": True}
    assert table.calls[0][1] == {"x": float("inf")}


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"nope"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\\udc00"}',
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"\\udbff":1}}',
        b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"a":["x\\ud83d"]}}',
    ],
)
def test_lone_surrogate_escape_is_a_parse_error(link: Any, line: bytes) -> None:
    """A lone surrogate has no UTF-8 form: echoing the id or method used to raise."""
    protocol, transport, table = link
    protocol.dataReceived(line + b"\n")
    assert frames(transport) == [PARSE_ERROR_FRAME]
    assert table.calls == []
    still_serves(protocol, transport)


def test_surrogate_pair_escape_is_a_character(link: Any) -> None:
    protocol, transport, _ = link
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":"\\ud83d\\ude00","method":"nope"}\n')
    raw = transport.value()
    assert json.loads(raw)["id"] == "\U0001f600"
    raw.decode("utf-8")


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xfe{}",
        b"\xed\xa0\x80",  # a surrogate encoded as if it were UTF-8
        json.dumps(ECHO).encode("utf-16"),
        json.dumps(ECHO).encode("utf-32"),
    ],
)
def test_only_utf8_is_text(link: Any, data: bytes) -> None:
    """json.loads of bytes would guess UTF-16/32 and serve them; the link is UTF-8
    (docs/broker-protocol.md#framing)."""
    protocol, transport, table = link
    assert b"\n" not in data
    protocol.dataReceived(data + b"\n")
    assert frames(transport) == [PARSE_ERROR_FRAME]
    assert table.calls == []


def test_nul_and_crlf(link: Any) -> None:
    """A NUL outside a string is not JSON; CRLF endings are whitespace after the object."""
    protocol, transport, _ = link
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":1,"method":"echo"}\x00\n')
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":2,"method":"echo","params":{"a":"\\u0000"}}\r\n')
    answers = frames(transport)
    assert answers[0] == PARSE_ERROR_FRAME
    assert answers[1] == {"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}


@pytest.mark.parametrize(
    "error",
    [
        {"code": "x", "message": "no"},
        {"code": [1], "message": "no"},
        {"code": {}, "message": "no"},
        {"code": True, "message": "no"},
        {"code": 1.5, "message": "no"},
        {"code": None},
        {"message": ["not", "text"]},
        "boom",
        [],
        None,
    ],
)
def test_error_answer_with_unusable_code_still_fails_the_call(link: Any, error: object) -> None:
    """int(error.code) used to raise out of dataReceived; the call must fail with RpcError."""
    protocol, transport, _ = link
    failures: list[Failure] = []
    protocol.call("x", {}).addErrback(failures.append)
    request_id = frames(transport)[0]["id"]
    send(protocol, {"jsonrpc": "2.0", "id": request_id, "error": error})
    assert len(failures) == 1 and failures[0].check(RpcError)
    assert isinstance(failures[0].value, RpcError) and failures[0].value.code == NO_CODE
    assert frames(transport) == []
    still_serves(protocol, transport)


@pytest.mark.parametrize("code", [b"1e400", b"-1e400", b"1" + b"0" * 400])
def test_error_answer_with_absurd_numeric_code_fails_the_call(link: Any, code: bytes) -> None:
    """1e400 used to raise OverflowError from int(inf); a 401-digit int is a usable int."""
    protocol, transport, _ = link
    failures: list[Failure] = []
    protocol.call("x", {}).addErrback(failures.append)
    request_id = frames(transport)[0]["id"]
    protocol.dataReceived(
        b'{"jsonrpc":"2.0","id":%d,"error":{"code":%s,"message":"m"}}\n' % (request_id, code)
    )
    assert len(failures) == 1 and failures[0].check(RpcError)
    still_serves(protocol, transport)


def test_error_answer_with_nan_code_is_a_parse_error(link: Any) -> None:
    """NaN is refused at parse time, so such an answer cannot settle the call; EOF still does."""
    protocol, transport, _ = link
    failures: list[Failure] = []
    protocol.call("x", {}).addErrback(failures.append)
    request_id = frames(transport)[0]["id"]
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":%d,"error":{"code":NaN}}\n' % request_id)
    assert frames(transport) == [PARSE_ERROR_FRAME] and failures == []
    protocol.readConnectionLost()
    assert len(failures) == 1 and failures[0].check(ConnectionError)


def test_answer_with_neither_result_nor_error_fails_the_call(link: Any) -> None:
    """Used to settle the call with result None."""
    protocol, transport, _ = link
    failures: list[Failure] = []
    protocol.call("x", {}).addErrback(failures.append)
    send(protocol, {"jsonrpc": "2.0", "id": frames(transport)[0]["id"]})
    assert len(failures) == 1 and failures[0].check(RpcError)


def test_answer_with_id_true_is_not_the_answer_to_request_1(link: Any) -> None:
    """True == 1 in Python: the pending call 1 used to be settled by id true."""
    protocol, transport, _ = link
    results: list[object] = []
    protocol.call("x", {}).addCallback(results.append)
    assert frames(transport)[0]["id"] == 1
    send(protocol, {"jsonrpc": "2.0", "id": True, "result": "bool"})
    send(protocol, {"jsonrpc": "2.0", "id": 1.0, "result": "float"})
    assert results == []
    send(protocol, {"jsonrpc": "2.0", "id": 1, "result": "int"})
    assert results == ["int"]


def test_answers_are_never_answered(link: Any) -> None:
    """A frame without a method is an answer; an error frame carrying its id would read to the
    broker as the answer to its own request with that id."""
    protocol, transport, _ = link
    send(protocol, {"jsonrpc": "1.0", "id": 5, "result": 1})
    send(protocol, {"id": 6})
    send(protocol, {"jsonrpc": "2.0", "id": 7, "error": {"code": 1, "message": "m"}})
    assert frames(transport) == []


def test_refused_request_with_null_id_is_answered(link: Any) -> None:
    """An id of null is still a request: the refusal used to be taken for a notification's."""
    protocol, transport, _ = link
    send(protocol, {"jsonrpc": "2.0", "id": None, "method": "refuse"})
    send(protocol, {"jsonrpc": "2.0", "id": None, "method": "crash"})
    assert [(a["id"], a["error"]["code"]) for a in frames(transport)] == [
        (None, -32602),
        (None, -32603),
    ]


@pytest.mark.parametrize("bad_id", [1.5, True, False, [1], {"a": 1}])
def test_request_id_of_the_wrong_type_is_invalid(link: Any, bad_id: object) -> None:
    protocol, transport, table = link
    send(protocol, {"jsonrpc": "2.0", "id": bad_id, "method": "echo"})
    assert [(a["id"], a["error"]["code"]) for a in frames(transport)] == [(None, -32600)]
    assert table.calls == []


def test_method_table_bug_is_contained_and_answered_internal_error(link: Any) -> None:
    """An exception outside any handler's Deferred used to escape dataReceived."""
    protocol, transport, _ = link
    events = capture_log(protocol)
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": "table-bug"})
    send(protocol, {"jsonrpc": "2.0", "method": "table-bug"})
    assert frames(transport) == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "internal error"}}
    ]
    failures = [e["log_failure"] for e in events if "log_failure" in e]
    assert len(failures) == 2 and all(f.check(KeyError) for f in failures)
    still_serves(protocol, transport)


@pytest.mark.parametrize("method", ["nan", "opaque"])
def test_result_with_no_json_form_is_an_internal_error(link: Any, method: str) -> None:
    """NaN used to go out as the non-JSON literal NaN; an opaque object left no answer."""
    protocol, transport, _ = link
    events = capture_log(protocol)
    send(protocol, {"jsonrpc": "2.0", "id": 1, "method": method})
    assert frames(transport) == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "internal error"}}
    ]
    assert any("log_failure" in e for e in events)


def test_notification_with_lone_surrogate_goes_out_escaped(link: Any) -> None:
    """Another module's notification must not raise out of the link (UnicodeEncodeError)."""
    protocol, transport, _ = link
    protocol.notify("ollama:errors:report", {"message": "bad \udcff name"})
    raw = transport.value()
    raw.decode("utf-8")
    assert json.loads(raw)["params"]["message"] == "bad \udcff name"


def test_call_with_params_of_no_json_form_fails_and_sends_nothing(link: Any) -> None:
    protocol, transport, _ = link
    capture_log(protocol)
    failures: list[Failure] = []
    protocol.call("x", {"load": float("inf")}).addErrback(failures.append)
    assert transport.value() == b""
    assert len(failures) == 1 and failures[0].check(ValueError)


def test_unterminated_line_at_eof_is_dropped_with_a_warning(link: Any) -> None:
    protocol, transport, table = link
    events = capture_log(protocol)
    protocol.dataReceived(b'{"jsonrpc":"2.0","id":1,"method":"echo"}')
    protocol.readConnectionLost()
    assert transport.value() == b"" and table.calls == [] and table.lost == 1
    warnings = [e for e in events if e["log_level"] == LogLevel.warn]
    assert len(warnings) == 1 and warnings[0]["size"] == 40


def test_a_read_full_of_short_lines_takes_linear_time(link: Any) -> None:
    """Slicing the rest of the buffer off per line made such a read quadratic: about 4 s for
    this one before, about 0.15 s now (a bound with room for a loaded machine either way)."""
    protocol, _, _ = link
    started = time.perf_counter()
    protocol.dataReceived(b" \n" * 400_000)
    assert time.perf_counter() - started < 2.0


def test_long_line_in_one_byte_reads_is_still_one_line(link: Any) -> None:
    protocol, transport, _ = link
    head = b'{"jsonrpc":"2.0","id":3,"method":"echo","params":{"pad":"'
    data = head + b"p" * 5000 + b'"}}\n'
    for index in range(len(data)):
        protocol.dataReceived(data[index : index + 1])
    assert frames(transport)[0]["id"] == 3


def test_parse_line_is_stricter_than_json_loads() -> None:
    assert parse_line(b'{"a":[1,"\\ud83d\\ude00"]}') == {"a": [1, "\U0001f600"]}
    for bad in (b"NaN", b"[" * 10_000, b"\xff", b'"\\udfff"', b"1" * 5000):
        with pytest.raises(ValueError):
            parse_line(bad)
