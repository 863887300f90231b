"""What standalone fleet mode knows of each configured (node, engine): a :class:`Pair` with its
poll schedule and polls in flight, and the :class:`PairReport` an operator reads of it
(``/status`` and the log; docs/fleet-scheduling.md#every-configured-node-is-visible).
"""

from __future__ import annotations

import enum
from typing import Any

from attrs import frozen
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall


class PollState(enum.Enum):
    """What a configured (node, engine)'s polls say of it."""

    #: Not polled to the end yet.
    PENDING = "pending"
    #: Its model list answered: in discovery.
    UP = "up"
    #: Its model list failed (refused, timed out, an error status, not its envelope): not in
    #: discovery.
    DOWN = "down"
    #: Its engine says it is loading a model; in discovery with its last models, if it ever
    #: listed any.
    LOADING = "loading"


@frozen
class PairReport:
    """What an operator sees of one configured (node, engine): ``/status`` and the log.

    :ivar last_poll: clock time the last poll ended; None before the first.
    :ivar last_error: why the last failed poll failed; cleared by an answer.
    :ivar since: clock time of the last change of :attr:`state`.
    """

    node: str
    engine: str
    url: str
    state: PollState = PollState.PENDING
    models: tuple[str, ...] = ()
    last_poll: float | None = None
    last_error: str | None = None
    since: float | None = None


class Pair:
    """One configured (node, engine): its schedule, its polls in flight, its report.

    A reload that changes the pair's URL or removes it replaces or drops this object, so the
    answer of a poll it started is recognised as stale and dropped.
    """

    def __init__(self, node: str, engine: str, url: str) -> None:
        self.node = node
        self.engine = engine
        self.url = url
        self.loop: LoopingCall | None = None
        self.polling: set[Deferred[Any]] = set()
        self.report = PairReport(node, engine, url)

    def stop(self) -> None:
        """No next poll; the ones in flight are cancelled (their connections closed)."""
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.loop = None
        for poll in list(self.polling):
            poll.cancel()
