"""TLS for the cluster personality, built on the membership: pins replace certificate chains.

Inbound, a facade port completes a handshake only for a client certificate that matches a pin
(:class:`MemberServer`). Outbound, a peer is dialled with this node's certificate and must
present the pin of the node its address belongs to (:class:`PinnedPeers`). Hostname
verification means nothing on a LAN of node ids; the pinned certificate is the identity
(docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from OpenSSL import SSL, crypto
from twisted.internet.interfaces import (
    IOpenSSLClientConnectionCreator,
    IOpenSSLServerConnectionCreator,
)
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from nvpair.wire.trust.cluster import Membership, certificate_fingerprint

if TYPE_CHECKING:
    from twisted.protocols.tls import TLSMemoryBIOProtocol


def _context(membership: Membership, verify: Callable[..., bool], server: bool) -> SSL.Context:
    method = SSL.TLS_SERVER_METHOD if server else SSL.TLS_CLIENT_METHOD
    context = SSL.Context(method)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.use_certificate(membership.certificate)
    context.use_privatekey(membership.key)
    context.check_privatekey()
    mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if server else 0)
    context.set_verify(mode, verify)
    return context


def server_context(membership: Membership) -> SSL.Context:
    """A server context that completes the handshake only for a pinned client certificate.

    Pins replace chains: OpenSSL's own verdict (a self-signed certificate is an error to it)
    is overridden by the exact fingerprint comparison on the leaf.
    """

    def verify(
        connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int
    ) -> bool:
        if depth != 0:
            return True
        return membership.pinned(certificate) is not None

    return _context(membership, verify, server=True)


@implementer(IOpenSSLClientConnectionCreator)
class _PinnedClient:
    def __init__(self, context: SSL.Context) -> None:
        self._context = context

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        connection = SSL.Connection(self._context, None)
        connection.set_app_data(tlsProtocol)
        connection.set_connect_state()
        return connection


@implementer(IPolicyForHTTPS)
class PinnedPeers:
    """Outbound TLS to peers: present this node's certificate, require the peer's pin.

    Hostname verification means nothing on a LAN of node ids; what identifies a peer is its
    pinned certificate. The node a ``host:port`` belongs to comes from discovery (each
    ``https://`` node URL), so a certificate that does not match *that* node's pin fails the
    handshake — a transport failure the loop fails over from.

    :param membership: the live membership (None: not a member, no peer can be dialled).
    :param node_for: ``(host, port) -> node id`` from the current discovery snapshots.
    """

    def __init__(
        self,
        membership: Callable[[], Membership | None],
        node_for: Callable[[str, int], str | None],
    ) -> None:
        self._membership = membership
        self._node_for = node_for
        # (host, port) -> (membership, expected pin, creator): building an SSL context per
        # request would cost more than the request; it is rebuilt when either input changes.
        self._creators: dict[
            tuple[str, int], tuple[Membership, str | None, IOpenSSLClientConnectionCreator]
        ] = {}

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        host = hostname.decode("ascii")
        membership = self._membership()
        if membership is None:
            raise SSL.Error("not a cluster member: cannot dial a peer")
        node_id = self._node_for(host, port)
        expected = membership.pins.get(node_id) if node_id is not None else None
        cached = self._creators.get((host, port))
        if cached is not None:
            made_for, pinned, made = cached
            if made_for is membership and pinned == expected:
                return made

        def verify(
            connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int
        ) -> bool:
            if depth != 0:
                return True
            return expected is not None and certificate_fingerprint(certificate) == expected

        creator = _PinnedClient(_context(membership, verify, server=False))
        self._creators[(host, port)] = (membership, expected, creator)
        return creator


@implementer(IOpenSSLServerConnectionCreator)
class MemberServer:
    """Per-connection server TLS from the live membership (checked per connection)."""

    def __init__(self, membership: Callable[[], Membership | None]) -> None:
        self._membership = membership
        #: The context last made, and the membership it was made from.
        self._made_for: Membership | None = None
        self._context: SSL.Context | None = None

    def serverConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        membership = self._membership()
        if membership is None:
            raise SSL.Error("not a cluster member")
        context = self._context
        if context is None or self._made_for is not membership:
            context = self._context = server_context(membership)
            self._made_for = membership
        connection = SSL.Connection(context, None)
        connection.set_app_data(tlsProtocol)
        connection.set_accept_state()
        return connection
