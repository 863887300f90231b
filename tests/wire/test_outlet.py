# -*- test-case-name: tests.wire.test_outlet -*-
"""Writes go out at once (:mod:`nvpair.wire.outlet`): over a real loopback TCP connection a write
with nothing queued ahead is sent without the reactor's help, anything the kernel does not take
is queued behind, in order, and the connection's producer is paused and resumed as Twisted would
pause and resume a push producer — all through public interfaces."""

from __future__ import annotations

import fcntl
import struct
import termios
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from nvpair.wire.outlet import GATHER, HIGH_WATER, WINDOW, Outlet

BIG = bytes(range(256)) * (32 * 1024)  # 8 MiB: far more than loopback buffers hold


class Recorder:
    """A producer that counts what it was told."""

    def __init__(self) -> None:
        self.paused = 0
        self.resumed = 0
        self.stopped = 0

    def pauseProducing(self) -> None:
        self.paused += 1

    def resumeProducing(self) -> None:
        self.resumed += 1

    def stopProducing(self) -> None:
        self.stopped += 1


class Server(Protocol):
    def __init__(self) -> None:
        self.lost: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        assert isinstance(self.factory, ServerFactory)
        self.factory.made.callback(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.callback(None)


class ServerFactory(Factory):
    protocol = Server

    def __init__(self) -> None:
        self.made: Deferred[Server] = Deferred()


class Client(Protocol):
    def __init__(self) -> None:
        self.received = bytearray()
        self.closed: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def reading(self, on: bool) -> None:
        """Stop or start reading: the kernel's buffers then fill up, or drain."""
        transport: Any = self.transport
        if on:
            transport.resumeProducing()
        else:
            transport.pauseProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed.callback(None)


class Pair:
    def __init__(self, server: Server, client: Client, port: IListeningPort) -> None:
        self.server, self.client, self.port = server, client, port
        self.producer = Recorder()
        self.outlet = Outlet(self.transport, self.producer)

    @property
    def transport(self) -> tcp.Connection:
        transport: object = self.server.transport
        assert isinstance(transport, tcp.Connection)
        return transport

    def writing(self) -> bool:
        """Whether the reactor is asked to write for this connection now (public
        ``IReactorFDSet``)."""
        fds: Any = reactor
        return self.transport in fds.getWriters()


@pytest_twisted.async_yield_fixture
async def pair() -> AsyncIterator[Pair]:
    factory = ServerFactory()
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    client = await TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port).connect(
        Factory.forProtocol(Client)
    )
    server = await factory.made
    assert isinstance(client, Client)
    yield Pair(server, client, port)
    if client.transport is not None:
        client.transport.loseConnection()
    await port.stopListening()


def readable(pair: Pair) -> int:
    """Bytes the kernel holds for the client to read: what has been sent so far."""
    transport: Any = pair.client.transport
    answer = fcntl.ioctl(transport.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", answer)[0])


def paused(outlet: Outlet) -> bool:
    """Read through a call: it changes between two reads."""
    return outlet.paused


async def turn() -> None:
    await deferLater(reactor, 0.01, lambda: None)


async def until(check: Any, what: str) -> None:
    for _ in range(500):
        if check():
            return
        await turn()
    raise AssertionError(what)


async def received(pair: Pair, size: int) -> None:
    await until(lambda: len(pair.client.received) >= size, f"fewer than {size} bytes arrived")


@pytest_twisted.ensureDeferred
async def test_a_small_write_is_sent_without_asking_the_reactor(pair: Pair) -> None:
    pair.outlet.send(b"hello")
    assert not pair.writing()
    await received(pair, 5)
    assert pair.client.received == b"hello"


@pytest_twisted.ensureDeferred
async def test_what_the_kernel_does_not_take_is_queued_in_order_and_pauses_the_producer(
    pair: Pair,
) -> None:
    """The client does not read: the first big write fills the socket buffers, the rest and
    every later write queue behind it (a later send never overtakes), the producer is paused
    once and resumed once everything has gone out, and then writes go direct again."""
    pair.client.reading(False)
    pair.outlet.send(BIG)
    assert pair.writing() and pair.outlet.paused
    assert pair.producer.paused == 1
    pair.outlet.send(b"tail")
    pair.outlet.queue(b"!")
    assert pair.producer.paused == 1
    pair.client.reading(True)
    await received(pair, len(BIG) + 5)
    assert bytes(pair.client.received) == BIG + b"tail!"
    await until(lambda: pair.producer.resumed == 1, "the producer was not resumed")
    assert not paused(pair.outlet)
    pair.outlet.send(b"again")
    assert not pair.writing()
    await received(pair, len(BIG) + 10)


@pytest_twisted.ensureDeferred
async def test_queued_pieces_leave_together_and_below_the_mark_pause_nothing(pair: Pair) -> None:
    for piece in (b"a", b"b", b"c"):
        pair.outlet.queue(piece)
    assert pair.writing() and pair.producer.paused == 0
    await received(pair, 3)
    assert pair.client.received == b"abc"
    await until(lambda: not pair.writing(), "the reactor still writes")
    pair.outlet.send(b"d")
    assert not pair.writing()


@pytest_twisted.ensureDeferred
async def test_exactly_past_the_high_water_mark_pauses(pair: Pair) -> None:
    pair.client.reading(False)
    pair.outlet.queue(b"x" * HIGH_WATER)
    assert pair.producer.paused == 0
    pair.outlet.queue(b"x")
    assert pair.producer.paused == 1
    pair.client.reading(True)
    await received(pair, HIGH_WATER + 1)


@pytest_twisted.ensureDeferred
async def test_a_close_after_sent_writes_completes(pair: Pair) -> None:
    """A pull producer would hold a closing connection open for ever; the outlet lets go."""
    pair.outlet.send(b"last")
    pair.transport.loseConnection()
    await pair.client.closed
    assert pair.client.received == b"last"
    assert pair.producer.stopped == 0


@pytest_twisted.ensureDeferred
async def test_a_close_behind_queued_bytes_sends_them_all_first(pair: Pair) -> None:
    pair.client.reading(False)
    pair.outlet.send(BIG)
    pair.outlet.queue(b"end")
    pair.transport.loseConnection()
    pair.outlet.send(b"!")  # the transport's business now: flushed before the close, or not
    pair.client.reading(True)
    await pair.client.closed
    assert bytes(pair.client.received) in (BIG + b"end", BIG + b"end!")


@pytest_twisted.ensureDeferred
async def test_a_peer_reset_is_reported_as_a_lost_connection(pair: Pair) -> None:
    """The peer reset the connection: the outlet raises nothing, the transport reports the
    loss, and the connection's producer is stopped."""
    client: Any = pair.client.transport
    client.abortConnection()
    await turn()
    for _ in range(3):
        pair.outlet.send(b"x" * 100_000)
    await pair.server.lost
    assert pair.producer.stopped == 1
    pair.outlet.stopProducing()  # once more, as a late call would: told once, then let go
    assert pair.producer.stopped == 1


def test_any_other_transport_is_written_to_as_usual_with_its_own_backpressure() -> None:
    transport = StringTransport()
    producer = Recorder()
    outlet = Outlet(transport, producer)
    assert transport.producer is outlet and transport.streaming
    outlet.send(b"abc")
    outlet.queue(b"def")
    assert transport.value() == b"abcdef"
    outlet.pauseProducing()
    assert producer.paused == 1 and outlet.paused
    outlet.resumeProducing()
    assert producer.resumed == 1 and not outlet.paused


@pytest_twisted.ensureDeferred
async def test_while_a_read_is_handled_sends_are_gathered_and_leave_as_one(pair: Pair) -> None:
    """What a handled read makes an outlet send stays in this process until the read has been
    handled, then leaves in one send, in order (a stream's last piece and its terminator);
    a read inside another releases nothing."""
    last, end = b"data: last\n\n", b"0\r\n\r\n"
    with GATHER:
        pair.outlet.send(last)
        with GATHER:
            pair.outlet.send(end)
        assert readable(pair) == 0 and not pair.writing()
    assert readable(pair) == len(last + end)
    assert not pair.writing() and not GATHER.outlets
    await received(pair, len(last + end))
    assert pair.client.received == last + end
    pair.outlet.send(b"later")  # no read handled: at once
    assert readable(pair) == 5


@pytest_twisted.ensureDeferred
async def test_a_close_while_a_read_is_handled_sends_what_was_gathered_first(pair: Pair) -> None:
    with GATHER:
        pair.outlet.send(b"the end")
        pair.outlet.close()
    await pair.client.closed
    assert pair.client.received == b"the end"


@pytest_twisted.ensureDeferred
async def test_behind_queued_bytes_nothing_is_gathered(pair: Pair) -> None:
    """Bytes already queued in the transport go first: a send behind them is queued too, never
    held back and sent ahead of them."""
    pair.client.reading(False)
    pair.outlet.send(BIG)
    with GATHER:
        pair.outlet.send(b"tail")
        assert not GATHER.outlets
    pair.client.reading(True)
    await received(pair, len(BIG) + 4)
    assert bytes(pair.client.received) == BIG + b"tail"


# -- a large body, from where it is (docs/robustness.md#what-a-request-body-costs) ---------------


@pytest_twisted.ensureDeferred
async def test_a_large_body_goes_out_from_where_it_is_a_window_at_a_time(pair: Pair) -> None:
    """Handed to the transport whole (behind its head, or what the kernel did not take of it
    sliced off) it was copied whole: the client reading nothing, what is written costs a few
    windows, and everything arrives in order, what was sent after it last."""
    pair.client.reading(False)
    tracemalloc.start()
    try:
        pair.outlet.send_body(b"HEAD", BIG)
        pair.outlet.send(b"tail")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * WINDOW
    pair.client.reading(True)
    await received(pair, 4 + len(BIG) + 4)
    assert bytes(pair.client.received) == b"HEAD" + BIG + b"tail"
    pair.outlet.send(b"again")
    await received(pair, 4 + len(BIG) + 9)


@pytest_twisted.ensureDeferred
async def test_a_body_sent_while_one_is_still_going_out_follows_it(pair: Pair) -> None:
    """An engine may answer before it has read a request's body, and the connection carry the
    next request: it goes behind the rest of the first."""
    pair.client.reading(False)
    pair.outlet.send_body(b"ONE", BIG)
    pair.outlet.send_body(b"TWO", BIG[::-1])
    pair.client.reading(True)
    await received(pair, 6 + 2 * len(BIG))
    assert bytes(pair.client.received) == b"ONE" + BIG + b"TWO" + BIG[::-1]


@pytest_twisted.ensureDeferred
async def test_a_close_while_a_body_goes_out_drops_the_rest(pair: Pair) -> None:
    pair.client.reading(False)
    pair.outlet.send_body(b"HEAD", BIG)
    pair.outlet.close()
    pair.client.reading(True)
    await pair.client.closed
    assert len(pair.client.received) < len(BIG)


def test_a_transport_with_a_buffer_of_its_own_is_fed_as_it_drains() -> None:
    """TLS says when its buffer has drained only to a producer: the outlet registers as one
    for the body, and writes a window each time it may."""
    transport = StringTransport()
    outlet = Outlet(transport)
    assert transport.producer is None
    outlet.send(b"first ")
    outlet.send_body(b"HEAD", BIG)
    assert transport.producer is outlet and transport.streaming  # type: ignore[unreachable]
    assert transport.value() == b"first HEAD" + BIG  # type: ignore[unreachable]
    transport.clear()
    outlet.pauseProducing()
    outlet.send_body(b"NEXT", BIG)
    assert transport.value() == b"NEXT"
    outlet.resumeProducing()
    assert transport.value() == b"NEXT" + BIG
