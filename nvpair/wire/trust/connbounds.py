"""How many connections callers other than loopback may hold, decided from the source address
alone, before anything else is known of the caller (docs/robustness.md#connection-bounds).

Values in, values out: no reactor, no socket. The listening factory
(:mod:`nvpair.wire.trust.sniffing`) asks :class:`ConnectionCounts` at each accept and at each TLS
handshake's first byte, and tells it when either ends.

- A **source** is an IPv4 address, or the /64 of an IPv6 address: one host takes addresses
  from its /64 at will (privacy addresses), so a bound per IPv6 address would bound nothing.
  An IPv4-mapped IPv6 address (a dual-stack listener's view of an IPv4 peer) is its IPv4
  address. Loopback is no source: it is never counted, never refused.
- At most :data:`PER_SOURCE` connections per source, at most :data:`HANDSHAKES` TLS handshakes
  in progress, and at most ``capacity`` connections from every source together: the rest of the
  process's open-files limit (:func:`lan_capacity`) is a reserve that loopback callers and the
  proxy's own engine connections keep through any flood.
"""

from __future__ import annotations

import enum
import functools
import ipaddress

#: Open connections one source may hold.
PER_SOURCE = 64

#: TLS handshakes in progress at once, from every source together.
HANDSHAKES = 256

#: Handshakes in progress at once that make a burst: once none is left in progress, the memory
#: they held is worth giving back (:meth:`ConnectionCounts.end_handshake`).
BURST = 64

#: The share of the open-files limit kept for loopback callers and engine connections: one
#: quarter (256 of the usual 1,024; 131,072 of a raised 524,288).
RESERVE_SHARE = 4


class Refused(enum.Enum):
    """Why a connection was closed at accept (or at its first TLS byte)."""

    #: Its source holds :data:`PER_SOURCE` connections already.
    SOURCE = "per-source"
    #: The connections of every source fill their share of the open-files limit.
    RESERVE = "reserve"
    #: :data:`HANDSHAKES` handshakes are in progress.
    HANDSHAKES = "handshakes"


@functools.lru_cache(maxsize=4096)
def source_of(host: str) -> str | None:
    """The source a connection from ``host`` counts under: its IPv4 address, its IPv6
    address's /64 (``2001:db8:1:2::/64``), or None for loopback. Text that is no address (it
    never comes from a TCP listener) is a source of its own."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return None
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def lan_capacity(limit: int) -> int | None:
    """The connections every source together may hold under an open-files limit of ``limit``
    (None: unlimited, for a limit that is none)."""
    if limit < 0:
        return None
    return limit - limit // RESERVE_SHARE


class ConnectionCounts:
    """The open connections and handshakes in progress of every source.

    :param capacity: connections every source together may hold (None: no bound), usually
        :func:`lan_capacity` of the open-files limit, known once the process has raised it.
    """

    def __init__(
        self,
        capacity: int | None = None,
        per_source: int = PER_SOURCE,
        handshakes: int = HANDSHAKES,
    ) -> None:
        self.capacity = capacity
        self._per_source = per_source
        self._handshake_bound = handshakes
        self._open: dict[str, int] = {}
        #: Connections open, every source together.
        self.connections = 0
        #: TLS handshakes begun and not yet done or lost.
        self.handshakes = 0
        #: The most handshakes in progress at once since none was.
        self._most = 0

    def held_by(self, source: str) -> int:
        """The connections ``source`` holds now."""
        return self._open.get(source, 0)

    def open(self, source: str) -> Refused | None:
        """A connection from ``source`` was accepted: counted, or why it must be closed (then
        nothing is counted)."""
        held = self._open.get(source, 0)
        if held >= self._per_source:
            return Refused.SOURCE
        if self.capacity is not None and self.connections >= self.capacity:
            return Refused.RESERVE
        self._open[source] = held + 1
        self.connections += 1
        return None

    def close(self, source: str) -> None:
        """A connection :meth:`open` counted is closed."""
        held = self._open.get(source, 0)
        if held <= 1:
            # An entry per source with connections, none for one without: the table is no
            # larger than the connections open.
            self._open.pop(source, None)
        else:
            self._open[source] = held - 1
        if held:
            self.connections -= 1

    def begin_handshake(self) -> bool:
        """A counted connection starts a TLS handshake: whether it may."""
        if self.handshakes >= self._handshake_bound:
            return False
        self.handshakes += 1
        self._most = max(self._most, self.handshakes)
        return True

    def end_handshake(self) -> bool:
        """A handshake :meth:`begin_handshake` allowed is done, or its connection lost: whether
        it was the last of a burst (:data:`BURST` or more at once), whose memory the process may
        now give back."""
        if self.handshakes:
            self.handshakes -= 1
        if self.handshakes or self._most < BURST:
            return False
        self._most = 0
        return True
