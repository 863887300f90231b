"""The last few hundred workloads and the path each took, for the admin ``/status``
(docs/operations.md#recent-workloads).

A bounded ring (:class:`RecentWorkloads`) of one :class:`Trail` per admitted inference request,
newest last. The request path feeds it at two points only: admission
(:meth:`RecentWorkloads.admitted`) and the end of each attempt (:meth:`Trail.attempt_ended`).
State, error, stats and times are the :class:`~nvpair.dispatch.workload.Workload`'s own, read when
the status is built: nothing is copied and no dict is built per request. The ring exists only when
an admin listener runs; without one the request path holds None and pays one ``is None`` test
per point. Operational values only — node ids, results, status codes, exception class names —
never content.
"""

from __future__ import annotations

from collections import deque

from attrs import frozen

from nvpair.dispatch.attempt import RESULTS, SERVED, TRUNCATED, Failed, Outcome, Served
from nvpair.dispatch.workload import Workload

#: How many workloads ``/status`` shows (docs/operations.md#recent-workloads).
RECENT = 200


@frozen
class AttemptRecord:
    """How one dispatch ended.

    :ivar result: ``served``, ``truncated`` (served, then cut by its engine before the body's
        end) or one of :data:`RESULTS`' values.
    :ivar status: the HTTP status the node answered, when it answered one (a retried status,
        the served answer's, the 2xx whose first byte never came); None otherwise.
    :ivar detail: the failure in a word or two (``header timeout``, an exception's class
        name); empty when there is nothing to add.
    """

    node: str
    result: str
    status: int | None = None
    detail: str = ""


class Trail:
    """One workload and its attempts so far, in dispatch order.

    Only the attempt list grows, one entry per ended dispatch (a dispatch still in progress is
    not listed). It is fed on the request path, so an entry is what is at hand — the served
    status, or the :class:`~nvpair.dispatch.attempt.Failed` value the attempt returned anyway — and
    the :class:`AttemptRecord` s are made when ``/status`` reads them (bench/README.md,
    "Metrics on the hot path").
    """

    __slots__ = ("_ended", "workload")

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._ended: list[tuple[str, int | Failed | _Truncated]] = []

    def attempt_ended(self, node: str, outcome: Outcome) -> None:
        """A dispatch to ``node`` ended: served (its answer is now the client's) or failed."""
        # Not the Served value itself: it holds the answer's head and its relay, which must
        # not outlive the request for the sake of a status page.
        self._ended.append((node, outcome.head.status if isinstance(outcome, Served) else outcome))

    def truncated(self) -> None:
        """The served attempt's answer was cut by its engine before the body's end."""
        node, ended = self._ended[-1]
        assert isinstance(ended, int)
        self._ended[-1] = (node, _Truncated(ended))

    @property
    def attempts(self) -> list[AttemptRecord]:
        return [_record(node, ended) for node, ended in self._ended]


@frozen
class _Truncated:
    """A served attempt whose answer was cut: the status it was served with."""

    status: int


def _record(node: str, ended: int | Failed | _Truncated) -> AttemptRecord:
    if isinstance(ended, int):
        return AttemptRecord(node, SERVED, ended)
    if isinstance(ended, _Truncated):
        return AttemptRecord(node, TRUNCATED, ended.status)
    return AttemptRecord(node, RESULTS[ended.why], ended.status, ended.detail)


class RecentWorkloads:
    """The ring: the last ``size`` admitted workloads; the oldest drops out as one arrives."""

    def __init__(self, size: int = RECENT) -> None:
        self._ring: deque[Trail] = deque(maxlen=size)

    def admitted(self, workload: Workload) -> Trail:
        """A workload was admitted: its trail, to be told how each attempt ends."""
        trail = Trail(workload)
        self._ring.append(trail)
        return trail

    def newest_first(self) -> list[Trail]:
        """Every trail held, newest first (read when ``/status`` is asked for)."""
        return list(reversed(self._ring))

    def __len__(self) -> int:
        return len(self._ring)


__all__ = ["RECENT", "AttemptRecord", "RecentWorkloads", "Trail"]
