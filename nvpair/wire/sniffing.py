"""One port, two personalities: the connection's first byte decides (docs/cluster.md).

``0x16`` (a TLS handshake record) is the cluster personality — mutual TLS with pinned peers,
whose requests go straight to the local engine — and, in fleet mode with ``[access]`` TLS, LAN
callers over TLS (:mod:`nvpair.wire.lantls`). Anything else is plaintext HTTP for local clients,
gated to loopback (and ``[access]``'s networks) by the facade. The chosen protocol gets the
real transport (so FacadeChannel sets TCP_NODELAY and registers itself as the transport's
producer) and the byte that was read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
)
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.wire.cluster import Membership

if TYPE_CHECKING:
    from OpenSSL import SSL
    from twisted.protocols.tls import TLSMemoryBIOFactory

#: A connection that says nothing for this long is closed before it is given a personality.
SNIFF_TIMEOUT = 10.0

_TLS_HANDSHAKE = 0x16


class Held(Protocol):
    """A new connection held until something about it is known, within ``timeout`` seconds
    (else aborted), then handed to a delegate with the real transport."""

    def __init__(self, clock: IReactorTime, timeout: float, address: IAddress) -> None:
        self._clock = clock
        self._timeout = timeout
        self._address = address
        self._delegate: IProtocol | None = None
        self._timer: IDelayedCall | None = None

    def connectionMade(self) -> None:
        self._timer = self._clock.callLater(self._timeout, self._too_slow)

    def _too_slow(self) -> None:
        self._timer = None
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def hand_over(self, delegate: IProtocol | None) -> bool:
        """Give the connection to ``delegate`` (None: close it); whether it was given."""
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        transport = self.transport
        assert transport is not None
        if delegate is None:
            transport.loseConnection()
            return False
        self._delegate = delegate
        delegate.makeConnection(transport)
        return True

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._delegate is not None:
            self._delegate.connectionLost(reason)


class _Sniffer(Held):
    """Holds a new connection until its first byte, then hands it to a delegate."""

    log = Logger()

    def __init__(self, factory: SniffingFactory, address: IAddress) -> None:
        super().__init__(factory.clock, factory.timeout, address)
        self._factory = factory

    def dataReceived(self, data: bytes) -> None:
        if self._delegate is not None:
            self._delegate.dataReceived(data)
            return
        if not data:
            return
        if data[0] == _TLS_HANDSHAKE:
            delegate = self._factory.tls_protocol(self._address)
        else:
            delegate = self._factory.plain.buildProtocol(self._address)
        if self.hand_over(delegate):
            assert delegate is not None
            delegate.dataReceived(data)


class SniffingFactory(ServerFactory):
    """The listening factory of a facade port.

    :param plain: the plaintext site (loopback clients, and listed LAN callers in fleet mode).
    :param peer: the site for pinned peers (local backend only), wrapped in TLS per connection.
    :param membership: the live membership; None means the TLS personality is off.
    :param lan: the site for LAN callers over TLS (fleet mode's ``[access]``).
    :param lan_tls: their live TLS context (None: no TLS for LAN callers now).
    """

    noisy = False

    def __init__(
        self,
        clock: IReactorTime,
        plain: IProtocolFactory,
        peer: IProtocolFactory,
        membership: Callable[[], Membership | None],
        timeout: float = SNIFF_TIMEOUT,
        *,
        lan: IProtocolFactory | None = None,
        lan_tls: Callable[[], SSL.Context | None] = lambda: None,
    ) -> None:
        self.clock = clock
        self.plain = plain
        self.timeout = timeout
        self._membership = membership
        self._peer = peer
        self._lan = lan
        self._lan_tls = lan_tls
        # Built for the first peer: only a member speaks TLS, and a node that is none never
        # loads pyOpenSSL (docs/performance.md#memory).
        self._tls: TLSMemoryBIOFactory | None = None
        self._gateway: TLSMemoryBIOFactory | None = None

    def buildProtocol(self, addr: IAddress | None) -> Protocol:
        assert addr is not None
        return _Sniffer(self, addr)

    def tls_protocol(self, address: IAddress) -> IProtocol | None:
        """A TLS server protocol for a peer or a LAN caller, or None when this node is no
        member and serves LAN callers no TLS."""
        if self._lan is not None and self._lan_tls() is not None:
            if self._gateway is None:
                from nvpair.wire.lantls import gateway_factory

                self._gateway = gateway_factory(
                    self.clock, self._peer, self._lan, self._membership, self._lan_tls
                )
            gateway: IProtocol | None = self._gateway.buildProtocol(address)
            return gateway
        if self._membership() is None:
            return None
        if self._tls is None:
            self._tls = _tls_factory(self.clock, self._peer, self._membership)
        protocol: IProtocol | None = self._tls.buildProtocol(address)
        return protocol


def _tls_factory(
    clock: IReactorTime, peer: IProtocolFactory, membership: Callable[[], Membership | None]
) -> TLSMemoryBIOFactory:
    from twisted.protocols.tls import TLSMemoryBIOFactory

    from nvpair.wire.tls import MemberServer

    return TLSMemoryBIOFactory(MemberServer(membership), False, peer, clock)
