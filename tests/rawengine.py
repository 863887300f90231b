"""A scripted HTTP/1.1 engine on loopback, for tests of the upstream client and the
request path over real sockets: it reads whole requests, answers each from a script, and shows
the exact bytes it got and when each connection closed.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest_twisted
from twisted.internet import reactor as _reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure

#: The global reactor, untyped: its listen*/connect* generics reject plain factories.
reactor: Any = _reactor

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


#: What the engine does with a request: bytes to send, or its own doing.
Answer = bytes | Callable[["Peer"], None]


class Peer(Protocol):
    """The engine's side of one connection: reads whole requests, answers in turn."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buffer = b""
        self.skip = 0
        self.closed = False
        #: Requests read on this connection.
        self.count = 0

    @property
    def wire(self) -> Any:
        """The TCP transport (typed loosely: Twisted's is ``ITransport | None``)."""
        return self.transport

    def connectionMade(self) -> None:
        self.engine.peers.append(self)
        self.engine.changed()

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer:
            if self.skip:
                taken = min(self.skip, len(self.buffer))
                self.buffer, self.skip = self.buffer[taken:], self.skip - taken
                continue
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[: end + 4]
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            if not self.engine.early and len(self.buffer) < end + 4 + length:
                return
            have = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + len(have) :]
            # Answering early: the rest of the body is read afterwards, and dropped.
            self.skip = length - len(have)
            self.engine.requests.append(head + have)
            self.count += 1
            answer = self.engine.answers.pop(0) if self.engine.answers else self.engine.default
            if callable(answer):
                answer(self)
            else:
                self.wire.write(answer)
            self.engine.changed()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True
        self.engine.changed()

    def reset(self) -> None:
        """Close with an RST, as a crashing engine's kernel does."""
        handle = self.wire.getHandle()
        handle.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.wire.abortConnection()


class Engine(Factory):
    """A raw HTTP/1.1 engine on loopback that answers from a script.

    :ivar early: answer once a request's head is in, before its body (which is then read
        and dropped).
    """

    noisy = False

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.default: Answer = OK
        self.early = False
        self.requests: list[bytes] = []
        self.peers: list[Peer] = []
        self._waiting: list[tuple[Callable[[], bool], Deferred[None]]] = []
        self.url = ""

    def buildProtocol(self, addr: object) -> Peer:
        return Peer(self)

    def until(self, condition: Callable[[], bool]) -> Deferred[None]:
        # The real-time bound only stops a hang; no assertion relies on it.
        d: Deferred[None] = Deferred()
        self._waiting.append((condition, d))
        self.changed()
        return d.addTimeout(5.0, reactor)

    def lost(self, index: int) -> Deferred[None]:
        """Fires once this engine has seen its ``index``th connection close."""
        return self.until(lambda: self.peers[index].closed)

    def changed(self) -> None:
        for condition, d in list(self._waiting):
            if condition():
                self._waiting.remove((condition, d))
                d.callback(None)


def listening() -> Iterator[Engine]:
    """A fixture's body: an engine listening on 127.0.0.1 while the test runs."""
    engine = Engine()
    port = reactor.listenTCP(0, engine, interface="127.0.0.1")
    engine.url = f"http://127.0.0.1:{port.getHost().port}"
    yield engine
    for peer in engine.peers:
        peer.wire.abortConnection()
    pytest_twisted.blockon(port.stopListening())


def stale_after_first(answer: Answer = OK, reset: bool = False) -> Answer:
    """Answers a connection's first request; a second on it is read and then the connection
    is closed unanswered (with a reset if ``reset``), as an engine that times an idle
    kept-alive connection out just as the next request arrives."""

    def script(peer: Peer) -> None:
        if peer.count == 1:
            if callable(answer):
                answer(peer)
            else:
                peer.wire.write(answer)
        elif reset:
            peer.reset()
        else:
            peer.wire.loseConnection()

    return script
