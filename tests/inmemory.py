"""The whole process built by ``service.build`` on a MemoryReactorClock, in front of simulated
engines listening on the same reactor: no sockets at all, only the network is in memory.

The real facades, request path, upstream client and pool talk to the simulated engines' real
resources over iosim transports, so nothing here can drift from how the real client behaves.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test.iosim import ConnectionCompleter, FakeTransport, IOPump, connect

from nvpair.config import Config
from nvpair.fleet.file import Fleet
from nvpair.service import ProxyService, build
from nvpair.sim import SimEngine


class Client(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True


class InMemoryProcess:
    """A fleet-mode process over ``fleet`` and the ``sims`` (already listening on
    ``reactor``), and the pumps between them.

    :param config: more :class:`~nvpair.config.Config` fields.
    """

    def __init__(
        self,
        tmp_path: Path,
        reactor: MemoryReactorClock,
        fleet: Fleet,
        sims: Sequence[SimEngine],
        **config: Any,
    ) -> None:
        self.reactor = reactor
        self.fleet = fleet
        self.sims = list(sims)
        self.log = io.StringIO()
        self.service: ProxyService = build(
            self.reactor, Config(state_dir=tmp_path, fleet=fleet, **config), log_out=self.log
        )
        self.completer = ConnectionCompleter(self.reactor)
        self.pumps: list[IOPump] = []

    def run(self, seconds: float = 0.0) -> None:
        """Complete pending connections and move bytes until nothing changes."""
        for _ in range(200):
            pump = self.completer.succeedOnce()
            if pump is not None:
                self.pumps.append(pump)
            moved = any([p.pump() for p in self.pumps])
            self.reactor.advance(0)
            if pump is None and not moved:
                break
        if seconds:
            self.reactor.advance(seconds)
            self.run()

    def client(self, request: bytes, *, port: int | None = None, run: bool = True) -> Client:
        """A loopback client connected to the listener on ``port`` (the fleet's first facade's
        by default), having sent ``request``."""
        port = port or next(iter(self.fleet.facades.values())).port
        factory = next(f for listening, f, *_ in self.reactor.tcpServers if listening == port)
        peer = IPv4Address("TCP", "127.0.0.1", 50000 + len(self.pumps))
        server = factory.buildProtocol(peer)
        client = Client()
        pump = connect(
            server,
            FakeTransport(server, isServer=True, peerAddress=peer),
            client,
            FakeTransport(client, isServer=False),
            clock=self.reactor,
        )
        self.pumps.append(pump)
        assert client.transport is not None
        client.transport.write(request)
        if run:
            self.run()
        return client

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.getvalue().splitlines() if line]
