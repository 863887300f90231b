"""The facade's own HTTP/1.1 connection: pipelining, framing, backpressure and bounds.

Most cases feed the real connection over an in-memory transport, with a handler that answers
when the test says; the last drives it over a real loopback socket. Refusals at the head and the
timeouts are in tests/wire/server/test_facade_head.py; arbitrary input in
tests/facades/test_http_fuzz.py.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet import reactor as _reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from nvpair.engines.table import LLAMACPP
from nvpair.facades.facade import Admitted, Facade, RequestHandler
from nvpair.wire.message import COMPLETE, Fields, ResponseHead
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.channel import HELD_BYTES, FacadeChannel
from nvpair.wire.server.head import FRAMING_TOO_LARGE, MAX_HEAD_BYTES
from nvpair.wire.server.reader import LINGER_BYTES, LINGER_QUIET, LINGER_SECONDS
from nvpair.wire.server.request import FacadeRequest
from nvpair.wire.server.site import FacadeSite
from nvpair.wire.server.types import Phase
from tests.httpwire import read_stream, talk

LOOPBACK = IPv4Address("TCP", "127.0.0.1", 40000)
reactor: Any = _reactor


class Held(RequestHandler):
    """Keeps every admitted request unanswered until the test answers it."""

    def __init__(self) -> None:
        self.requests: list[FacadeRequest] = []
        self.admitted: list[Admitted] = []

    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
        self.admitted.append(admitted)
        self.requests.append(request)
        return defer.succeed(None)


def respond(request: FacadeRequest, status: int = 200, *fields: tuple[bytes, bytes]) -> None:
    request.respond(ResponseHead(status, fields=Fields.of(fields)))


def answer(request: FacadeRequest, body: bytes = b"ok", length: bool = True) -> None:
    """Answer ``request`` whole, then let the reactor turn: a pipelined request behind it
    starts on the next turn."""
    channel = request.channel
    respond(request, 200, *[(b"Content-Length", b"%d" % len(body))] if length else [])
    request.data(body)
    request.end(COMPLETE)
    if isinstance(channel, FacadeChannel) and isinstance(channel.site.clock, Clock):
        channel.site.clock.advance(0)


class Conn:
    def __init__(self, max_body: int = 1 << 20, budget: BodyBudget | None = None) -> None:
        self.clock = Clock()
        self.handler = Held()
        site = FacadeSite(Facade(LLAMACPP, self.handler), max_body, clock=self.clock, bodies=budget)
        protocol = site.buildProtocol(LOOPBACK)
        self.protocol: FacadeChannel = protocol
        self.transport = StringTransport(peerAddress=LOOPBACK)
        protocol.makeConnection(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def closed(self) -> bool:
        return bool(self.transport.disconnecting)


def get(path: str = "/props", extra: str = "", version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: localhost\r\n{extra}\r\n".encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def test_the_next_pipelined_request_starts_on_a_fresh_reactor_turn() -> None:
    """Not on the stack of the answer before it (an engine's read, the relay's end), as
    uvicorn's next pipelined request."""
    conn = Conn()
    conn.send(get("/a") + get("/b"))
    first = conn.handler.requests[0]
    respond(first, 200, (b"Content-Length", b"1"))
    first.data(b"A")
    first.end(COMPLETE)
    assert [a.path for a in conn.handler.admitted] == ["/a"]
    conn.clock.advance(0)
    assert [a.path for a in conn.handler.admitted] == ["/a", "/b"]


def test_a_pipelined_request_whose_connection_went_before_its_turn_is_not_served() -> None:
    conn = Conn()
    conn.send(get("/a") + get("/b"))
    answer_now = conn.handler.requests[0]
    respond(answer_now, 200, (b"Content-Length", b"1"))
    answer_now.data(b"A")
    answer_now.end(COMPLETE)
    conn.protocol.connectionLost(Failure(ConnectionDone()))
    conn.clock.advance(0)
    assert [a.path for a in conn.handler.admitted] == ["/a"]


def test_pipelined_requests_wait_their_turn_while_reading_goes_on_up_to_a_bound() -> None:
    conn = Conn()
    conn.send(get("/a") + get("/b") + get("/c"))
    # Only the first is handed on; the rest are parsed and wait, and the socket is still read
    # (a client that leaves is seen) until more than HELD_BYTES have come in.
    assert [a.path for a in conn.handler.admitted] == ["/a"]
    assert conn.transport.producerState == "producing"
    conn.send(post("/d", b"p" * HELD_BYTES))
    assert conn.transport.producerState == "paused"
    answer(conn.handler.requests[0], b"A")
    assert [a.path for a in conn.handler.admitted] == ["/a", "/b"]
    answer(conn.handler.requests[1], b"B")
    answer(conn.handler.requests[2], b"C")
    # Only /d is left: what was held is all parsed, and reading goes on.
    assert conn.transport.producerState == "producing"
    answer(conn.handler.requests[3], b"D")
    responses = read_stream(conn.transport.value(), [b"GET"] * 3 + [b"POST"], closed=False)
    assert [r.body for r in responses] == [b"A", b"B", b"C", b"D"]
    assert not conn.closed()


def test_a_pipelined_request_refused_at_its_head_is_answered_after_the_one_before() -> None:
    conn = Conn(max_body=10)
    conn.send(get("/a") + post("/completion", b"x" * 11))
    assert conn.transport.value() == b"" and not conn.closed()
    answer(conn.handler.requests[0], b"A")
    responses = read_stream(conn.transport.value(), [b"GET", b"POST"], closed=True)
    assert [r.status for r in responses] == [200, 413]
    assert responses[1].values(b"x-nvpair-error") == [b"body-too-large"]
    assert conn.closed() and len(conn.handler.admitted) == 1


def test_garbage_after_a_request_in_flight_is_400_once_it_is_answered() -> None:
    conn = Conn()
    conn.send(get("/a") + b"GET /b HTTP/1.1\r\nno colon here\r\n\r\n")
    answer(conn.handler.requests[0], b"A")
    responses = read_stream(conn.transport.value(), [b"GET", None], closed=True)
    assert [r.status for r in responses] == [200, 400] and conn.closed()


def test_expect_100_continue_gets_the_interim_answer_before_the_body() -> None:
    conn = Conn()
    conn.send(
        b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert conn.transport.value() == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.send(b"{}")
    assert conn.handler.admitted[0].body == b"{}"


def test_http_1_0_gets_one_answer_delimited_by_the_close() -> None:
    conn = Conn()
    conn.send(get("/a", version="1.0"))
    answer(conn.handler.requests[0], b"whole body", length=False)
    data = conn.transport.value()
    assert data.startswith(b"HTTP/1.0 200 OK\r\n") and b"chunked" not in data.lower()
    assert data.endswith(b"\r\n\r\nwhole body") and conn.closed()


def test_connection_close_is_honoured_and_said() -> None:
    conn = Conn()
    conn.send(get("/a", extra="Connection: close\r\n") + get("/never"))
    answer(conn.handler.requests[0])
    (response,) = read_stream(conn.transport.value(), [b"GET"], closed=True)
    assert response.values(b"connection") == [b"close"] and conn.closed()
    assert len(conn.handler.admitted) == 1


def test_an_answer_without_a_length_is_chunked_and_dated() -> None:
    conn = Conn()
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    respond(request)
    request.data(b"one")
    request.data(b"")
    request.data(b"two")
    request.end(COMPLETE)
    (response,) = read_stream(conn.transport.value(), [b"GET"], closed=False)
    assert response.values(b"transfer-encoding") == [b"chunked"] and response.body == b"onetwo"
    assert len(response.values(b"date")) == 1 and response.values(b"server") == []


def test_an_engines_date_is_kept_not_doubled() -> None:
    conn = Conn()
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    respond(request, 200, (b"Date", b"Sun, 06 Nov 1994 08:49:37 GMT"), (b"Content-Length", b"2"))
    request.data(b"ok")
    request.end(COMPLETE)
    (response,) = read_stream(conn.transport.value(), [b"GET"], closed=False)
    assert response.values(b"date") == [b"Sun, 06 Nov 1994 08:49:37 GMT"]


def test_head_and_204_answers_carry_no_body_whatever_is_written() -> None:
    conn = Conn()
    conn.send(b"HEAD /props HTTP/1.1\r\nHost: x\r\n\r\n" + get("/nothing"))
    head = conn.handler.requests[0]
    respond(head, 200, (b"Content-Length", b"20"))
    head.data(b"twenty bytes of body")
    head.end(COMPLETE)
    conn.clock.advance(0)
    nothing = conn.handler.requests[1]
    respond(nothing, 204)
    nothing.data(b"ignored")
    nothing.end(COMPLETE)
    data = conn.transport.value()
    responses = read_stream(data, [b"HEAD", b"GET"], closed=False)
    assert responses[0].values(b"content-length") == [b"20"] and responses[0].body == b""
    assert responses[1].status == 204 and responses[1].values(b"transfer-encoding") == []
    assert b"twenty" not in data and b"ignored" not in data


class Followed:
    """A flow the answer follows: what it was told."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def stop(self, abort: bool = False) -> None:
        self.calls.append("stop")


def test_a_full_client_socket_pauses_the_answers_flow_and_resumes_it() -> None:
    conn = Conn()
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    flow = Followed()
    request.follow(flow)
    conn.protocol.pauseProducing()  # what the transport does when its buffer is full
    conn.protocol.resumeProducing()
    assert flow.calls == ["pause", "resume"]
    # Followed while the socket is full: paused at once.
    conn.protocol.pauseProducing()
    late = Followed()
    request.follow(None)
    request.follow(late)
    assert late.calls == ["pause"]
    conn.protocol.resumeProducing()  # followed no more: only the late one is told
    assert late.calls == ["pause", "resume"] and flow.calls == ["pause", "resume", "pause"]


def test_a_client_that_leaves_stops_the_flow_and_is_told_of() -> None:
    conn = Conn()
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    flow = Followed()
    request.follow(flow)
    errors: list[Failure] = []
    request.on_lost(errors.append)
    conn.protocol.connectionLost(Failure(ConnectionError("reset")))
    assert flow.calls == ["stop"] and len(errors) == 1
    assert not request.connected
    respond(request)
    request.data(b"late")  # a write after the client left is dropped, never raised
    request.on_lost(errors.append)
    assert len(errors) == 2
    gone = Followed()
    request.follow(gone)  # nobody is left to read it
    assert gone.calls == ["stop"]


def test_on_lost_is_told_once_of_a_client_that_leaves_and_never_of_an_answer_finished() -> None:
    conn = Conn()
    conn.send(get("/a") + get("/b"))
    first = conn.handler.requests[0]
    told: list[Failure] = []
    first.on_lost(told.append)
    answer(first)
    conn.protocol.connectionLost(Failure(ConnectionError("reset")))
    assert told == []  # its answer was finished before the client left
    second = conn.handler.requests[1]
    second.on_lost(told.append)
    assert len(told) == 1 and told[0].check(ConnectionError)
    # Asked after the client left: told at once, and only once.
    third: list[Failure] = []
    leaving = Conn()
    leaving.send(get("/c"))
    request = leaving.handler.requests[0]
    request.on_lost(third.append)
    leaving.protocol.connectionLost(Failure(ConnectionError("reset")))
    request.on_lost(third.append)
    assert len(third) == 2 and all(f.check(ConnectionError) for f in third)


def test_a_head_over_16_kib_is_400_whether_in_many_headers_or_one_unfinished_line() -> None:
    many = Conn()
    headers = "".join(f"X-H{i}: {'v' * 100}\r\n" for i in range(MAX_HEAD_BYTES // 100))
    many.send(get("/a", extra=headers))
    assert many.transport.value().startswith(b"HTTP/1.1 400") and many.closed()
    trickled = Conn()
    trickled.send(b"GET /a HTTP/1.1\r\nX-Long: ")
    for _ in range(MAX_HEAD_BYTES // 1000 + 1):
        trickled.send(b"v" * 1000)
    assert trickled.transport.value().startswith(b"HTTP/1.1 400") and trickled.closed()
    assert many.handler.admitted == trickled.handler.admitted == []


def test_a_version_other_than_1_x_is_400() -> None:
    conn = Conn()
    conn.send(get("/a", version="2.0"))
    assert conn.transport.value().startswith(b"HTTP/1.1 400") and conn.closed()


def test_an_upgrade_offer_is_served_as_http_1_1_body_included_and_the_connection_goes_on() -> None:
    """What curl --http2 sends on http://: the offer is ignored, as nginx ignores it."""
    conn = Conn()
    offer = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQ\r\n"
    conn.send(post("/completion", b'{"prompt":"hi"}', extra=offer) + get("/after"))
    assert [a.body for a in conn.handler.admitted] == [b'{"prompt":"hi"}']
    answer(conn.handler.requests[0])
    answer(conn.handler.requests[1])
    responses = read_stream(conn.transport.value(), [b"POST", b"GET"], closed=False)
    assert [r.status for r in responses] == [200, 200] and not conn.closed()
    assert [a.path for a in conn.handler.admitted] == ["/completion", "/after"]


def test_an_upgrade_offer_with_a_chunked_body_split_anywhere_is_read_whole() -> None:
    raw = (
        b"POST /completion HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n3\r\n":1\r\n1\r\n}\r\n0\r\n\r\n'
    ) + get("/after")
    for cut in range(1, len(raw)):
        conn = Conn()
        conn.send(raw[:cut])
        conn.send(raw[cut:])
        assert [a.body for a in conn.handler.admitted] == [b'{"a":1}'], cut
        answer(conn.handler.requests[0])
        assert [a.path for a in conn.handler.admitted] == ["/completion", "/after"], cut


class Echo(RequestHandler):
    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
        answer(request, admitted.path.encode() + b":" + admitted.body)
        return defer.succeed(None)


@pytest_twisted.ensureDeferred
async def test_pipelined_requests_over_a_real_socket_are_answered_in_order() -> None:
    site = FacadeSite(Facade(LLAMACPP, Echo()), 1 << 20)
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        data = await talk(
            reactor,
            port.getHost().port,
            post("/tokenize", b"{}")
            + post("/detokenize", b"[1]")
            + get("/health", extra="Connection: close\r\n"),
        )
    finally:
        await port.stopListening()
    responses = read_stream(data, [b"POST", b"POST", b"GET"], closed=True)
    assert [r.body for r in responses] == [b"/tokenize:{}", b"/detokenize:[1]", b"/health:"]


def test_every_attribute_of_a_connection_and_its_request_is_a_slot() -> None:
    """Thousands are held at once (docs/performance.md#held-streams): an attribute set outside
    ``__slots__`` brings back the per-instance dictionary."""
    conn = Conn()
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    answer(request, b"A")
    assert vars(conn.protocol) == {}
    assert not hasattr(request, "__dict__")


def test_a_chunked_body_costs_memory_in_proportion_to_its_bytes_not_its_chunks() -> None:
    """Finding 3: a 15 MiB body in 2-byte chunks raised RSS by 437 MiB, an object per chunk."""
    size = 1 << 20
    conn = Conn(max_body=2 * size)
    conn.send(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    wire = b"1\r\nx\r\n" * size + b"0\r\n\r\n"
    reads = [wire[at : at + 65536] for at in range(0, len(wire), 65536)]
    tracemalloc.start()
    try:
        for data in reads:
            conn.send(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (admitted,) = conn.handler.admitted
    assert admitted.body == b"x" * size
    # One buffer, grown in place and handed on as the body, never an object per chunk; twice
    # only while admission decodes it to read it (docs/robustness.md#what-a-request-body-costs).
    assert peak < 2.2 * size


def test_a_large_body_is_parsed_from_its_text_and_handed_on_as_its_bytes() -> None:
    """Issue 29 item 5: bytes, text and document at once were three times the body."""
    prompt = 'caf\u00e9 "x"\n' + "a" * (8 << 20)
    body = b'{"model":"q", "prompt":%s}' % json.dumps(prompt).encode()
    conn = Conn(max_body=16 << 20)
    conn.send(post("/completion", body)[: -len(body)])
    tracemalloc.start()
    try:
        for at in range(0, len(body), 65536):
            conn.send(body[at : at + 65536])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (admitted,) = conn.handler.admitted
    assert admitted.body == body and admitted.model == "q"
    # The text, and the prompt being decoded from it: past its first escape the decoder grows
    # its buffer by a quarter at a time.
    assert peak < 2.3 * len(body)


def test_a_large_body_that_is_no_utf_8_is_read_as_its_bytes() -> None:
    """It is no JSON, and its bytes are what it is: 400 ``bad-json``, nothing decoded."""
    body = b'{"model":"q","prompt":"\xff' + b"a" * (2 << 20) + b'"}'
    conn = Conn(max_body=4 << 20)
    conn.send(post("/completion", body))
    assert conn.transport.value().startswith(b"HTTP/1.1 400 ")
    assert b"bad-json" in conn.transport.value()


# -- the bodies held at once (docs/robustness.md#what-a-request-body-costs) -----------------------


def chunked_head(path: str = "/completion") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_declared_length_there_is_no_room_for_is_503_overloaded_at_the_head() -> None:
    """Nothing of it is kept; the answer says when to come back, and the body is read to its
    end before the close (the lingering close of every refusal at the head)."""
    budget = BodyBudget(1000)
    held = Conn(budget=budget)
    held.send(post("/completion", b'{"p":"' + b"x" * 592 + b'"}'))
    assert budget.held == 600 and len(held.handler.admitted) == 1
    conn = Conn(budget=budget)
    conn.send(post("/completion", b"x" * 401)[:-401])
    (response,) = read_stream(conn.transport.value(), [b"POST"], closed=False)
    assert (response.status, response.value(b"x-nvpair-error")) == (503, b"overloaded")
    assert response.value(b"retry-after") == b"5"
    assert response.value(b"connection") == b"close"
    assert budget.held == 600 and not conn.closed()
    conn.send(b"x" * 401)
    assert conn.closed() and conn.handler.admitted == []
    # What fits is let in.
    fits = Conn(budget=budget)
    fits.send(post("/completion", b'{"p":"' + b"x" * 392 + b'"}'))
    assert budget.held == 1000 and len(fits.handler.admitted) == 1
    answer(held.handler.requests[0])
    answer(fits.handler.requests[0])
    assert budget.held == 0


def test_a_chunked_body_is_503_overloaded_the_moment_it_crosses_then_closed_on() -> None:
    budget = BodyBudget(1000)
    conn = Conn(budget=budget)
    conn.send(chunked_head() + chunk(b"x" * 600))
    assert budget.held == 600 and conn.transport.value() == b""
    conn.send(chunk(b"x" * 400))
    assert budget.held == 1000 and conn.transport.value() == b""
    conn.send(chunk(b"x"))
    (response,) = read_stream(conn.transport.value(), [b"POST"], closed=False)
    assert (response.status, response.value(b"x-nvpair-error")) == (503, b"overloaded")
    assert response.value(b"retry-after") == b"5"
    assert budget.held == 0
    conn.send(chunk(b"x" * 5000) + b"0\r\n\r\n")
    assert conn.closed() and conn.handler.admitted == [] and budget.held == 0


def test_what_a_request_reserved_is_given_back_however_it_ends() -> None:
    """Answered, refused on its way in (over the cap, no JSON), pipelined behind another, or
    its upload abandoned half way, by a declared length or chunked: nothing is left held."""
    budget = BodyBudget(1 << 20)
    served = Conn(budget=budget)
    served.send(post("/completion", b'{"a":1}') + post("/completion", b'{"b":2}'))
    over = Conn(max_body=100, budget=budget)
    over.send(chunked_head() + chunk(b"x" * 60) + chunk(b"x" * 60))
    bad = Conn(budget=budget)
    bad.send(post("/completion", b"[1, 2"))
    abandoned = [Conn(budget=budget) for _ in range(4)]
    abandoned[0].send(post("/completion", b"x" * 5000)[:-4000])
    abandoned[1].send(chunked_head() + chunk(b"x" * 3000))
    abandoned[2].send(get("/a") + post("/completion", b"x" * 7000)[:-10])
    abandoned[3].send(post("/completion", b"x" * 9000)[:-9000])
    assert budget.held == 7 + 7 + 5000 + 3000 + 7000 + 9000
    for request in list(served.handler.requests):
        answer(request)
    answer(served.handler.requests[1])
    assert budget.held == 5000 + 3000 + 7000 + 9000
    for conn in abandoned:
        conn.protocol.connectionLost(Failure(ConnectionDone()))
    assert budget.held == 0
    assert [r.status for r in read_stream(bad.transport.value(), [b"POST"], closed=False)] == [400]


def test_the_refused_body_is_dropped_for_at_most_the_lingering_seconds() -> None:
    """nginx's lingering_time: a body still coming after 30 s is not waited for."""
    conn = Conn(max_body=10)
    conn.send(post("/completion", b"x" * 10_000)[:-9_000])
    assert conn.transport.value().startswith(b"HTTP/1.1 413 ") and not conn.closed()
    for _ in range(int(LINGER_SECONDS / (LINGER_QUIET - 1))):
        conn.clock.advance(LINGER_QUIET - 1)
        assert not conn.closed()
        conn.send(b"x")
    conn.clock.advance(LINGER_SECONDS % (LINGER_QUIET - 1))
    assert conn.closed()


def test_the_lingering_ends_once_the_client_sends_nothing_for_a_while() -> None:
    """nginx's lingering_timeout: a client that stopped sending (its head declared a body it
    never sends) is not waited for the whole lingering time."""
    conn = Conn(max_body=10)
    conn.send(post("/completion", b"x" * 1000)[:-900])
    conn.clock.advance(LINGER_QUIET - 1)
    conn.send(b"x" * 10)
    conn.clock.advance(LINGER_QUIET - 0.1)
    assert not conn.closed()
    conn.clock.advance(0.1)
    assert conn.closed()


def test_the_refused_body_is_dropped_for_at_most_the_lingering_bytes() -> None:
    """128 MiB: a body at the cap is read to its end, one far past it is not."""
    conn = Conn(max_body=10)
    conn.send(post("/completion", b"x" * (LINGER_BYTES + 1000))[: -(LINGER_BYTES + 1000)])
    piece = b"x" * (1 << 20)
    for _ in range(LINGER_BYTES // len(piece)):
        conn.send(piece)
    assert not conn.closed()
    conn.send(b"x")
    assert conn.closed() and conn.handler.admitted == []


def test_a_refused_body_is_read_to_its_declared_end_and_then_closed_on() -> None:
    conn = Conn(max_body=10)
    conn.send(post("/completion", b"x" * 100_000)[:-90_000])
    conn.send(b"x" * 89_999)
    assert not conn.closed()
    conn.send(b"x")
    assert conn.closed()
    assert read_stream(conn.transport.value(), [b"POST"], closed=True)[0].status == 413


def test_trailer_fields_trickled_past_16_kib_are_400_naming_them() -> None:
    """llhttp holds a partial trailer field itself, across reads: the bytes fed are bounded."""
    conn = Conn()
    conn.send(
        b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nx\r\n0\r\nX-Long: "
    )
    for _ in range(MAX_HEAD_BYTES // 1000 + 1):
        conn.send(b"v" * 1000)
    data = conn.transport.value()
    assert data.startswith(b"HTTP/1.1 400 ") and conn.closed()
    body = data.partition(b"\r\n\r\n")[2]
    assert json.loads(body)["error"]["message"] == FRAMING_TOO_LARGE.message
    assert conn.handler.admitted == []


def test_a_connection_is_in_one_named_phase_at_a_time() -> None:
    conn = Conn(max_body=10)
    phases = [conn.protocol.phase]
    for data in [
        b"GET /a HT",
        b"TP/1.1\r\nHost: x\r\n\r\n",
        # The last request the connection will carry: once it is parsed, nothing new will be.
        get("/b", extra="Connection: close\r\n"),
    ]:
        conn.send(data)
        phases.append(conn.protocol.phase)
    for request in conn.handler.requests:
        answer(request)
        phases.append(conn.protocol.phase)
    conn.protocol.connectionLost(Failure(ConnectionError("closed")))
    phases.append(conn.protocol.phase)
    assert phases == [
        Phase.IDLE,
        Phase.READING,
        Phase.ANSWERING,
        Phase.FINISHING,
        Phase.FINISHING,
        Phase.CLOSING,
        Phase.CLOSED,
    ]
    refused = Conn(max_body=10)
    refused.send(post("/completion", b"x" * 11)[:-11])
    lingering = refused.protocol.phase
    refused.send(b"x" * 11)
    assert (lingering, refused.protocol.phase) == (Phase.LINGERING, Phase.CLOSING)


def test_a_streaming_answer_keeps_no_head_once_its_own_is_written() -> None:
    """docs/performance.md#held-streams: the answer's head is on the wire, and the request
    holds neither it nor its own head's fields while the stream goes on; a field added to the
    head later reaches nothing."""
    conn = Conn()
    conn.send(get("/a", extra="X-Client: 1\r\n"))
    request = conn.handler.requests[0]
    assert request.head.fields.first(b"X-Client") == b"1"
    head = ResponseHead(200, fields=Fields.of([(b"Content-Type", b"text/event-stream")]))
    request.respond(head)
    request.data(b"data: 1\n\n")
    assert request.head.fields == {} and request.status == 200 and request.started
    with pytest.raises(RuntimeError):
        request.respond(head)
    assert all(getattr(request, name, None) is not head for name in request.__slots__)
    head.fields.put(b"X-Late", b"1")
    request.data(b"data: 2\n\n")
    request.end(COMPLETE)
    (response,) = read_stream(conn.transport.value(), [b"GET"], closed=False)
    assert response.values(b"content-type") == [b"text/event-stream"]
    assert response.values(b"x-late") == [] and response.body == b"data: 1\n\ndata: 2\n\n"


def test_no_idle_timer_is_held_while_a_request_is_answered() -> None:
    """docs/performance.md#held-streams: a stream in flight holds no idle deadline (the idle
    bound never cuts one); its answer arms the bound again, from then. Every connection's idle
    bound is on the listener's one timer (docs/performance.md#timers)."""
    conn = Conn()
    idle = conn.protocol.site.idle
    assert idle is not None and len(idle) == 1  # the connection waits for its first request
    conn.send(get("/a"))
    request = conn.handler.requests[0]
    respond(request)
    request.data(b"data: 1\n\n")
    assert len(idle) == 0
    conn.clock.advance(1000.0)
    assert not conn.closed()
    request.data(b"data: 2\n\n")
    request.end(COMPLETE)
    assert len(idle) == 1
    (armed,) = conn.clock.getDelayedCalls()
    assert armed.getTime() == 1000.0 + 300.0
    conn.clock.advance(299.0)
    assert not conn.closed()
    conn.clock.advance(1.0)
    assert conn.closed()


def test_a_request_answered_holds_no_parser_and_split_pipelined_bytes_still_parse() -> None:
    """docs/performance.md#held-streams: while a kept-alive request is answered with nothing
    half-read, the connection holds no parser; the next byte makes one, losing nothing."""
    conn = Conn()
    conn.send(get("/a"))
    first = conn.handler.requests[0]
    respond(first)
    first.data(b"data: 1\n\n")
    assert not has_parser(conn)
    second = post("/completion", b'{"n": 2}')
    conn.send(second[:7])
    assert has_parser(conn)
    conn.send(second[7:30])
    conn.send(second[30:])
    # Parsed and queued: nothing half-read is left, so the parser goes again.
    assert not has_parser(conn)
    first.end(COMPLETE)
    conn.clock.advance(0)
    assert [a.path for a in conn.handler.admitted] == ["/a", "/completion"]
    assert conn.handler.admitted[1].body == b'{"n": 2}'
    answer(conn.handler.requests[1], b"B")
    responses = read_stream(conn.transport.value(), [b"GET", b"POST"], closed=False)
    assert [r.body for r in responses] == [b"data: 1\n\n", b"B"]


def test_a_lost_connection_lets_go_of_its_parser() -> None:
    """The parser's callbacks are bound to the connection: a cycle the lost connection must
    not keep for the collector, also when it went mid-head."""
    conn = Conn()
    conn.send(b"GET /a HTTP/1.1\r\nHo")
    assert has_parser(conn)
    conn.protocol.connectionLost(Failure(ConnectionDone()))
    assert not has_parser(conn)


def has_parser(conn: Conn) -> bool:
    return conn.protocol._parser is not None


def test_the_last_request_answered_holds_no_parser() -> None:
    """Nothing after a request that closes the connection is parsed: it keeps no parser."""
    conn = Conn()
    conn.send(get("/a", extra="Connection: close\r\n") + b"GET /b HTTP/1.1\r\n")
    assert not has_parser(conn)
    answer(conn.handler.requests[0], b"A")
    responses = read_stream(conn.transport.value(), [b"GET"], closed=True)
    assert [r.body for r in responses] == [b"A"] and len(conn.handler.admitted) == 1


@settings(deadline=None, max_examples=60)
@given(
    st.integers(500, 6000),
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 3000), st.integers(0, 4000), st.booleans()),
        max_size=6,
    ),
)
def test_no_way_an_upload_ends_leaves_any_of_the_budget_held(
    limit: int, uploads: list[tuple[bool, int, int, bool]]
) -> None:
    """Uploads on connections of their own, declared or chunked, over the bound or the cap or
    not, cut anywhere or whole, answered or not: while they go on the bound holds, and once
    every connection has gone nothing is held."""
    budget = BodyBudget(limit)
    conns: list[tuple[Conn, bool]] = []
    for chunked, size, cut, answered in uploads:
        conn = Conn(max_body=2500, budget=budget)
        body = b'{"p":"' + b"x" * size + b'"}'
        wire = chunked_head() + chunk(body) + b"0\r\n\r\n" if chunked else post("/completion", body)
        conn.send(wire[: len(wire) - cut] if cut < len(wire) else wire)
        assert 0 <= budget.held <= limit
        conns.append((conn, answered))
    for conn, answered in conns:
        if answered:
            for request in conn.handler.requests:
                if not request.finished:
                    answer(request)
        conn.protocol.connectionLost(Failure(ConnectionDone()))
    assert budget.held == 0


def test_a_large_body_naming_its_model_twice_is_refused_from_its_text() -> None:
    """Admission reads a large body from its text: a member named twice (one spelled with an
    escape) is found there as in the bytes, by its top level read where it lies."""
    body = b'{"model":"q","prompt":"%s","\\u006dodel":"secret"}' % (b"a" * (2 << 20))
    conn = Conn(max_body=4 << 20)
    wire = post("/completion", body)
    tracemalloc.start()
    try:
        conn.send(wire)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (response,) = read_stream(conn.transport.value(), [b"POST"], closed=False)
    assert (response.status, response.value(b"x-nvpair-error")) == (400, b"bad-json")
    assert peak < 2.3 * len(body)
