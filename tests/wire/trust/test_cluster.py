"""Cluster directory, pinning and first-byte sniffing, in memory (docs/cluster.md; issue 6).

TLS runs for real (OpenSSL through TLSMemoryBIO) over iosim's in-memory transports; the
server, the client and the pump share one Clock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from OpenSSL import SSL
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.test.iosim import connectedServerAndClient

from nvpair.wire.trust.cluster import (
    ClusterDirError,
    ClusterWatch,
    Membership,
    load_membership,
)
from nvpair.wire.trust.sniffing import SniffingFactory
from nvpair.wire.trust.tls import PinnedPeers
from tests.certs import NodeIdentity, make_identity, write_cluster_dir

ALICE, BOB, MALLORY = make_identity("alice"), make_identity("bob"), make_identity("mallory")
PEER = IPv4Address("TCP", "10.0.0.7", 40000)


# -- the directory ------------------------------------------------------------------------


def test_no_membership_file_means_not_a_member(tmp_path: Path) -> None:
    assert load_membership(tmp_path) is None


def test_member_with_pins(tmp_path: Path) -> None:
    write_cluster_dir(tmp_path, ALICE, [BOB])
    (tmp_path / "pins" / "broken.pin").write_text("md5:abc")
    membership = load_membership(tmp_path)
    assert membership is not None
    assert (membership.cluster_id, membership.node_id) == ("c1", "alice")
    assert dict(membership.pins) == {"bob": BOB.pin}


@pytest.mark.parametrize("damage", ["membership", "key"])
def test_unusable_membership_is_an_error(tmp_path: Path, damage: str) -> None:
    write_cluster_dir(tmp_path, ALICE, [BOB])
    if damage == "membership":
        (tmp_path / "membership.json").write_text('{"clusterId": 5}')
    else:
        (tmp_path / "node.key").write_text("not a key")
    with pytest.raises(ClusterDirError):
        load_membership(tmp_path)


def test_a_deeply_nested_membership_file_is_unusable_and_the_watch_goes_on(
    tmp_path: Path,
) -> None:
    """``[[[[...`` used to raise RecursionError out of the watcher's check, which stopped the
    re-reading for good: the membership written next was never seen."""
    write_cluster_dir(tmp_path, ALICE, [BOB])
    (tmp_path / "membership.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ClusterDirError, match="nested too deeply"):
        load_membership(tmp_path)
    clock = Clock()
    changes: list[Membership | None] = []
    watch = ClusterWatch(clock, tmp_path, changes.append)
    watch.start()
    assert watch.membership is None
    write_cluster_dir(tmp_path, ALICE, [BOB])
    os.utime(tmp_path / "membership.json", (1, 1))
    clock.advance(1)
    assert [None if m is None else dict(m.pins) for m in changes] == [{"bob": BOB.pin}]
    watch.stop()


def test_watch_follows_joining_and_leaving(tmp_path: Path) -> None:
    clock = Clock()
    changes: list[Membership | None] = []
    watch = ClusterWatch(clock, tmp_path, changes.append)
    watch.start()

    def pins() -> set[str] | None:
        membership = watch.membership
        return None if membership is None else set(membership.pins)

    assert pins() is None
    write_cluster_dir(tmp_path, ALICE, [BOB])
    clock.advance(1)
    assert pins() == {"bob"}
    (tmp_path / "pins" / "mallory.pin").write_text(MALLORY.pin)
    os.utime(tmp_path / "pins" / "mallory.pin", (1, 1))
    clock.advance(1)
    assert pins() == {"bob", "mallory"}
    (tmp_path / "membership.json").unlink()
    clock.advance(1)
    assert pins() is None
    assert [m is not None for m in changes] == [True, True, False]
    watch.stop()


# -- TLS in memory ------------------------------------------------------------------------


class Echo(Protocol):
    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"echo:" + data)


class Recorder(Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.lost = False

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(b"hello")

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True


class Plain(Protocol):
    transports: list[object] = []

    def connectionMade(self) -> None:
        Plain.transports.append(self.transport)

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"plain:" + data)


def member(me: NodeIdentity, peers: list[NodeIdentity], tmp_path: Path) -> Membership:
    membership = load_membership(write_cluster_dir(tmp_path / me.node_id, me, peers))
    assert membership is not None
    return membership


def connect(
    server_membership: Membership | None,
    client: Membership,
    expect_server: str,
    clock: Clock,
) -> tuple[Recorder, Any]:
    """A TLS client (as a peer dials) against a facade's sniffing port."""
    sniffing = SniffingFactory(
        clock,
        Factory.forProtocol(Plain),
        Factory.forProtocol(Echo),
        lambda: server_membership,
    )
    recorder = Recorder()
    policy = PinnedPeers(lambda: client, lambda host, port: expect_server)
    client_factory = TLSMemoryBIOFactory(
        policy.creatorForNetloc(b"10.0.0.1", 11434),
        True,
        Factory.forProtocol(lambda: recorder),
        clock,
    )
    _, _, pump = connectedServerAndClient(
        lambda: sniffing.buildProtocol(PEER),
        lambda: client_factory.buildProtocol(PEER),
        clock=clock,
    )
    pump.flush()
    return recorder, pump


def test_pinned_peer_completes_the_handshake(tmp_path: Path) -> None:
    clock = Clock()
    alice = member(ALICE, [BOB], tmp_path)
    bob = member(BOB, [ALICE], tmp_path)
    recorder, _ = connect(alice, bob, "alice", clock)
    assert recorder.received == b"echo:hello"


def test_unpinned_client_is_refused_at_the_handshake(tmp_path: Path) -> None:
    clock = Clock()
    alice = member(ALICE, [BOB], tmp_path)
    mallory = member(MALLORY, [ALICE], tmp_path)
    recorder, _ = connect(alice, mallory, "alice", clock)
    assert recorder.received == b"" and recorder.lost


def test_server_not_matching_the_dialled_nodes_pin_fails(tmp_path: Path) -> None:
    """Dialling node "alice" but reaching a certificate pinned for someone else fails."""
    clock = Clock()
    mallory_server = member(MALLORY, [BOB], tmp_path)
    bob = member(BOB, [ALICE, MALLORY], tmp_path)
    recorder, _ = connect(mallory_server, bob, "alice", clock)
    assert recorder.received == b"" and recorder.lost


def test_tls_to_a_non_member_is_closed(tmp_path: Path) -> None:
    clock = Clock()
    bob = member(BOB, [ALICE], tmp_path)
    recorder, _ = connect(None, bob, "alice", clock)
    assert recorder.received == b"" and recorder.lost


def test_plaintext_goes_to_the_plain_personality() -> None:
    clock = Clock()
    sniffing = SniffingFactory(
        clock, Factory.forProtocol(Plain), Factory.forProtocol(Echo), lambda: None
    )

    class Hello(Recorder):
        pass

    hello = Hello()
    _, server, pump = connectedServerAndClient(
        lambda: sniffing.buildProtocol(PEER), lambda: hello, clock=clock
    )
    pump.flush()
    assert hello.received == b"plain:hello"
    # The delegate got the real transport (TCP_NODELAY, producers), not a wrapper.
    assert Plain.transports[-1] is server.transport  # type: ignore[union-attr]


def test_a_silent_connection_is_closed_after_the_sniff_timeout() -> None:
    clock = Clock()
    sniffing = SniffingFactory(
        clock, Factory.forProtocol(Plain), Factory.forProtocol(Echo), lambda: None, timeout=10
    )

    class Silent(Protocol):
        lost = False

        def connectionLost(self, reason: Any = None) -> None:
            Silent.lost = True

    _, _, pump = connectedServerAndClient(lambda: sniffing.buildProtocol(PEER), Silent, clock=clock)
    pump.flush()
    clock.advance(9)
    pump.flush()
    assert not Silent.lost
    clock.advance(2)
    pump.flush()
    assert Silent.lost


def test_policy_refuses_to_dial_when_not_a_member() -> None:
    policy = PinnedPeers(lambda: None, lambda host, port: "alice")
    with pytest.raises(SSL.Error):
        policy.creatorForNetloc(b"10.0.0.1", 11434)
