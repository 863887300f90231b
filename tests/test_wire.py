# -*- test-case-name: tests.test_wire -*-
"""Writes go out at once (:mod:`nvpair.wire`): over a real loopback TCP connection a write
with nothing queued ahead is sent without the reactor's help, and anything the kernel does not
take is queued behind, in order, with the transport's own backpressure."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from typing import Any

import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet.abstract import FileDescriptor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.task import deferLater
from twisted.internet.testing import MemoryReactor
from twisted.python.failure import Failure

from nvpair.wire import send


def test_the_twisted_internals_it_reads_are_still_there() -> None:
    """A Twisted that renames these would make :func:`send` misjudge the queue: fail here."""
    connection = tcp.Connection.__new__(tcp.Connection)
    FileDescriptor.__init__(connection)
    assert connection._tempDataLen == 0 and connection._tempDataBuffer == []
    assert connection.dataBuffer == b"" and connection.offset == 0
    assert not connection._writeDisconnected and not connection.disconnecting
    assert tcp.Connection.TLS is False


class Server(Protocol):
    def connectionMade(self) -> None:
        assert isinstance(self.factory, ServerFactory)
        self.factory.made.callback(self)


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

    @property
    def transport(self) -> tcp.Connection:
        transport: object = self.server.transport
        assert isinstance(transport, tcp.Connection)
        return transport


def writers() -> list[object]:
    """What the reactor is asked to write for now."""
    fds: Any = reactor
    found: list[object] = fds.getWriters()
    return found


def queued(transport: tcp.Connection) -> int:
    """Bytes the transport holds for its next write turn (read through a call: it changes)."""
    length: int = transport._tempDataLen
    return length


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


async def turn() -> None:
    await deferLater(reactor, 0.01, lambda: None)


async def received(pair: Pair, size: int) -> None:
    for _ in range(500):
        if len(pair.client.received) >= size:
            return
        await turn()
    raise AssertionError(f"only {len(pair.client.received)} of {size} bytes arrived")


@pytest_twisted.ensureDeferred
async def test_a_small_write_is_sent_without_asking_the_reactor(pair: Pair) -> None:
    send(pair.transport, b"hello")
    # Nothing queued, no write interest: the kernel has it already.
    assert queued(pair.transport) == 0 and pair.transport.dataBuffer == b""
    assert pair.transport not in writers()
    await received(pair, 5)
    assert pair.client.received == b"hello"


@pytest_twisted.ensureDeferred
async def test_what_the_kernel_does_not_take_is_queued_in_order(pair: Pair) -> None:
    """The client does not read: the first big write fills the socket buffers, the rest and
    every later write queue behind it, and the bytes arrive in the order written."""
    assert pair.client.transport is not None
    pair.client.reading(False)
    big = bytes(range(256)) * (32 * 1024)  # 8 MiB, far more than loopback buffers hold
    send(pair.transport, big)
    assert queued(pair.transport) > 0  # the remainder is the transport's to send
    assert pair.transport in writers()
    send(pair.transport, b"tail")
    assert pair.transport._tempDataBuffer[-1] == b"tail"  # behind, not around
    pair.client.reading(True)
    await received(pair, len(big) + 4)
    assert bytes(pair.client.received) == big + b"tail"


@pytest_twisted.ensureDeferred
async def test_a_registered_producer_is_still_paused_by_a_full_buffer(pair: Pair) -> None:
    class Producer:
        paused = 0

        def pauseProducing(self) -> None:
            self.paused += 1

        def resumeProducing(self) -> None:
            pass

        def stopProducing(self) -> None:
            pass

    producer = Producer()
    assert pair.client.transport is not None
    pair.client.reading(False)
    pair.transport.registerProducer(producer, True)
    send(pair.transport, b"x" * (8 * 1024 * 1024))
    assert producer.paused == 1
    pair.transport.unregisterProducer()
    pair.client.reading(True)
    await received(pair, 8 * 1024 * 1024)


@pytest_twisted.ensureDeferred
async def test_after_lose_connection_writes_are_the_transports_business(pair: Pair) -> None:
    send(pair.transport, b"last")
    pair.transport.loseConnection()
    send(pair.transport, b"!")  # queued by the transport, flushed before the close
    await pair.client.closed
    assert bytes(pair.client.received) in (b"last", b"last!")


def test_any_other_transport_is_written_to_as_usual() -> None:
    class Recording:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

    transport = Recording()
    send(transport, b"abc")
    assert transport.written == [b"abc"]


class StubSocket:
    """A non-blocking socket whose kernel takes ``room`` bytes, then nothing."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent = bytearray()

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return 99

    def send(self, data: bytes) -> int:
        if not self.room:
            raise BlockingIOError()
        taken = bytes(data[: self.room])
        self.room -= len(taken)
        self.sent += taken
        return len(taken)


def stub_connection(room: int) -> tuple[tcp.Connection, StubSocket, MemoryReactor]:
    skt, memory = StubSocket(room), MemoryReactor()
    connection = tcp.Connection(skt, Protocol(), memory)  # type: ignore[arg-type]
    connection.connected = True
    return connection, skt, memory


def test_a_write_queued_ahead_keeps_later_writes_behind_it() -> None:
    """The kernel took part of the first write; when it has room again before the reactor's
    turn, a second write must still wait behind the queued rest, never overtake it."""
    connection, skt, memory = stub_connection(room=3)
    send(connection, b"hello")
    assert skt.sent == b"hel" and connection._tempDataBuffer == [b"lo"]
    assert connection in memory.writers
    skt.room = 1_000
    send(connection, b"tail")
    assert skt.sent == b"hel"
    connection.doWrite()
    assert skt.sent == b"hello" + b"tail"


def test_a_would_block_queues_the_whole_write() -> None:
    connection, skt, memory = stub_connection(room=0)
    send(connection, b"all")
    assert skt.sent == b"" and connection._tempDataBuffer == [b"all"]
    assert connection in memory.writers


def test_a_write_the_kernel_takes_whole_asks_nothing_of_the_reactor() -> None:
    connection, skt, memory = stub_connection(room=1_000)
    send(connection, b"whole")
    assert skt.sent == b"whole" and connection not in memory.writers


def test_a_connection_reset_under_a_write_is_left_to_the_transport() -> None:
    """The peer reset the connection: the write is queued, and the transport's own next write
    attempt meets the error and reports the connection lost (no exception out of send)."""

    class ResetSocket(StubSocket):
        def send(self, data: bytes) -> int:
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    skt, memory = ResetSocket(0), MemoryReactor()
    connection = tcp.Connection(skt, Protocol(), memory)  # type: ignore[arg-type]
    connection.connected = True
    send(connection, b"lost")
    assert connection._tempDataBuffer == [b"lost"] and connection in memory.writers
    assert connection.doWrite() is not None  # CONNECTION_LOST: the reactor closes it
