"""A facade port's two personalities, each its own gate: pinned cluster peers
(:class:`PeerFacade`) and loopback/LAN callers (:class:`Facade`), and the null collaborators a
facade holds where a mode has none (docs/cluster.md, docs/lan.md#who-may-call)."""

from __future__ import annotations

import json
from pathlib import Path

from OpenSSL import crypto
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import capturedLogs

from nvpair.engines.table import OLLAMA, RouteClass
from nvpair.facades.access import NO_ACCESS_LOG, NO_REFUSALS, AccessLog, Finished
from nvpair.facades.facade import FORBIDDEN, LOOPBACK_ONLY, Facade, no_prefix
from nvpair.facades.peer import PeerFacade
from nvpair.wire.message import Fields
from nvpair.wire.server.site import FacadeSite, Gate
from nvpair.wire.trust.cluster import Membership, load_membership
from tests.certs import NodeIdentity, make_identity, write_cluster_dir
from tests.test_facade_http import Broken, split

ALICE, BOB, MALLORY = make_identity("alice"), make_identity("bob"), make_identity("mallory")
HOME = IPv4Address("TCP", "192.168.1.7", 40000)
LOOPBACK = IPv4Address("TCP", "127.0.0.1", 40000)
GENERATE = json.dumps({"model": "llama3", "prompt": "x"}).encode()


class Counted:
    """A refusal counter that keeps what it was told."""

    def __init__(self) -> None:
        self.refused: list[tuple[str, str, str]] = []

    def request_refused(self, engine: str, route: str, outcome: str) -> None:
        self.refused.append((engine, route, outcome))


class PinnedTransport(StringTransport):
    """A TLS transport after its handshake, as the facade reads it: the peer's certificate."""

    def __init__(self, identity: NodeIdentity) -> None:
        super().__init__(peerAddress=HOME)
        self._certificate = crypto.load_certificate(crypto.FILETYPE_PEM, identity.cert_pem)

    def getPeerCertificate(self) -> crypto.X509:
        return self._certificate


def request(method: str, path: str, *, host: str = "localhost", body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def talk(gate: Gate, raw: bytes, transport: StringTransport, cap: int = 1000) -> bytes:
    protocol = FacadeSite(gate, cap).buildProtocol(transport.getPeer())
    assert protocol is not None
    protocol.makeConnection(transport)
    protocol.dataReceived(raw)
    return bytes(transport.value())


def membership(tmp_path: Path) -> Membership:
    """This node is alice, and bob is pinned."""
    found = load_membership(write_cluster_dir(tmp_path / "alice", ALICE, [BOB]))
    assert found is not None
    return found


def test_a_pinned_peer_is_served_as_peer_with_no_loopback_gate_or_host_guard(
    tmp_path: Path,
) -> None:
    """A peer's request was judged by the node that sent it (docs/cluster.md#peer-requests):
    from a LAN address, naming this machine as it likes, it goes to the local engine as
    ``peer``, its body unread."""
    handler, cluster = Broken(), membership(tmp_path)
    raw = request("POST", "/api/generate", host="rebind.example.com", body=GENERATE)
    status, _, _ = split(
        talk(PeerFacade(OLLAMA, handler, lambda: cluster), raw, PinnedTransport(BOB))
    )
    assert status == "HTTP/1.1 200 OK"
    (admitted,) = handler.seen
    assert admitted.route is RouteClass.PEER and admitted.path == "/api/generate"
    assert admitted.model is None and admitted.caller is None and admitted.body == GENERATE
    assert admitted.client == HOME.host


def test_an_unpinned_peer_or_one_after_this_node_left_is_dropped(tmp_path: Path) -> None:
    """Pins and membership are checked per request (docs/cluster.md#inbound-pinned-mutual-tls):
    nothing is answered, the connection is dropped, and the request path never sees it."""
    handler, cluster = Broken(), membership(tmp_path)
    stranger = PinnedTransport(MALLORY)
    talk(PeerFacade(OLLAMA, handler, lambda: cluster), request("GET", "/api/tags"), stranger)
    left = PinnedTransport(BOB)
    talk(PeerFacade(OLLAMA, handler, lambda: None), request("GET", "/api/tags"), left)
    assert stranger.disconnecting and left.disconnecting
    assert stranger.value() == b"" and left.value() == b""
    assert handler.seen == []


def test_a_peer_facades_refusals_are_counted_as_peer_routes(tmp_path: Path) -> None:
    """A body over the cap, refused by the wire in the facade's words, counts under ``peer``
    (docs/operations.md#metrics)."""
    counted, cluster = Counted(), membership(tmp_path)
    peer = PeerFacade(OLLAMA, Broken(), lambda: cluster, refusals=counted)
    answer = talk(peer, request("POST", "/api/generate", body=GENERATE), PinnedTransport(BOB), 8)
    assert split(answer)[0] == "HTTP/1.1 413 Request Entity Too Large"
    assert [route for _, route, _ in counted.refused] == ["peer"]


def lan_status(facade: Facade, peer: IPv4Address) -> str:
    transport = StringTransport(peerAddress=peer)
    return split(talk(facade, request("POST", "/api/generate", body=GENERATE), transport))[0]


def test_without_access_a_non_loopback_caller_is_forbidden_and_loopback_served() -> None:
    """Without fleet mode's ``[access]`` only loopback callers are served, whether the gate is
    left out or :data:`LOOPBACK_ONLY` is given."""
    handler = Broken()
    for facade in (Facade(OLLAMA, handler), Facade(OLLAMA, handler, lan=LOOPBACK_ONLY)):
        assert lan_status(facade, HOME) == "HTTP/1.1 403 Forbidden"
        assert lan_status(facade, LOOPBACK) == "HTTP/1.1 200 OK"
    assert [(a.route, a.model, a.caller) for a in handler.seen] == [
        (RouteClass.INFERENCE, "llama3", None),
    ] * 2


def test_the_loopback_only_gate_forbids_every_caller_but_loopback() -> None:
    """As the loopback gate before ``[access]`` existed: no key asked, nobody named, no TLS."""
    headers = Fields.of({b"host": [b"localhost"]})
    assert LOOPBACK_ONLY.refusal(HOME, headers) is FORBIDDEN
    assert LOOPBACK_ONLY.refusal(HOME, headers, preflight=True, tls=True) is FORBIDDEN
    assert LOOPBACK_ONLY.refusal(LOOPBACK, headers) is None
    assert LOOPBACK_ONLY.caller(HOME, headers) is None
    assert LOOPBACK_ONLY.caller(LOOPBACK, headers) is None
    assert LOOPBACK_ONLY.tls is None


def test_the_null_access_log_and_counter_do_nothing() -> None:
    finished = Finished(engine="ollama", method="GET", path="/api/tags", status=403)
    with capturedLogs() as written:
        NO_ACCESS_LOG.write(finished)
        NO_REFUSALS.request_refused("ollama", "inventory", "forbidden")
    assert written == []
    with capturedLogs() as written:
        AccessLog().write(finished)
    assert len(written) == 1
    assert no_prefix({"messages": [{"role": "user", "content": "x"}]}) == ()


def test_a_facade_without_affinity_gives_no_prefix_and_one_with_it_asks_it(
    tmp_path: Path,
) -> None:
    """Affinity's prefix keys are asked of inference bodies only, where fleet mode wants them
    (docs/fleet-scheduling.md#conversations-go-where-their-cache-is)."""
    asked: list[object] = []

    def prefix_of(document: object) -> tuple[int, ...]:
        asked.append(document)
        return (7,)

    handler = Broken()
    lan_status(Facade(OLLAMA, handler), LOOPBACK)
    affine = Facade(OLLAMA, handler, prefix_of=prefix_of)
    lan_status(affine, LOOPBACK)
    talk(affine, request("GET", "/api/tags"), StringTransport(peerAddress=LOOPBACK))
    assert [a.prefix for a in handler.seen] == [(), (7,), ()]
    assert asked == [json.loads(GENERATE)]
