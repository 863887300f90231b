"""Hung nodes in standalone fleet mode: a liveness probe beside the inventory poll
(docs/fleet-scheduling.md#hung-nodes).

An engine that accepts connections and answers nothing (a stopped process, a wedged driver)
fails no poll until the poll's own bound runs out, tens of seconds later, and meanwhile every
request sent to it waits. So every configured (node, engine) is also asked its engine's
cheapest route (:attr:`nvpair.engines.table.Engine.liveness_path`) every :data:`PROBE_INTERVAL`,
each probe bounded at :data:`PROBE_BOUND`. :class:`Liveness` is the verdict, a pure value
moved on by each probe's :class:`Probe` result; :class:`LivenessProbes` runs the probes on a
clock and says when a node's verdict changes, for the fleet to take a hung node out of
discovery and put it back.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from attrs import frozen
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from nvpair.common.durations import format_duration
from nvpair.engines.table import ENGINES
from nvpair.wire.client.bodies import discard_body
from nvpair.wire.message import Answer, Fields
from nvpair.wire.web import UpstreamClient

#: Seconds from one probe's start to the next one's.
PROBE_INTERVAL = 2.0
#: Seconds a probe waits for an answer's head (the dial included).
PROBE_BOUND = 2.0
#: Probes in a row without an answer that make a node hung.
SILENT_IN_A_ROW = 2
#: A probe's answer is read and dropped, so its connection can be reused; past these bounds
#: the connection is closed instead. Only the head matters.
DRAIN_SECONDS = 5.0
DRAIN_BYTES = 1024 * 1024


class Probe(enum.Enum):
    """How one probe ended."""

    #: An answer's head arrived, whatever its status: the engine is alive.
    ANSWERED = "answered"
    #: Nothing within the bound: not dialled, or dialled and not answered.
    SILENT = "silent"
    #: Refused, reset, closed before an answer: the engine is down, not hung, which its
    #: inventory poll says on its own.
    FAILED = "failed"


@frozen
class Liveness:
    """What the probes say of one node.

    :ivar silent: probes in a row without an answer, up to now.
    :ivar hung_since: clock time the node was found hung; None while it is not.
    """

    silent: int = 0
    hung_since: float | None = None

    @property
    def hung(self) -> bool:
        """Two probes in a row went unanswered, and none has been answered since."""
        return self.hung_since is not None

    @property
    def suspect(self) -> bool:
        """Its last probe went unanswered: one more and it is hung. Such a node goes after
        every other owner, so it stops being dispatched to a probe earlier where there is
        another."""
        return self.silent > 0

    def after(self, probe: Probe, now: float) -> Liveness:
        """The verdict once ``probe`` has ended, at clock time ``now``.

        Only silence counts toward a hang. An answer of any status ends it: the engine runs.
        So does a failed probe: a refused or reset connection is a node down, and what
        takes a down node out of discovery is its poll, which fails as fast.
        """
        if probe is not Probe.SILENT:
            return ALIVE
        silent = self.silent + 1
        if self.hung_since is None and silent >= SILENT_IN_A_ROW:
            return Liveness(silent, now)
        return Liveness(silent, self.hung_since)


#: A node whose last probe was answered, or not probed yet.
ALIVE = Liveness()


class _Watched:
    """One probed (engine, node): where it is, its verdict, its probe out or its next one."""

    __slots__ = ("engine", "liveness", "node", "sent", "timer", "url")

    def __init__(self, engine: str, node: str, url: str) -> None:
        self.engine = engine
        self.node = node
        self.url = url
        self.liveness = ALIVE
        #: The probe out now, if any.
        self.sent: Deferred[Answer] | None = None
        #: The probe's bound while it is out, else the next probe.
        self.timer: IDelayedCall | None = None

    def stop(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None
        sent, self.sent = self.sent, None
        if sent is not None and not sent.called:
            sent.cancel()


class LivenessProbes:
    """Probes every watched (engine, node) on its own schedule and keeps its verdict.

    A probe starts :data:`PROBE_INTERVAL` after the previous one started, or as soon as that
    one ended when it took longer; never two at once for one node. A silent probe's
    connection is closed.

    :param clock: the schedule and the bound.
    :param upstream: the process's shared upstream client.
    :ivar changed: called with (engine, node) when a node becomes hung or stops being hung.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        upstream: UpstreamClient,
        interval: float = PROBE_INTERVAL,
        bound: float = PROBE_BOUND,
    ) -> None:
        self._clock = clock
        self._upstream = upstream
        self._interval = interval
        self._bound = bound
        self._watched: dict[tuple[str, str], _Watched] = {}
        self.changed: Callable[[str, str], None] = lambda engine, node: None

    # -- what the fleet asks --------------------------------------------------------------

    def of(self, engine: str, node: str) -> Liveness:
        watched = self._watched.get((engine, node))
        return watched.liveness if watched is not None else ALIVE

    def hung(self, engine: str, node: str) -> bool:
        return self.of(engine, node).hung

    def why(self, engine: str, node: str) -> str | None:
        """Why the node is hung, as an operator reads it; None while it is not."""
        liveness = self.of(engine, node)
        if not liveness.hung:
            return None
        return (
            f"no answer to {liveness.silent} liveness probes in a row "
            f"(GET {ENGINES[engine].liveness_path}, {format_duration(self._bound)} each)"
        )

    # -- what is probed -------------------------------------------------------------------

    def watch(self, engine: str, node: str, url: str) -> None:
        """Probe ``node``'s ``engine`` at ``url`` from now on, starting now, afresh."""
        self.forget(engine, node)
        watched = self._watched[(engine, node)] = _Watched(engine, node, url)
        self._probe(watched)

    def forget(self, engine: str, node: str) -> None:
        """No more probes of the node; one out is closed, and says nothing."""
        watched = self._watched.pop((engine, node), None)
        if watched is not None:
            watched.stop()

    def stop(self) -> None:
        for engine, node in list(self._watched):
            self.forget(engine, node)

    # -- one probe ------------------------------------------------------------------------

    def _probe(self, watched: _Watched) -> None:
        started = self._clock.seconds()
        path = ENGINES[watched.engine].liveness_path.encode()
        # A GET: asked again on a fresh connection when a kept-alive one turns out closed.
        try:
            sent = self._upstream.request(watched.url, b"GET", path, Fields(), None, resend=True)
        except Exception:
            # Not even sent (an address the client cannot use): no answer, and no silence.
            sent = fail()
        watched.sent = sent
        timed_out: list[bool] = []

        def expire() -> None:
            timed_out.append(True)
            sent.cancel()

        watched.timer = self._clock.callLater(self._bound, expire)

        def answered(answer: Answer) -> Probe:
            discard_body(answer, self._clock, DRAIN_SECONDS, DRAIN_BYTES)
            return Probe.ANSWERED

        def failed(_: object) -> Probe:
            return Probe.SILENT if timed_out else Probe.FAILED

        def ended(probe: Probe) -> None:
            if watched.sent is not sent:
                # Forgotten meanwhile (a reload, a shutdown): it says nothing.
                return
            watched.sent = None
            if watched.timer is not None and watched.timer.active():
                watched.timer.cancel()
            self._judge(watched, probe)
            delay = max(0.0, started + self._interval - self._clock.seconds())
            watched.timer = self._clock.callLater(delay, self._probe, watched)

        sent.addCallbacks(answered, failed).addCallback(ended)

    def _judge(self, watched: _Watched, probe: Probe) -> None:
        before = watched.liveness
        now = self._clock.seconds()
        after = watched.liveness = before.after(probe, now)
        if after.hung == before.hung:
            return
        engine, node = watched.engine, watched.node
        if after.hung:
            self.log.warn(
                "{node}'s {engine} is hung: {why}; not dispatched to until it answers",
                engine=engine,
                node=node,
                why=self.why(engine, node),
            )
        else:
            assert before.hung_since is not None
            self.log.info(
                "{node}'s {engine} is no longer hung after {seconds}s: {how}",
                engine=engine,
                node=node,
                seconds=round(now - before.hung_since, 1),
                how="its liveness probe is answered"
                if probe is Probe.ANSWERED
                else "its liveness probe is refused (down, not hung)",
            )
        self.changed(engine, node)
