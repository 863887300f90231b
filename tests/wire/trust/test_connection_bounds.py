"""A facade port bounds what callers other than loopback hold before anything is known of them:
connections per source, handshakes in progress, the reserve of descriptors, the handshake's
deadline (docs/robustness.md#connection-bounds). In memory, on a Clock."""

from __future__ import annotations

import resource
import ssl
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.internet import ssl as tssl
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.logger import ILogObserver, Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test.iosim import connectedServerAndClient

from nvpair.config import Config
from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.service import build
from nvpair.wire.trust.cluster import load_membership
from nvpair.wire.trust.connbounds import BURST, PER_SOURCE, ConnectionCounts, lan_capacity
from nvpair.wire.trust.lantls import HANDSHAKE_TIMEOUT, lan_context
from nvpair.wire.trust.sniffing import SniffingFactory
from tests.certs import issue, make_ca, make_identity, write_cluster_dir

CA = make_ca()
LAN = lan_context(*(lambda c: (c.cert_pem, c.key_pem))(issue(CA, ["gpu.lan"])))
ME, ALICE = make_identity("me"), make_identity("alice")


class Says(Protocol):
    def __init__(self, name: bytes) -> None:
        self.name = name

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(self.name)


def v4(host: str, port: int = 40000) -> IPv4Address:
    return IPv4Address("TCP", host, port)


def listener(
    bounds: ConnectionCounts | None,
    *,
    lan: bool = True,
    member: Path | None = None,
    given_back: list[float] | None = None,
) -> tuple[SniffingFactory, Clock]:
    """A facade port's factory: LAN TLS (``lan``), a cluster member (``member``: its
    directory), both or neither."""
    clock = Clock()
    membership = None
    if member is not None:
        membership = load_membership(write_cluster_dir(member, ME, [ALICE]))
    factory = SniffingFactory(
        clock,
        Factory.forProtocol(lambda: Says(b"plain")),
        Factory.forProtocol(lambda: Says(b"peer")),
        lambda: membership,
        lan=Factory.forProtocol(lambda: Says(b"lan")),
        lan_tls=lambda: LAN if lan else None,
        bounds=bounds,
        give_back=lambda: (given_back if given_back is not None else []).append(clock.seconds()),
    )
    return factory, clock


def connected(factory: SniffingFactory, peer: Any) -> StringTransportWithDisconnection:
    """A connection ``factory`` accepted from ``peer`` (it must accept it)."""
    protocol = factory.buildProtocol(peer)
    assert protocol is not None
    transport = StringTransportWithDisconnection(peerAddress=peer)
    transport.protocol = protocol
    protocol.makeConnection(transport)
    return transport


def client_hello() -> bytes:
    """What a TLS client sends first, and then waits on."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="gpu.lan")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_source_past_its_bound_is_closed_at_accept_ipv6_per_slash_64() -> None:
    """64 connections per IPv4 address, and per /64 whatever address of it each comes from;
    Twisted's listener closes the socket when the factory builds no protocol."""
    bounds = ConnectionCounts()
    factory, _ = listener(bounds)
    for n in range(PER_SOURCE):
        assert factory.buildProtocol(v4("10.0.0.1", 40000 + n)) is not None
        assert factory.buildProtocol(IPv6Address("TCP", f"2001:db8:1:2::{n + 1:x}", 1)) is not None
    assert factory.buildProtocol(v4("10.0.0.1")) is None
    assert factory.buildProtocol(IPv4Address("TCP", "::ffff:10.0.0.1", 1)) is None
    assert factory.buildProtocol(IPv6Address("TCP", "2001:db8:1:2:ffff::9", 1)) is None
    # Another address, another /64: a place each.
    assert factory.buildProtocol(v4("10.0.0.2")) is not None
    assert factory.buildProtocol(IPv6Address("TCP", "2001:db8:1:3::1", 1)) is not None


def test_a_closed_connection_gives_its_place_back() -> None:
    bounds = ConnectionCounts(per_source=2)
    factory, _ = listener(bounds)
    first = connected(factory, v4("10.0.0.1"))
    connected(factory, v4("10.0.0.1"))
    assert factory.buildProtocol(v4("10.0.0.1")) is None
    first.loseConnection()
    assert bounds.held_by("10.0.0.1") == 1
    connected(factory, v4("10.0.0.1"))


def test_loopback_is_never_counted_and_keeps_the_reserve() -> None:
    """Past the LAN's share of the open-files limit every other address is closed at accept;
    loopback, however it is spelled, is still served."""
    bounds = ConnectionCounts(capacity=2)
    factory, _ = listener(bounds)
    connected(factory, v4("10.0.0.1"))
    connected(factory, v4("10.0.0.2"))
    assert factory.buildProtocol(v4("10.0.0.3")) is None
    for host in ("127.0.0.1", "::ffff:127.0.0.1"):
        transport = connected(factory, IPv4Address("TCP", host, 1))
        transport.protocol.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
        assert transport.value() == b"plain"
    transport = connected(factory, IPv6Address("TCP", "::1", 1))
    assert bounds.connections == 2


def test_without_bounds_nothing_is_counted() -> None:
    """Broker mode: no bound at all (docs/robustness.md#connection-bounds)."""
    factory, _ = listener(None)
    assert all(factory.buildProtocol(v4("10.0.0.1", n)) is not None for n in range(200))


def test_a_handshake_past_the_bound_is_closed_at_its_first_byte_plaintext_is_not() -> None:
    bounds = ConnectionCounts(handshakes=2)
    factory, _ = listener(bounds)
    first, second, third, plain = (connected(factory, v4(f"10.0.0.{n}")) for n in range(1, 5))
    for transport in (first, second, third):
        transport.protocol.dataReceived(b"\x16")
    assert not first.disconnecting and not second.disconnecting
    # Closed before a TLS state was made for it: nothing was written.
    assert third.disconnected and third.value() == b""
    assert bounds.handshakes == 2
    plain.protocol.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
    assert plain.value() == b"plain"
    first.loseConnection()
    assert bounds.handshakes == 1 and bounds.connections == 2
    again = connected(factory, v4("10.0.0.1"))
    again.protocol.dataReceived(b"\x16")
    assert not again.disconnecting and bounds.handshakes == 2


def test_the_memory_of_a_burst_of_handshakes_is_given_back_once_it_is_over() -> None:
    """glibc keeps what OpenSSL freed; after a flood of handshakes it is given back, once the
    last one's own state is freed too (the next turn of the reactor)."""
    given_back: list[float] = []
    bounds = ConnectionCounts()
    factory, clock = listener(bounds, given_back=given_back)
    flood = [connected(factory, v4(f"10.0.{n // 60}.{n % 60}")) for n in range(BURST)]
    for transport in flood:
        transport.protocol.dataReceived(b"\x16")
    for transport in flood[:-1]:
        transport.loseConnection()
    clock.advance(0)
    assert given_back == []
    flood[-1].loseConnection()
    assert given_back == []
    clock.advance(0)
    assert given_back == [0.0]


def test_a_finished_handshake_no_longer_counts_its_connection_does() -> None:
    bounds = ConnectionCounts()
    factory, clock = listener(bounds)
    received: list[bytes] = []

    class Asks(Protocol):
        def connectionMade(self) -> None:
            assert self.transport is not None
            self.transport.write(b"GET / HTTP/1.1\r\n\r\n")

        def dataReceived(self, data: bytes) -> None:
            received.append(data)

    client_factory = TLSMemoryBIOFactory(
        tssl.optionsForClientTLS("gpu.lan", tssl.Certificate.loadPEM(CA.cert_pem)),
        True,
        Factory.forProtocol(Asks),
        clock,
    )
    _, server, pump = connectedServerAndClient(
        lambda: factory.buildProtocol(v4("10.0.0.1")),
        lambda: client_factory.buildProtocol(v4("10.0.0.9")),
        clock=clock,
    )
    pump.flush()
    assert received == [b"lan"]
    assert bounds.handshakes == 0 and bounds.connections == 1
    # Past the deadline the finished handshake's connection is the site's, left open.
    clock.advance(HANDSHAKE_TIMEOUT + 1)
    pump.flush()
    assert server is not None and not server.transport.disconnecting  # type: ignore[union-attr]


@pytest.mark.parametrize("personality", ["lan", "member", "member-and-lan"])
def test_a_handshake_left_unfinished_is_closed_5s_after_its_first_byte(
    personality: str, tmp_path: Path
) -> None:
    """A ClientHello answered, then silence: closed at 5 s, on a port that serves LAN callers
    TLS and on one that serves pinned peers only (where nothing bounded it before)."""
    assert HANDSHAKE_TIMEOUT == 5.0
    bounds = ConnectionCounts()
    member = tmp_path / "cluster" if personality.startswith("member") else None
    factory, clock = listener(bounds, lan=personality.endswith("lan"), member=member)
    transport = connected(factory, v4("10.0.0.1"))
    clock.advance(3)  # the sniffing time does not count
    transport.protocol.dataReceived(client_hello())
    clock.advance(0)
    assert transport.value()  # the server's answer to the ClientHello
    assert bounds.handshakes == 1
    clock.advance(HANDSHAKE_TIMEOUT - 0.1)
    assert not transport.disconnecting
    clock.advance(0.2)
    assert transport.disconnected
    assert bounds.handshakes == 0 and bounds.connections == 0


def test_refusals_are_logged_once_a_minute_per_kind() -> None:
    """A flood's refusals would otherwise be a flood of log lines."""
    events: list[dict[str, Any]] = []
    factory, clock = listener(ConnectionCounts(per_source=1))
    factory.log = Logger(observer=cast(ILogObserver, events.append))
    connected(factory, v4("10.0.0.1"))
    for _ in range(100):
        assert factory.buildProtocol(v4("10.0.0.1")) is None
    assert [(e["source"], e["why"]) for e in events] == [("10.0.0.1", "per-source")]
    # (The silent connection is closed meanwhile: another one takes its place.)
    clock.advance(factory.REFUSALS_LOGGED_EVERY)
    connected(factory, v4("10.0.0.1"))
    assert factory.buildProtocol(v4("10.0.0.1")) is None
    assert len(events) == 2


def _fleet() -> Fleet:
    return Fleet(
        60.0,
        {"llamacpp": FacadeSpec(0, ()), "ollama": FacadeSpec(0, ())},
        (FleetNode("n", {"llamacpp": "http://127.0.0.1:9", "ollama": "http://127.0.0.1:9"}),),
    )


def test_fleet_mode_shares_one_count_across_ports_with_a_quarter_of_the_limit_in_reserve(
    tmp_path: Path,
) -> None:
    """Every facade port counts into one process-wide count, whose capacity is set from the
    open-files limit once the process has raised it; broker mode has none."""
    root = build(MemoryReactorClock(), Config(state_dir=tmp_path, fleet=_fleet()))
    assert root.bounds is not None and root.bounds.capacity is None
    root.startService()
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert root.bounds.capacity == lan_capacity(soft)
        factories = [live.factory for live in root.facades.facades.values()]
        assert len(factories) == 2 and all(f.bounds is root.bounds for f in factories)
    finally:
        root.stopService()
    broker = build(MemoryReactorClock(), Config(state_dir=tmp_path / "broker"))
    assert broker.bounds is None
