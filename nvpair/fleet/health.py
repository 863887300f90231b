"""Passive health in standalone fleet mode (docs/fleet-scheduling.md#passive-health).

A node whose attempts failed ``--fail-threshold`` times in a row is **held back** for a
cool-down: it goes to the end of the candidate order, behind every node that is not held back.
When the cool-down is over, the next dispatch to it is a **trial**. While a trial runs the node
is held back for one more cool-down, so a node that takes its time to fail (a machine switched
off costs a whole dial timeout) is not handed every request that arrives meanwhile. The trial's
verdict decides: a success makes the node healthy again, a failure holds it back for twice the
cool-down, up to ``--cooldown-max``. A node that never answers therefore costs one failed
attempt per cool-down, not one per request.

:class:`NodeHealth` is the state machine as a pure value: every step takes the time and
returns the next value. :class:`PassiveHealth` keeps one per (engine, node) on a clock.
"""

from __future__ import annotations

from attrs import evolve, frozen
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger


@frozen
class HealthPolicy:
    """The options of passive health.

    :ivar threshold: failed attempts in a row that hold a node back (``--fail-threshold``).
    :ivar cooldown: the first cool-down (``--cooldown``); 0 never holds a node back.
    :ivar cooldown_max: the longest cool-down (``--cooldown-max``).
    """

    threshold: int
    cooldown: float
    cooldown_max: float

    def cooldown_for(self, holds: int) -> float:
        """The cool-down of the ``holds``-th hold in a row: doubled each time, capped."""
        length = self.cooldown
        for _ in range(1, holds):
            if length >= self.cooldown_max:
                break
            length *= 2
        return min(length, max(self.cooldown_max, self.cooldown))


@frozen
class NodeHealth:
    """One (engine, node)'s passive health.

    :ivar failures: attempts failed in a row.
    :ivar holds: cool-downs in a row; the next one lasts ``cooldown_for(holds + 1)``.
    :ivar held_until: the time the current hold (or trial) ends; None when never held.
    """

    failures: int = 0
    holds: int = 0
    held_until: float | None = None

    def held(self, now: float) -> bool:
        """Whether the node is held back now."""
        return self.held_until is not None and now < self.held_until

    def due(self, now: float, policy: HealthPolicy) -> bool:
        """Whether the next dispatch is a trial: held back before, and the cool-down is over."""
        return self.holds > 0 and self.failures >= policy.threshold and not self.held(now)

    def trial(self, now: float, policy: HealthPolicy) -> NodeHealth:
        """A trial attempt starts: held back for one more cool-down while it runs."""
        return evolve(self, held_until=now + policy.cooldown_for(self.holds))

    def failed(self, now: float, policy: HealthPolicy, trial: bool) -> NodeHealth:
        """An attempt failed: a transport error, a first-body timeout, a retryable status.

        A failure that lands while the node is held back (an attempt dispatched before the
        hold) is counted but does not lengthen the hold; a trial's failure always does.
        """
        failures = self.failures + 1
        if failures < policy.threshold or (self.held(now) and not trial):
            return evolve(self, failures=failures)
        holds = self.holds + 1
        return NodeHealth(failures, holds, now + policy.cooldown_for(holds))


#: A node nothing has gone wrong with.
HEALTHY = NodeHealth()


class PassiveHealth:
    """Every (engine, node)'s :class:`NodeHealth`, on a clock.

    Only nodes with failures on record have an entry: a success removes it, so the map stays
    as small as the fleet's trouble.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, policy: HealthPolicy) -> None:
        self._clock = clock
        self.policy = policy
        self._nodes: dict[tuple[str, str], NodeHealth] = {}
        # The last failure of each node with failures on record, for the status surface.
        self._why: dict[tuple[str, str], str] = {}

    def of(self, engine: str, node: str) -> NodeHealth:
        return self._nodes.get((engine, node), HEALTHY)

    def last_failure(self, engine: str, node: str) -> str | None:
        """The last failure of a node with failures on record (``status 503``)."""
        return self._why.get((engine, node))

    def forget(self, engine: str, node: str) -> None:
        self._nodes.pop((engine, node), None)
        self._why.pop((engine, node), None)

    def held(self, engine: str, node: str) -> bool:
        """Whether the node is held back now (to the end of the order)."""
        # Asked for every candidate of every round: a node with nothing on record (nearly
        # every one) is answered by the lookup alone, with no clock read.
        health = self._nodes.get((engine, node))
        return health is not None and health.held(self._clock.seconds())

    def dispatching(self, engine: str, node: str) -> bool:
        """A dispatch to the node starts; returns whether it is the trial after a cool-down."""
        key = (engine, node)
        health = self._nodes.get(key)
        if health is None:
            return False  # nothing on record: no trial is due
        now = self._clock.seconds()
        if not health.due(now, self.policy):
            return False
        self._nodes[key] = health.trial(now, self.policy)
        return True

    def succeeded(self, engine: str, node: str) -> None:
        """An attempt was answered (committed, or an answer that is not retried)."""
        before = self._nodes.pop((engine, node), None)
        self._why.pop((engine, node), None)
        if before is not None and before.holds:
            self.log.info("{node} answers again: no longer held back", engine=engine, node=node)

    def failed(self, engine: str, node: str, trial: bool, why: str) -> None:
        """An attempt failed in a way that counts against the node (see :meth:`NodeHealth.failed`).

        :param why: the failure in a few operational words (``transport``, ``status 503``).
        """
        now = self._clock.seconds()
        before = self.of(engine, node)
        after = before.failed(now, self.policy, trial)
        self._nodes[(engine, node)] = after
        self._why[(engine, node)] = why
        if after.holds > before.holds:
            assert after.held_until is not None
            self.log.warn(
                "{node} held back for {seconds}s after {failures} failed attempts in a row "
                "(last: {why})",
                engine=engine,
                node=node,
                seconds=round(after.held_until - now, 3),
                failures=after.failures,
                why=why,
            )
