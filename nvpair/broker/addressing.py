# -*- test-case-name: tests.broker.test_broker -*-
"""Where a broker method goes: an engine's facade or the process
(docs/broker-protocol.md#addressing), and the table of methods that serves it.

What each method does is the caller's: the process hands the link a :class:`MethodTable`, and
gets the link's events back through it.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from nvpair.broker.envelope import Params
from nvpair.engines.table import ENGINES

#: Facade-scoped methods (docs/broker-protocol.md#addressing): they must carry an engine address.
FACADE_SCOPED = frozenset(
    {
        "ready",
        "error",
        "node/select",
        "node/set-local-backend",
        "errors:report",
        "set-port",
        "discovery:subscribe",
        "discovery:nodes",
    }
)


@frozen
class Address:
    """Where a method goes: an engine's facade (``engine`` set) or the process (``None``)."""

    engine: str | None
    method: str


def resolve_address(method: str) -> Address:
    """Split ``<engine>:<method>``; only a known engine id counts as an address
    (docs/broker-protocol.md#addressing).

    ``errors:report`` stays the unaddressed method ``errors:report``: treating any prefix before
    a colon as an engine would strip a real method down to ``report``.
    """
    head, sep, rest = method.partition(":")
    if sep and head in ENGINES:
        return Address(head, rest)
    return Address(None, method)


Handler = Callable[[Address, Params], object]


class MethodTable:
    """What the link calls into. Subclassed (or built) by the process wiring.

    :meth:`handler` returns the callable for a resolved address, or None for an unknown method.
    A handler returns a result (or a Deferred of one) and raises
    :class:`~nvpair.broker.envelope.RpcError` to refuse.
    """

    def handler(self, address: Address) -> Handler | None:
        raise NotImplementedError

    def facade_enabled(self, engine: str) -> bool:
        raise NotImplementedError

    def link_lost(self) -> None:
        """The broker closed the link: the process should stop serving and exit 0."""


def no_facade(address: Address, table: MethodTable) -> str | None:
    """Why a facade-scoped method reaches no facade (``unaddressed``, ``facade-not-enabled``),
    or None when it does or is not facade-scoped."""
    if address.method not in FACADE_SCOPED:
        return None
    if address.engine is None:
        return "unaddressed"
    if not table.facade_enabled(address.engine):
        return "facade-not-enabled"
    return None
