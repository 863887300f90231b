"""The access log (``--access-log``): one info line per finished request
(docs/README.md#the-access-log).

A request is finished when its answer is: relayed from a node, answered by the proxy, or refused
at its head or its body before it was admitted. Its line holds operational fields only, each
present when known and absent otherwise: facade, engine, route class, method, path (never the
query), status, outcome, node, attempts, time to first byte, duration, the fleet key's name and
the source address. Never content: no query string, body or header reaches it.

A refusal before admission is also counted in ``nvpair_requests_total`` under its reason
(:class:`RefusalCounter`), as the request path counts every refusal after it. Without the log or
an admin listener a facade holds :data:`NO_ACCESS_LOG` and :data:`NO_REFUSALS`.
"""

from __future__ import annotations

from typing import Protocol

from attrs import fields, frozen
from twisted.logger import Logger

from nvpair.common.reasons import Reason
from nvpair.engines.admission import parse_ip
from nvpair.engines.table import RouteClass

#: The longest path a line quotes: a path is metadata, but a client chooses its length.
MAX_PATH = 256

#: Routes whose answer is every node's, asked at once: no attempt is counted.
FAN_OUT = (RouteClass.INVENTORY, RouteClass.PREFLIGHT)


def bounded_path(path: str) -> str:
    """A path as a line gives it: without its query, and at most :data:`MAX_PATH` long."""
    path = path.split("?", 1)[0]
    return path if len(path) <= MAX_PATH else path[:MAX_PATH] + "..."


def millis(seconds: float | None) -> float | None:
    """Seconds as the line's milliseconds."""
    return None if seconds is None else round(seconds * 1000, 1)


def shown_address(host: str | None) -> str | None:
    """A source address as a line gives it: an IPv4 caller as IPv4 (``192.168.1.7``), though
    a dual-stack listener sees it as ``::ffff:192.168.1.7``, as ``[access]`` judges it."""
    if host is None:
        return None
    ip = parse_ip(host)
    return host if ip is None else str(ip)


@frozen
class Finished:
    """One finished request as its access line says it; None is "not known" (left out).

    :ivar facade: the facade it came through (``openai``, or an engine's own).
    :ivar engine: the engine of the node last dispatched to; the facade's where none was.
    :ivar outcome: ``served`` (a node's answer was relayed; ``truncated`` when its engine cut
        it before its end), the proxy's reason, or ``cancelled``.
    :ivar ttfb_ms: from admission to the first byte of the answer a node gave.
    :ivar duration_ms: from admission to the end of the answer.
    :ivar key: the name of the fleet key the request came with.
    :ivar queued_ms: how long it waited in fleet mode's queue, if it waited.
    :ivar client: the source address it came from.
    :ivar affinity: what fleet mode's order did with its conversation (``followed``,
        ``moved``, ``new``), and ``affinity_why``, why it moved
        (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity).
    """

    engine: str
    facade: str | None = None
    method: str | None = None
    path: str | None = None
    status: int | None = None
    route: str | None = None
    outcome: str | None = None
    node: str | None = None
    attempts: int | None = None
    ttfb_ms: float | None = None
    duration_ms: float | None = None
    key: str | None = None
    queued_ms: float | None = None
    client: str | None = None
    affinity: str | None = None
    affinity_why: str | None = None

    def fields(self) -> dict[str, object]:
        """The line's fields: only those known."""
        return {name: value for name in _FIELDS if (value := getattr(self, name)) is not None}

    def template(self) -> str:
        """The line's message: method, path and status, those of them known."""
        known = " ".join(
            f"{{{name}}}" for name in ("method", "path", "status") if getattr(self, name)
        )
        return known if self.method is not None else f"unreadable request: {known}"


def refused(
    engine: str,
    method: bytes,
    path: str | None,
    reason: Reason,
    route: RouteClass | None = None,
    client: str | None = None,
) -> Finished:
    """A request the proxy refused before admitting it (at its head, or for its body).

    :param engine: the facade's id, its engine as well (no node was asked).
    :param method: as read; empty when no request line could be.
    :param path: the target's path, None when the target is no path.
    :param client: the source address.
    """
    return Finished(
        engine=engine,
        facade=engine,
        client=shown_address(client),
        method=method.decode("latin-1") or None,
        path=None if path is None else bounded_path(path),
        status=reason.status,
        route=None if route is None else route.value,
        outcome=reason.value,
    )


_FIELDS = tuple(field.name for field in fields(Finished))


class RefusalCounter(Protocol):
    """Where a facade counts the requests it refuses before the request path
    (:class:`nvpair.observe.metrics.Metrics`, with an admin listener)."""

    def request_refused(self, engine: str, route: str, outcome: str) -> None:
        """A request to ``engine``'s facade, routed as ``route``, refused with the reason
        ``outcome``."""


class AccessLog:
    """Writes access lines at info level."""

    log = Logger(namespace="nvpair.facades.access")

    def write(self, finished: Finished) -> None:
        self.log.info(finished.template(), **finished.fields())


class _NoAccessLog(AccessLog):
    """The access log off (no ``--access-log``)."""

    def write(self, finished: Finished) -> None:
        pass


class _NoRefusals:
    """No admin listener: no metric to count a refusal in."""

    def request_refused(self, engine: str, route: str, outcome: str) -> None:
        pass


#: The access log of a process started without ``--access-log``.
NO_ACCESS_LOG: AccessLog = _NoAccessLog()
#: The refusal counter of a process without an admin listener.
NO_REFUSALS: RefusalCounter = _NoRefusals()
