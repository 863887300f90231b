"""One port, two personalities: the connection's first byte decides (docs/cluster.md).

``0x16`` (a TLS handshake record) is the cluster personality — mutual TLS with pinned peers,
whose requests go straight to the local engine — and, in fleet mode with ``[access]`` TLS, LAN
callers over TLS (:mod:`nvpair.wire.trust.lantls`). Anything else is plaintext HTTP for local
clients, gated to loopback (and ``[access]``'s networks) by the facade. The chosen protocol gets the
real transport (so FacadeChannel sets TCP_NODELAY and registers itself as the transport's
producer) and the byte that was read.

In fleet mode a connection from any address but loopback is counted from its accept
(:mod:`nvpair.wire.trust.connbounds`): one over its source's bound, or past the LAN's share of the
open-files limit, is closed at accept, and a first byte ``0x16`` past the bound on handshakes in
progress is closed before any TLS state is made (docs/robustness.md#connection-bounds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IAddress, IProtocol, IProtocolFactory, IReactorTime
from twisted.internet.protocol import Protocol, ServerFactory, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.common import trim
from nvpair.wire.trust.cluster import Membership
from nvpair.wire.trust.connbounds import ConnectionCounts, Refused, source_of
from nvpair.wire.trust.held import Held

if TYPE_CHECKING:
    from OpenSSL import SSL
    from twisted.protocols.tls import TLSMemoryBIOFactory

#: A connection that says nothing for this long is closed before it is given a personality.
SNIFF_TIMEOUT = 10.0

_TLS_HANDSHAKE = 0x16


class _Sniffer(Held):
    """Holds a new connection until its first byte, then hands it to a delegate.

    :param source: what the connection counts under in the factory's bounds (None: it is
        not counted).
    """

    def __init__(self, factory: SniffingFactory, address: IAddress, source: str | None) -> None:
        super().__init__(factory.clock, factory.timeout, address)
        self._factory = factory
        self._source = source
        self._handshaking = False

    def dataReceived(self, data: bytes) -> None:
        if self._delegate is not None:
            self._delegate.dataReceived(data)
            return
        if not data:
            return
        if data[0] == _TLS_HANDSHAKE:
            if not self._begin_handshake():
                return
            delegate = self._factory.tls_protocol(self._address, self._handshake_over)
        else:
            delegate = self._factory.plain.buildProtocol(self._address)
        if self.hand_over(delegate):
            assert delegate is not None
            delegate.dataReceived(data)

    def _begin_handshake(self) -> bool:
        """Count the handshake this connection starts, or close it before any TLS state is
        made: a ClientHello being answered holds some 64 KiB."""
        bounds = self._factory.bounds
        if self._source is None or bounds is None:
            return True
        if bounds.begin_handshake():
            self._handshaking = True
            return True
        self._factory.refused(Refused.HANDSHAKES, self._source)
        self.abort()
        return False

    def _handshake_over(self) -> None:
        if self._handshaking:
            self._handshaking = False
            bounds = self._factory.bounds
            assert bounds is not None
            if bounds.end_handshake():
                self._factory.burst_over()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._handshake_over()
        if self._source is not None:
            bounds = self._factory.bounds
            assert bounds is not None
            bounds.close(self._source)
            self._source = None
        super().connectionLost(reason)


class SniffingFactory(ServerFactory):
    """The listening factory of a facade port.

    :param plain: the plaintext site (loopback clients, and listed LAN callers in fleet mode).
    :param peer: the site for pinned peers (local backend only), wrapped in TLS per connection.
    :param membership: the live membership; None means the TLS personality is off.
    :param lan: the site for LAN callers over TLS (fleet mode's ``[access]``).
    :param lan_tls: their live TLS context (None: no TLS for LAN callers now).
    :param bounds: the process's count of connections from every address but loopback, shared
        by every facade port (fleet mode; None: no bound).
    :param give_back: gives what a burst of handshakes held back to the system, once it is
        over (:func:`nvpair.common.trim.give_back`).
    """

    noisy = False
    log = Logger()

    #: Seconds between two log lines about refused connections of one kind.
    REFUSALS_LOGGED_EVERY = 60.0

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
        bounds: ConnectionCounts | None = None,
        give_back: Callable[[], object] = trim.give_back,
    ) -> None:
        self.clock = clock
        self.bounds = bounds
        self._give_back = give_back
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
        #: When each kind of refusal was last logged.
        self._logged: dict[Refused, float] = {}

    def buildProtocol(self, addr: IAddress | None) -> Protocol | None:
        """A sniffer for the connection, or None to close it at accept (Twisted's listener
        closes the socket at once, so a refused connection never holds a descriptor)."""
        assert addr is not None
        source = None
        bounds = self.bounds
        if bounds is not None and isinstance(addr, IPv4Address | IPv6Address):
            source = source_of(addr.host)
            if source is not None:
                refused = bounds.open(source)
                if refused is not None:
                    self.refused(refused, source)
                    return None
        return _Sniffer(self, addr, source)

    def refused(self, why: Refused, source: str) -> None:
        """Say that connections are refused, once a minute per kind at most (on this port): a
        flood's refusals would otherwise flood the log."""
        now = self.clock.seconds()
        last = self._logged.get(why)
        if last is not None and now - last < self.REFUSALS_LOGGED_EVERY:
            return
        self._logged[why] = now
        bounds = self.bounds
        assert bounds is not None
        self.log.warn(
            "connection from {source} closed unanswered ({why}); {connections} connections "
            "from addresses other than loopback, {handshakes} handshakes in progress",
            source=source,
            why=why.value,
            connections=bounds.connections,
            handshakes=bounds.handshakes,
        )

    def burst_over(self) -> None:
        """The last handshake of a burst is done or lost. What a flood's handshakes held waits
        for the cyclic collector, then stays in the C heap (+20 MiB after 256 unfinished ones):
        given back once this connection's own state is freed too."""
        self.log.debug("a burst of TLS handshakes is over: freed memory given back")
        self.clock.callLater(0, self._give_back)

    def tls_protocol(
        self, address: IAddress, handshake_done: Callable[[], None] = lambda: None
    ) -> IProtocol | None:
        """A TLS server protocol for a peer or a LAN caller, or None when this node is no
        member and serves LAN callers no TLS.

        :param handshake_done: called once the handshake is done.
        """
        if self._lan is not None and self._lan_tls() is not None:
            from nvpair.wire.trust.lantls import gateway_factory, handshaking

            if self._gateway is None:
                self._gateway = gateway_factory(
                    self.clock, self._peer, self._lan, self._membership, self._lan_tls
                )
            return handshaking(self._gateway, address, handshake_done)
        if self._membership() is None:
            return None
        from nvpair.wire.trust.lantls import handshaking, member_factory

        if self._tls is None:
            self._tls = member_factory(self.clock, self._peer, self._membership)
        return handshaking(self._tls, address, handshake_done)
