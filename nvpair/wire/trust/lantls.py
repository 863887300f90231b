"""TLS on a facade's own port: for LAN callers beside the pinned-peer personality
(docs/lan.md#tls, docs/cluster.md#one-port-two-personalities), and the handshake every TLS
connection, a peer's too, must finish within :data:`HANDSHAKE_TIMEOUT`.

With ``[access]``'s ``tls-cert`` and ``tls-key``, a TLS connection whose client presents no
certificate, or one that matches no pin, is a LAN caller: it gets this certificate, and its
requests go through the facade under the same networks and key rules as plaintext. A client
certificate that matches a pin is a cluster peer exactly as before.

One handshake can show one certificate, chosen before the client shows its own. A node that
is no cluster member shows the LAN certificate to everyone. A member shows it to a client that
names a server (SNI: a LAN client asked for a host name) and its cluster certificate to one
that names none, as peers do, asking that one for its certificate; which site then serves the
connection is decided when the handshake is done (:class:`Sorter`).

A node that serves LAN callers no TLS shows its cluster certificate and completes a handshake
only with a pinned peer (:class:`nvpair.wire.trust.tls.MemberServer`); a :class:`Sorter` still holds
the connection until then, so a handshake left unfinished is closed in time there too.
"""

from __future__ import annotations

from collections.abc import Callable

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import (
    IAddress,
    IHandshakeListener,
    IOpenSSLServerConnectionCreator,
    IProtocolFactory,
    IReactorTime,
)
from twisted.internet.protocol import Factory
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer

from nvpair.wire.trust.cluster import Membership
from nvpair.wire.trust.held import Held
from nvpair.wire.trust.tls import MemberServer, server_context

#: A handshake not done this long after its first byte closes the connection: a TLS state
#: waits on it (docs/robustness.md#connection-bounds).
HANDSHAKE_TIMEOUT = 5.0


def lan_context(cert_pem: bytes, key_pem: bytes) -> SSL.Context:
    """The server context LAN callers get: the certificate (PEM, its chain after it) and its
    key; no client certificate asked for (a browser would offer the user a choice of them)."""
    context = SSL.Context(SSL.TLS_SERVER_METHOD)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    chain = x509.load_pem_x509_certificates(cert_pem)
    context.use_certificate(chain[0])
    for certificate in chain[1:]:
        context.add_extra_chain_cert(certificate)
    key = serialization.load_pem_private_key(key_pem, password=None)
    context.use_privatekey(key)  # type: ignore[arg-type]
    context.check_privatekey()
    return context


def _any_certificate(
    connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int
) -> bool:
    # The handshake admits every client; its certificate is judged against the pins after it.
    return True


def _open_member_context(membership: Membership, lan: SSL.Context) -> SSL.Context:
    """The cluster certificate, a client certificate asked for but not required; a client
    that names a server is handed the LAN context instead."""
    context = server_context(membership)
    context.set_verify(SSL.VERIFY_PEER, _any_certificate)

    def named(connection: SSL.Connection) -> None:
        if connection.get_servername() is not None:
            connection.set_context(lan)
            connection.set_verify(SSL.VERIFY_NONE, _any_certificate)

    context.set_tlsext_servername_callback(named)
    return context


@implementer(IOpenSSLServerConnectionCreator)
class GatewayServer:
    """Per-connection server TLS from the live membership and LAN context, each read per
    connection.

    :param lan: the LAN callers' context (None: TLS for peers only, as
        :class:`nvpair.wire.trust.tls.MemberServer` serves it).
    """

    def __init__(
        self,
        membership: Callable[[], Membership | None],
        lan: Callable[[], SSL.Context | None],
    ) -> None:
        self._membership = membership
        self._lan = lan
        #: The member context last made, and the membership and LAN context it was made from.
        self._member: SSL.Context | None = None
        self._made_for: Membership | None = None
        self._made_with: SSL.Context | None = None

    def _context(self) -> SSL.Context:
        membership, lan = self._membership(), self._lan()
        if lan is None:
            raise SSL.Error("no TLS for LAN callers")
        if membership is None:
            return lan
        context = self._member
        if context is None or self._made_for is not membership or self._made_with is not lan:
            context = self._member = _open_member_context(membership, lan)
            self._made_for, self._made_with = membership, lan
        return context

    def serverConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        connection = SSL.Connection(self._context(), None)
        connection.set_app_data(tlsProtocol)
        connection.set_accept_state()
        return connection


@implementer(IHandshakeListener)
class Sorter(Held):
    """A TLS connection until its handshake is done, then the pinned peers' site or the LAN
    callers' site, by the client's certificate.

    :param done: told once the handshake is done (the listener's count of handshakes in
        progress).
    """

    def __init__(
        self, factory: SorterFactory, address: IAddress, done: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__(factory.clock, factory.timeout, address)
        self._factory = factory
        self._done = done

    def handshakeCompleted(self) -> None:
        self._done()
        transport = self.transport
        peer_certificate = getattr(transport, "getPeerCertificate", None)
        certificate = peer_certificate() if peer_certificate is not None else None
        membership = self._factory.membership()
        pinned = (
            certificate is not None
            and membership is not None
            and membership.pinned(certificate) is not None
        )
        site = self._factory.peer if pinned else self._factory.lan
        self.hand_over(None if site is None else site.buildProtocol(self._address))

    def dataReceived(self, data: bytes) -> None:
        # Application data comes only after the handshake, so a delegate is there.
        if self._delegate is not None:
            self._delegate.dataReceived(data)


class SorterFactory(Factory):
    """Builds a :class:`Sorter` per TLS connection.

    :param lan: the LAN callers' site (None: a client that is no pinned peer is closed).
    """

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        peer: IProtocolFactory,
        lan: IProtocolFactory | None,
        membership: Callable[[], Membership | None],
        timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self.clock = clock
        self.peer = peer
        self.lan = lan
        self.membership = membership
        self.timeout = timeout

    def buildProtocol(self, addr: IAddress | None) -> Sorter:
        assert addr is not None
        return Sorter(self, addr)


def handshaking(
    factory: TLSMemoryBIOFactory, address: IAddress, done: Callable[[], None]
) -> TLSMemoryBIOProtocol:
    """A TLS connection of ``factory`` (one of this module's) whose :class:`Sorter` tells
    ``done`` when its handshake is done: what ``factory.buildProtocol`` makes, with ``done``."""
    sorters = factory.wrappedFactory
    assert isinstance(sorters, SorterFactory)
    return factory.protocol(factory, Sorter(sorters, address, done))


def gateway_factory(
    clock: IReactorTime,
    peer: IProtocolFactory,
    lan: IProtocolFactory,
    membership: Callable[[], Membership | None],
    lan_context: Callable[[], SSL.Context | None],
) -> TLSMemoryBIOFactory:
    """The TLS personality of a facade port that also serves LAN callers."""
    return TLSMemoryBIOFactory(
        GatewayServer(membership, lan_context),
        False,
        SorterFactory(clock, peer, lan, membership),
        clock,
    )


def member_factory(
    clock: IReactorTime, peer: IProtocolFactory, membership: Callable[[], Membership | None]
) -> TLSMemoryBIOFactory:
    """The TLS personality of a member's facade port that serves LAN callers no TLS: pinned
    peers only."""
    return TLSMemoryBIOFactory(
        MemberServer(membership), False, SorterFactory(clock, peer, None, membership), clock
    )
