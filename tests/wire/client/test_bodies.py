# -*- test-case-name: tests.wire.client.test_bodies -*-
"""Bounded upstream body reading (:mod:`nvpair.wire.client.bodies`): every read ends, and one
that ends early (a bound, a cancel) closes the upstream connection.

Clock-driven unit tests on a scripted response, then real loopback exchanges against a
``twisted.web`` upstream that stalls, where the server itself must see the connection go.
The loopback helpers here are shared with the fan-out and fleet-poll tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.error import ConnectionLost
from twisted.internet.interfaces import IListeningPort, ITCPTransport
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from nvpair.wire.client.bodies import (
    BodyTimeout,
    BodyTooLarge,
    HeadersTimeout,
    Whole,
    discard_body,
    fetch,
    read_body,
)
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import (
    AT_CLOSE,
    COMPLETE,
    Answer,
    BodySink,
    End,
    Ended,
    Fields,
    NoAnswer,
    ResponseHead,
)

#: How a reset mid-body ends it.
LOST = Ended(End.CUT, ConnectionLost())

# -- a scripted answer ------------------------------------------------------------------------


class FakeConnection:
    """The upstream connection a body's source stops. ``on_stop`` runs inside ``stop``, as a
    synchronous close."""

    def __init__(self) -> None:
        self.stopped = 0
        self.on_stop: Callable[[], None] | None = None

    def stop(self) -> None:
        self.stopped += 1
        if self.on_stop is not None:
            on_stop, self.on_stop = self.on_stop, None
            on_stop()


class FakeBody:
    """An answer's body the test feeds (a :class:`~nvpair.wire.message.BodySource`);
    ``complete`` set: already ended when a sink connects."""

    def __init__(self, connection: FakeConnection, complete: bytes | None) -> None:
        self.connection = connection
        self.sink: BodySink | None = None
        self._complete = complete

    def connect(self, sink: BodySink) -> None:
        if self.sink is not None:
            raise RuntimeError("the body has a sink already")
        self.sink = sink
        if self._complete is not None:
            if self._complete:
                sink.data(self._complete)
            sink.end(COMPLETE)

    def pause(self) -> None:
        """Not used by the reader."""

    def resume(self) -> None:
        """Not used by the reader."""

    def stop(self, abort: bool = False) -> None:
        self.connection.stop()


class FakeResponse(Answer):
    """An answer whose body the test feeds; ``body`` set: already complete when it is read."""

    def __new__(cls, code: int = 200, body: bytes | None = None) -> FakeResponse:
        fields = Fields.of([(b"content-type", b"application/json")])
        return super().__new__(
            cls, ResponseHead(code, b"OK", fields), FakeBody(FakeConnection(), body)
        )

    @property
    def source(self) -> FakeBody:
        assert isinstance(self.body, FakeBody)
        return self.body

    @property
    def connection(self) -> FakeConnection:
        return self.source.connection

    def send(self, data: bytes) -> None:
        sink = self.source.sink
        assert sink is not None
        sink.data(data)

    def end(self, ended: Ended = COMPLETE) -> None:
        sink = self.source.sink
        assert sink is not None
        sink.end(ended)


def result_of(d: Deferred[Any]) -> Any:
    """The current result of ``d`` (a Failure when it failed); fails if ``d`` has not fired."""
    box: list[Any] = []
    d.addBoth(box.append)
    assert box, "the Deferred has not fired"
    return box[0]


def failure_of(d: Deferred[Any], kind: type[BaseException]) -> Failure:
    got = result_of(d)
    assert isinstance(got, Failure), f"expected a failure, got {got!r}"
    assert got.check(kind), got
    return got


# -- read_body --------------------------------------------------------------------------------


def test_whole_body_is_returned_and_no_timer_is_left() -> None:
    """A body that ends cleanly comes back whole; the time bound's timer is cancelled."""
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, 40.0, 100)
    response.send(b'{"models":')
    response.send(b"[]}")
    response.end()
    assert result_of(d) == b'{"models":[]}'
    assert clock.getDelayedCalls() == []
    assert response.connection.stopped == 0


def test_close_delimited_body_counts_as_complete() -> None:
    """A body delimited by the connection's close ends at the close: complete."""
    response = FakeResponse()
    d = read_body(response, Clock(), 40.0, 100)
    response.send(b"abc")
    response.end(AT_CLOSE)
    assert result_of(d) == b"abc"


def test_a_body_exactly_at_the_cap_is_accepted() -> None:
    response = FakeResponse()
    d = read_body(response, Clock(), 40.0, 6)
    response.send(b"abc")
    response.send(b"def")
    response.end()
    assert result_of(d) == b"abcdef"


def test_a_body_over_the_cap_fails_and_closes_the_connection() -> None:
    """One byte past the cap: BodyTooLarge at once, and the connection is stopped."""
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, 40.0, 6)
    response.send(b"abc")
    assert not d.called
    response.send(b"defg")
    failure_of(d, BodyTooLarge)
    assert response.connection.stopped == 1
    assert clock.getDelayedCalls() == []


def test_the_close_caused_by_giving_up_is_not_mistaken_for_the_end() -> None:
    """Stopping a close-delimited body ends it at the close, which reads as "complete"; the
    reader has already given up by then, so a truncated body never passes for a whole one,
    even when the close re-enters the reader synchronously."""
    response = FakeResponse()
    d = read_body(response, Clock(), 40.0, 4)
    response.connection.on_stop = lambda: response.end(AT_CLOSE)
    response.send(b"abc")
    response.send(b"de")
    failure_of(d, BodyTooLarge)
    assert response.connection.stopped == 1


def test_a_stalled_body_times_out_and_closes_the_connection() -> None:
    """Headers arrived, the body stalls: BodyTimeout when the bound passes, not before."""
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, 40.0, 100)
    response.send(b"{")
    clock.advance(39.9)
    assert not d.called
    assert response.connection.stopped == 0
    clock.advance(0.1)
    failure_of(d, BodyTimeout)
    assert response.connection.stopped == 1


def test_a_timeout_whose_close_reenters_still_fails() -> None:
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, 1.0, 100)
    response.connection.on_stop = lambda: response.end(AT_CLOSE)
    response.send(b"partial")
    clock.advance(1.0)
    failure_of(d, BodyTimeout)


def test_cancelling_closes_the_connection() -> None:
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, 40.0, 100)
    response.send(b"{")
    d.cancel()
    failure_of(d, CancelledError)
    assert response.connection.stopped == 1
    assert clock.getDelayedCalls() == []
    # What the close then delivers changes nothing.
    response.end(AT_CLOSE)


def test_a_transport_error_is_the_failure() -> None:
    """A reset mid-body fails the read with the transport's error (nothing to close)."""
    response = FakeResponse()
    d = read_body(response, Clock(), 40.0, 100)
    response.send(b"{")
    response.end(LOST)
    failure_of(d, ConnectionLost)
    assert response.connection.stopped == 0


def test_a_body_complete_before_delivery_is_read_at_once() -> None:
    clock = Clock()
    d = read_body(FakeResponse(body=b"done"), clock, 40.0, 100)
    assert result_of(d) == b"done"
    assert clock.getDelayedCalls() == []


def test_a_body_over_the_cap_before_delivery_still_fails() -> None:
    d = read_body(FakeResponse(body=b"0123456789"), Clock(), 40.0, 9)
    failure_of(d, BodyTooLarge)


def test_no_time_bound_when_none_or_infinite() -> None:
    """None or inf: no timer (an infinite delay would overflow the reactor's poll)."""
    for timeout in (None, float("inf")):
        clock, response = Clock(), FakeResponse()
        d = read_body(response, clock, timeout, 100)
        assert clock.getDelayedCalls() == []
        response.end()
        assert result_of(d) == b""


def test_a_nan_timeout_or_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError):
        read_body(FakeResponse(), Clock(), float("nan"), 100)
    with pytest.raises(ValueError):
        read_body(FakeResponse(), Clock(), 1.0, -1)


def test_a_negative_timeout_expires_at_once() -> None:
    clock, response = Clock(), FakeResponse()
    d = read_body(response, clock, -5.0, 100)
    clock.advance(0)
    failure_of(d, BodyTimeout)


def test_delivering_twice_fails_without_waiting() -> None:
    clock, response = Clock(), FakeResponse()
    read_body(response, clock, 40.0, 100)
    d = read_body(response, clock, 40.0, 100)
    failure_of(d, RuntimeError)
    # The refused reader's timer is gone; only the first reader's remains.
    assert len(clock.getDelayedCalls()) == 1


@given(
    chunks=st.lists(st.binary(min_size=0, max_size=40), max_size=20),
    cap=st.integers(min_value=0, max_value=400),
)
def test_the_cap_decides_exactly(chunks: list[bytes], cap: int) -> None:
    """Whatever the chunking: the body when it fits, BodyTooLarge (and a close) when not."""
    response = FakeResponse()
    d = read_body(response, Clock(), 40.0, cap)
    for chunk in chunks:
        if d.called:
            break
        response.send(chunk)
    if not d.called:
        response.end()
    whole = b"".join(chunks)
    if len(whole) <= cap:
        assert result_of(d) == whole
        assert response.connection.stopped == 0
    else:
        failure_of(d, BodyTooLarge)
        assert response.connection.stopped == 1


# -- discard_body -----------------------------------------------------------------------------


def test_discard_reads_to_the_end_without_closing() -> None:
    """A complete body is read and dropped; the connection is left to return to the pool."""
    response = FakeResponse()
    d = discard_body(response, Clock(), 5.0, 10)
    response.send(b"0123456789")
    response.end()
    assert result_of(d) is None
    assert response.connection.stopped == 0


@pytest.mark.parametrize("how", ["too-large", "timeout", "cancel", "reset"])
def test_discard_never_fails(how: str) -> None:
    """Past a bound or cancelled it closes the connection; on a reset there is nothing to
    close. Either way it fires with None: the caller does not wait on it."""
    clock, response = Clock(), FakeResponse()
    d = discard_body(response, clock, 5.0, 10)
    if how == "too-large":
        response.send(b"x" * 11)
    elif how == "timeout":
        clock.advance(5.0)
    elif how == "cancel":
        d.cancel()
    else:
        response.end(LOST)
    assert result_of(d) is None
    assert response.connection.stopped == (0 if how == "reset" else 1)
    assert clock.getDelayedCalls() == []


# -- fetch: headers and body under one bound ----------------------------------------------------


class Sent:
    """A request's Deferred as the upstream client gives it: cancelling fails it with an error
    that is not CancelledError (as a request cancelled after its connection went does)."""

    def __init__(self) -> None:
        self.cancels = 0
        self.deferred: Deferred[Answer] = Deferred(self._cancel)

    def _cancel(self, d: Deferred[Answer]) -> None:
        self.cancels += 1
        d.errback(Failure(NoAnswer(CancelledError())))


def test_fetch_bounds_headers_and_body_together() -> None:
    """Headers at 25 s of a 40 s bound leave the body 15 s, not a fresh 40."""
    clock, sent, response = Clock(), Sent(), FakeResponse()
    d = fetch(sent.deferred, clock, 40.0, 100)
    clock.advance(25)
    sent.deferred.callback(response)
    response.send(b"{")
    clock.advance(14.9)
    assert not d.called
    clock.advance(0.1)
    failure_of(d, BodyTimeout)
    assert response.connection.stopped == 1


def test_fetch_without_headers_cancels_the_request() -> None:
    clock, sent = Clock(), Sent()
    d = fetch(sent.deferred, clock, 40.0, 100)
    clock.advance(39.9)
    assert sent.cancels == 0
    clock.advance(0.1)
    assert sent.cancels == 1
    failure_of(d, HeadersTimeout)


def test_fetch_returns_the_head_and_its_body() -> None:
    clock, sent, response = Clock(), Sent(), FakeResponse(code=201)
    d = fetch(sent.deferred, clock, 40.0, 100)
    sent.deferred.callback(response)
    response.send(b"[]")
    response.end()
    whole = result_of(d)
    assert whole == Whole(response.head, b"[]") and whole.head.status == 201
    assert clock.getDelayedCalls() == []


def test_cancelling_fetch_while_awaiting_headers_cancels_the_request() -> None:
    clock, sent = Clock(), Sent()
    d = fetch(sent.deferred, clock, 40.0, 100)
    d.cancel()
    assert sent.cancels == 1
    assert isinstance(result_of(d), Failure)
    assert clock.getDelayedCalls() == []


def test_cancelling_fetch_while_reading_the_body_closes_it() -> None:
    clock, sent, response = Clock(), Sent(), FakeResponse()
    d = fetch(sent.deferred, clock, 40.0, 100)
    sent.deferred.callback(response)
    d.cancel()
    failure_of(d, CancelledError)
    assert response.connection.stopped == 1
    assert clock.getDelayedCalls() == []


def test_a_request_failure_is_not_called_a_timeout() -> None:
    clock, sent = Clock(), Sent()
    d = fetch(sent.deferred, clock, 40.0, 100)
    sent.deferred.errback(Failure(NoAnswer(ConnectionLost())))
    failure = failure_of(d, NoAnswer)
    assert not failure.check(HeadersTimeout)


# -- a real upstream on loopback ----------------------------------------------------------------


@attrs.define(eq=False)
class Exchange:
    """One request as the stalling upstream saw it."""

    request: Request
    lost: bool = False


class _Stall(Resource):
    isLeaf = True

    def __init__(self, upstream: StallingUpstream) -> None:
        super().__init__()
        self._upstream = upstream

    def render(self, request: Request) -> Any:
        return self._upstream.answer(request)


class StallingUpstream:
    """A ``twisted.web`` upstream on loopback that sends the headers and ``head`` of a body,
    then nothing (``head`` None: not even the headers). It counts, server side, each request's
    connection lost before the answer was finished; ``body`` set instead answers in full.

    :param length: the Content-Length to announce (None: chunked).
    """

    def __init__(
        self,
        head: bytes | None = b"{",
        length: int | None = 1000,
        body: bytes | None = None,
    ) -> None:
        self.head = head
        self.length = length
        self.body = body
        self.exchanges: list[Exchange] = []
        self.connections: set[ITCPTransport] = set()
        self._waiting: list[tuple[Callable[[], bool], Deferred[None]]] = []
        self._port: IListeningPort | None = None

    @property
    def url(self) -> str:
        assert self._port is not None
        address = self._port.getHost()
        assert isinstance(address, IPv4Address)
        return f"http://127.0.0.1:{address.port}"

    @property
    def lost(self) -> int:
        return sum(1 for e in self.exchanges if e.lost)

    def listen(self) -> None:
        site = Site(_Stall(self))
        site.noisy = False
        # A TCP listen happens at once; the endpoint's Deferred has already fired.
        listening = result_of(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site))
        assert IListeningPort.providedBy(listening), listening
        self._port = listening

    def answer(self, request: Request) -> Any:
        exchange = Exchange(request)
        self.exchanges.append(exchange)
        self.connections.add(ITCPTransport(request.channel.transport))
        self._wake()
        request.setHeader(b"content-type", b"application/json")
        if self.body is not None:
            return self.body

        def gone(_: object) -> None:
            exchange.lost = True
            self._wake()

        request.notifyFinish().addErrback(gone)
        if self.length is not None:
            request.setHeader(b"content-length", b"%d" % self.length)
        if self.head is not None:
            request.write(self.head)
        return NOT_DONE_YET

    def lost_count(self, count: int) -> Deferred[None]:
        """Fires once ``count`` exchanges have lost their connection."""
        return self._until(lambda: self.lost >= count)

    def arrived(self, count: int) -> Deferred[None]:
        """Fires once ``count`` requests have reached this upstream."""
        return self._until(lambda: len(self.exchanges) >= count)

    def _until(self, condition: Callable[[], bool], within: float = 5.0) -> Deferred[None]:
        # ``within`` real seconds guard against a hang; no assertion relies on them passing.
        d: Deferred[None] = Deferred()
        if condition():
            d.callback(None)
            return d
        self._waiting.append((condition, d))
        return d.addTimeout(within, reactor)

    def _wake(self) -> None:
        for condition, d in list(self._waiting):
            if condition():
                self._waiting.remove((condition, d))
                if not d.called:
                    d.callback(None)

    def close(self) -> Deferred[None]:
        for connection in self.connections:
            connection.abortConnection()
        if self._port is None:
            return succeed(None)
        port, self._port = self._port, None
        d: Deferred[None] = Deferred()
        stopped = port.stopListening()
        if stopped is None:
            d.callback(None)
        else:
            stopped.addBoth(lambda _: d.callback(None))
        return d


def stalling_upstreams() -> Iterator[Callable[..., StallingUpstream]]:
    """A ``stalling`` fixture's body (shared with other test modules): make listening
    stalling upstreams; each is closed after the test."""
    made: list[StallingUpstream] = []

    def make(**kwargs: Any) -> StallingUpstream:
        upstream = StallingUpstream(**kwargs)
        upstream.listen()
        made.append(upstream)
        return upstream

    yield make
    for upstream in made:
        pytest_twisted.blockon(upstream.close())


@pytest.fixture
def stalling() -> Iterator[Callable[..., StallingUpstream]]:
    yield from stalling_upstreams()


@pytest.fixture
def pool() -> Iterator[Upstream]:
    """The upstream client, whose idle pooled connections are closed after the test."""
    client = Upstream(reactor, 5.0)
    yield client
    pytest_twisted.blockon(client.close())


def get(pool: Upstream, base: str, uri: bytes = b"/") -> Deferred[Answer]:
    return pool.request(base, b"GET", uri, Fields(), None)


@pytest_twisted.ensureDeferred
async def test_real_stalled_body_times_out_and_the_server_sees_the_close(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    """The upstream sends headers and one byte of a 1000-byte body, then stalls: at the bound
    the read fails and the upstream connection is closed."""
    upstream = stalling()
    response = await get(pool, upstream.url, b"/api/tags")
    clock = Clock()
    d = read_body(response, clock, 40.0, 1 << 20)
    clock.advance(40.0)
    failure_of(d, BodyTimeout)
    await upstream.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_cancel_mid_body_closes_the_upstream(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    upstream = stalling(length=None)  # chunked this time
    response = await get(pool, upstream.url)
    d = read_body(response, Clock(), 40.0, 1 << 20)
    d.cancel()
    failure_of(d, CancelledError)
    await upstream.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_body_over_the_cap_closes_the_upstream(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    upstream = stalling(head=b"x" * 4096, length=1 << 20)
    response = await get(pool, upstream.url)
    d = read_body(response, Clock(), 40.0, 1024)
    try:
        await d
    except BodyTooLarge:
        pass
    else:
        raise AssertionError("a body over the cap was accepted")
    await upstream.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_cancel_before_headers_closes_the_upstream(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    """No headers yet: cancelling the exchange cancels the client's request, which closes it."""
    upstream = stalling(head=None)
    sent = get(pool, upstream.url)
    d = fetch(sent, Clock(), 40.0, 1 << 20)
    await upstream.arrived(1)
    d.cancel()
    assert isinstance(result_of(d), Failure)
    await upstream.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_fetch_timeout_before_headers_closes_the_upstream(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    upstream = stalling(head=None)
    clock = Clock()
    d = fetch(get(pool, upstream.url), clock, 40.0, 1 << 20)
    await upstream.arrived(1)
    clock.advance(40.0)
    failure_of(d, HeadersTimeout)
    await upstream.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_discarded_body_returns_the_connection_to_the_pool(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    """A complete body read by discard_body leaves the keep-alive connection reusable."""
    upstream = stalling(body=b'{"models":[]}')
    for _ in range(3):
        response = await get(pool, upstream.url)
        outcome: list[object] = []
        await discard_body(response, Clock(), 40.0, 1024).addBoth(outcome.append)
        assert outcome == [None]
    assert len(upstream.exchanges) == 3
    assert len(upstream.connections) == 1


@pytest_twisted.ensureDeferred
async def test_real_discard_past_its_bound_closes_the_upstream(
    stalling: Callable[..., StallingUpstream], pool: Upstream
) -> None:
    upstream = stalling()
    response = await get(pool, upstream.url)
    clock = Clock()
    d = discard_body(response, clock, 5.0, 1024)
    clock.advance(5.0)
    assert result_of(d) is None
    await upstream.lost_count(1)
