"""The whole process built by ``service.build`` on a MemoryReactorClock, no sockets at all.

The real facade, request path, Agent and connection pool talk to a simulated engine's real
resource over iosim transports. The fakes elsewhere in the suite cannot drift from how the
real client behaves, because this test uses no fakes: only the network is in memory.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import CannotListenError, ConnectionDone
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from twisted.test.iosim import ConnectionCompleter, FakeTransport, IOPump, connect

from nvpair.config import Config
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.service import ProxyService, build
from nvpair.sim import SimEngine
from nvpair.sim.engine import Faults

FACADE, ENGINE = 18080, 18081


class Client(Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True


class InMemory:
    """A process, simulated llama.cpp nodes (``a``, then ``b``...), and the pumps between them."""

    def __init__(self, tmp_path: Path, faults: Faults | None = None, nodes: int = 1) -> None:
        self.reactor = MemoryReactorClock()
        self.sims = [
            SimEngine(self.reactor, "llamacpp", models=["tiny"], node=name, faults=faults)
            for name in "ab"[:nodes]
        ]
        for index, sim in enumerate(self.sims):
            sim.listen(ENGINE + index)
        self.sim = self.sims[0]
        fleet = Fleet(
            60.0,
            {"llamacpp": FacadeSpec(FACADE, ())},
            tuple(
                FleetNode(sim.node, {"llamacpp": f"http://127.0.0.1:{ENGINE + index}"})
                for index, sim in enumerate(self.sims)
            ),
        )
        self.log = io.StringIO()
        self.service: ProxyService = build(
            self.reactor, Config(state_dir=tmp_path, fleet=fleet), log_out=self.log
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

    def client(self, request: bytes, *, run: bool = True) -> Client:
        factory = next(f for port, f, *_ in self.reactor.tcpServers if port == FACADE)
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


def completion(stream: bool) -> bytes:
    body = json.dumps({"model": "tiny", "prompt": "hi", "stream": stream}).encode()
    return (
        b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def test_one_request_and_one_shutdown_through_the_whole_process(tmp_path: Path) -> None:
    process = InMemory(tmp_path)
    process.service.startService()
    process.run()  # the first inventory poll: node "a" joins
    client = process.client(completion(stream=False))
    head, _, body = client.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"X-Nvpair-Node: a" in head
    assert json.loads(body)["content"] == "Hello from a."
    assert process.service.request_path.in_flight == 0

    stopped = process.service.stopService()
    process.run()
    assert stopped.called
    assert process.service.request_path.in_flight == 0
    assert [line for line in log_lines(process) if "stack" in line] == []


def test_shutdown_cancels_a_request_in_flight_and_closes_its_client(tmp_path: Path) -> None:
    process = InMemory(tmp_path, Faults(stall=True))
    process.service.startService()
    process.run()
    client = process.client(completion(stream=True))
    assert process.service.request_path.in_flight == 1 and client.data == b""

    stopped = process.service.stopService()
    process.run()
    assert stopped.called
    assert process.service.request_path.in_flight == 0 and client.closed
    # The engine's stalled answer was abandoned: its connection closed by the proxy.
    assert process.sim.in_flight == 0
    assert [line for line in log_lines(process) if "stack" in line] == []


def test_a_refused_connection_fails_over_through_the_real_client(tmp_path: Path) -> None:
    """How the real Agent reports a refused dial is what the loop classifies, not a fake's."""
    process = InMemory(tmp_path, nodes=2)
    process.service.startService()
    process.run()
    # The polls' kept-alive connections go, so the request has to dial.
    process.service.upstream.close()
    process.run()
    client = process.client(completion(stream=False), run=False)
    for pump in process.pumps:
        pump.flush()
    # The dial to node a (first by id) is refused; node b answers.
    (_, port, *_), *_ = process.reactor.tcpClients
    assert port == ENGINE
    process.completer.failOnce()
    process.run()
    head, _, body = client.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"X-Nvpair-Node: b" in head
    assert json.loads(body)["content"] == "Hello from b."


def log_lines(process: InMemory) -> list[dict[str, Any]]:
    return [json.loads(line) for line in process.log.getvalue().splitlines() if line]


class _PortTaken(MemoryReactorClock):
    """A reactor on which one port is held by another process."""

    def __init__(self, taken: int) -> None:
        super().__init__()
        self.taken = taken

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        if port == self.taken:
            raise CannotListenError(interface, port, OSError(98, "Address already in use"))
        return super().listenTCP(port, factory, backlog, interface)


def has_stopped(reactor: MemoryReactorClock) -> bool:
    return bool(reactor.hasStopped)


def started_as_under_twistd(root: ProxyService) -> None:
    """``root`` started with its log observer seeing everything logged meanwhile, as twistd
    does with the observer the root service registers on its Application."""
    globalLogPublisher.addObserver(root.observer)
    try:
        root.startService()
    finally:
        globalLogPublisher.removeObserver(root.observer)


def test_a_fleet_facade_that_cannot_bind_ends_the_process(tmp_path: Path) -> None:
    """In fleet mode a facade that cannot bind ends the process (docs/ports.md#bind-failures)
    with a non-zero status and the reason on stderr. Nothing more starts (no poll), and the end
    is the ordered shutdown, begun as soon as the reactor runs."""
    reactor = _PortTaken(FACADE + 1)
    fleet = Fleet(
        60.0,
        {"ollama": FacadeSpec(FACADE, ()), "llamacpp": FacadeSpec(FACADE + 1, ())},
        (FleetNode("a", {"llamacpp": f"http://127.0.0.1:{ENGINE}"}),),
    )
    log = io.StringIO()
    root = build(reactor, Config(state_dir=tmp_path, fleet=fleet), log_out=log)
    started_as_under_twistd(root)
    assert root.exit_status == 1 and not has_stopped(reactor)
    reactor.run()
    assert has_stopped(reactor)
    errors = [r for r in map(json.loads, log.getvalue().splitlines()) if r["level"] == "error"]
    assert [r["msg"] for r in errors] == [
        f"llama.cpp facade not enabled: cannot listen on port {FACADE + 1}: "
        "[Errno 98] Address already in use: ending the process"
    ]
    assert reactor.tcpClients == []  # no node polled
    stopped = root.stopService()
    reactor.advance(0)
    assert stopped.called


def test_an_admin_port_in_use_ends_the_process(tmp_path: Path) -> None:
    """The admin listener's port taken ends the process as a fleet facade's does
    (docs/operations.md#the-admin-listener): exit status 1, a warning naming the address and
    the error that ends it, then the ordered shutdown once the reactor runs. In broker mode
    too, where a facade's bind failure would go to the broker instead."""
    reactor = _PortTaken(FACADE + 2)
    log = io.StringIO()
    config = Config(state_dir=tmp_path, broker="tcp:127.0.0.1:9", admin_port=FACADE + 2)
    root = build(reactor, config, log_out=log)
    started_as_under_twistd(root)
    assert root.exit_status == 1 and not has_stopped(reactor)
    reactor.run()
    assert has_stopped(reactor)
    why = f"cannot listen on 127.0.0.1:{FACADE + 2}: [Errno 98] Address already in use"
    said = [(r["level"], r["msg"]) for r in map(json.loads, log.getvalue().splitlines())]
    assert said == [
        ("warn", why),
        ("error", f"admin listener not started: {why}: ending the process"),
    ]
    stopped = root.stopService()
    reactor.advance(5)  # the broker link never connected: its close waits out its bound
    assert stopped.called


class _Ports(MemoryReactorClock):
    """A reactor that keeps every listening port it gives, to see them closed."""

    def __init__(self) -> None:
        super().__init__()
        self.ports: dict[int, Any] = {}

    def listenTCP(self, port: int, factory: Any, backlog: int = 50, interface: str = "") -> Any:
        listening = super().listenTCP(port, factory, backlog, interface)
        listening.stopped = False

        def stop() -> None:
            listening.stopped = True

        listening.stopListening = stop
        self.ports[port] = listening
        return listening


def test_the_admin_listener_is_loopback_only_and_closed_at_shutdown(tmp_path: Path) -> None:
    """The admin port listens on 127.0.0.1 only, from start to the ordered shutdown."""
    reactor = _Ports()
    config = Config(state_dir=tmp_path, broker="tcp:127.0.0.1:9", admin_port=FACADE + 2)
    root = build(reactor, config, log_out=io.StringIO())
    root.startService()
    [(port, _factory, _backlog, interface)] = reactor.tcpServers
    assert (port, interface) == (FACADE + 2, "127.0.0.1")
    assert not reactor.ports[port].stopped
    stopped = root.stopService()
    reactor.advance(5)  # the broker link never connected: its close waits out its bound
    assert stopped.called and reactor.ports[port].stopped


def test_a_broker_link_closed_by_the_shutdown_stops_nothing_twice(tmp_path: Path) -> None:
    """Broker EOF ends the process; but when the link closes because the process is already
    shutting down (a signal, an admin port in use), the reactor is stopping: a second stop
    would be refused, an error with a traceback in the log."""
    reactor = MemoryReactorClock()
    log = io.StringIO()
    root = build(reactor, Config(state_dir=tmp_path, broker="tcp:127.0.0.1:9"), log_out=log)
    # Running, as under twistd (MemoryReactor.run would stop again at once).
    reactor.running = True
    root.startService()
    [(_host, _port, factory, _timeout, _bind)] = reactor.tcpClients
    link = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9))
    assert link is not None
    root.stopService()
    link.connectionLost(Failure(ConnectionDone()))
    assert not has_stopped(reactor)
    assert "broker link closed" not in log.getvalue()
