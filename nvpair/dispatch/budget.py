"""The retry budget of one inference request, as a pure value (docs/retry-budget.md).

Two bounds end the failover loop, and both are checked before every dispatch, never during
one: the number of dispatches (``--max-dispatch-attempts``) and the job deadline
(``--job-deadline`` from admission, a "no new attempts after" line rather than a ceiling on
elapsed time). Between rounds the loop backs off, starting at ``--retry-backoff`` and doubling
up to 8x. In standalone fleet mode a third bound caps the wait for an owner to come back
(``--owner-wait``). The loop asks this value; it never does the arithmetic itself.

The options that bound every request's effort reach the request path as one :class:`Bounds`
value, which the process builds from its command line.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from attrs import frozen

from nvpair.common.reasons import Reason

#: The backoff doubles each round up to this multiple of the first one.
BACKOFF_CAP = 8


class RetryBudget(NamedTuple):
    """What one request may still spend.

    A NamedTuple: two are made per request (at admission and at its dispatch), immutable for
    a fraction of what a frozen attrs class costs to make
    (docs/performance.md#per-dispatch-overheads). Made only by :meth:`start`, which sets
    :attr:`backoff` to the first one, and changed only through ``_replace``, which carries over
    every field it is not told to change: a field added here cannot be dropped on the way
    (``tests/dispatch/test_budget.py`` adds one and follows it through every method).

    :ivar max_attempts: dispatches allowed in all.
    :ivar deadline: the clock time after which no new dispatch starts.
    :ivar first_backoff: the first pause between rounds (0: none).
    :ivar used: dispatches spent so far.
    :ivar backoff: the pause the next round would take.
    :ivar owner_deadline: while every owner is gone, the clock time the wait for one ends
        (``--owner-wait``); None when nothing bounds it but :attr:`deadline`.
    """

    max_attempts: int
    deadline: float
    first_backoff: float
    used: int
    backoff: float
    owner_deadline: float | None = None

    @classmethod
    def start(
        cls, created: float, job_deadline: float, max_attempts: int, retry_backoff: float
    ) -> RetryBudget:
        """A fresh budget for a request admitted at ``created``."""
        return cls(
            max_attempts=max_attempts,
            deadline=created + job_deadline,
            first_backoff=retry_backoff,
            used=0,
            backoff=retry_backoff,
        )

    def refusal(self, now: float) -> Reason | None:
        """Why no dispatch may start now (docs/retry-budget.md#the-bounds), or None when one may."""
        if self.used >= self.max_attempts:
            return Reason.ATTEMPTS_EXHAUSTED
        if now >= self.deadline:
            return Reason.DEADLINE
        return None

    def spend(self) -> RetryBudget:
        """One dispatch started."""
        return self._replace(used=self.used + 1)

    @property
    def final(self) -> bool:
        """The dispatch just spent was the last permitted one: it answers for itself."""
        return self.used >= self.max_attempts

    def pause(self, now: float) -> float | None:
        """How long to back off before the next round; None when the deadline has passed.

        Never past the deadline: a wait that would end beyond it is cut to it, so the
        refusal comes on time.
        """
        remaining = self.deadline - now
        if remaining <= 0:
            return None
        return min(self.backoff, remaining)

    def owners_gone(self, now: float, limit: float) -> RetryBudget:
        """Every owner has gone: the wait for one starts now, bounded by ``limit`` seconds
        (0: only the deadline bounds it). A wait already running keeps its bound."""
        if self.owner_deadline is not None or limit <= 0:
            return self
        return self._replace(owner_deadline=now + limit)

    def owners_back(self) -> RetryBudget:
        """An owner is there again: should every owner go once more, the wait starts afresh."""
        if self.owner_deadline is None:
            return self
        return self._replace(owner_deadline=None)

    def owner_wait(self, now: float) -> float | None:
        """How long to wait for an owner to come back; None when the deadline, or the owner
        wait's own bound (:meth:`owners_gone`), has passed.

        A zero backoff waits for the rest of the deadline: the caller also wakes on a
        discovery change, so it never spins.
        """
        pause = self.pause(now)
        if pause is None:
            return None
        wait = pause or self.deadline - now
        if self.owner_deadline is None:
            return wait
        left = self.owner_deadline - now
        return min(wait, left) if left > 0 else None

    def owner_wait_ran_out(self, now: float) -> bool:
        """Whether the owner wait's own bound (:meth:`owners_gone`) is what ended the wait for
        an owner, rather than the deadline: the earlier of the two that has passed."""
        bound = self.owner_deadline
        return bound is not None and bound <= self.deadline and now >= bound

    def backed_off(self) -> RetryBudget:
        """The budget after one pause: the next one is twice as long, up to the cap."""
        return self._replace(backoff=min(self.backoff * 2, self.first_backoff * BACKOFF_CAP))

    def retry_after(self) -> int:
        """``Retry-After`` for a refusal: whole seconds, at least 1."""
        return max(1, math.ceil(self.backoff))


@frozen
class Bounds:
    """What bounds each request's effort, the same for every request of the process
    (docs/retry-budget.md#the-bounds); seconds, 0 where an option allows it turns it off.

    :ivar response_header_timeout: headers per attempt, and again the first body byte.
    :ivar dial_timeout: connecting, per node asked by a fleet-wide request.
    :ivar job_deadline: from admission, after which no new dispatch starts.
    :ivar max_dispatch_attempts: dispatches per inference request.
    :ivar retry_backoff: the first pause between rounds.
    :ivar client_write_timeout: how long a client may accept nothing of a relayed answer
        (docs/request-path.md#client-write-deadline).
    """

    response_header_timeout: float
    dial_timeout: float
    job_deadline: float
    max_dispatch_attempts: int
    retry_backoff: float
    client_write_timeout: float

    def budget(self, created: float) -> RetryBudget:
        """A fresh budget for a request admitted at ``created``."""
        return RetryBudget.start(
            created, self.job_deadline, self.max_dispatch_attempts, self.retry_backoff
        )
