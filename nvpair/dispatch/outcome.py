"""Pure status classification: what an upstream status means before commit
(docs/retry-budget.md#retryable-failures).

Whether a status is retried depends on when it arrives, not only on its class: before commit
the proxy may try elsewhere; anything not retried becomes the client's answer at once.
"""

from __future__ import annotations

import enum

from nvpair.engines.table import RouteClass


class Verdict(enum.Enum):
    """What to do with an upstream response that arrived before commit."""

    #: Stream it to the client (a 2xx, once its first body byte arrives).
    COMMIT = "commit"
    #: Forward it as the answer at once, whatever budget is left.
    ANSWER = "answer"
    #: Try elsewhere while budget remains.
    RETRY = "retry"


def classify(status: int, route: RouteClass) -> Verdict:
    """The retryable-failures table (docs/retry-budget.md#retryable-failures).

    - 2xx commits (at the first body byte, docs/request-path.md#the-commit-point);
    - 3xx is not expected from an engine and is forwarded verbatim;
    - 404 is retried on an inference route only: positive model inventory can be stale,
      while on any other route a 404 is the same everywhere;
    - 408, 429 and every 5xx are retried;
    - any other 4xx is not: the same request fails identically everywhere, so retrying only
      spends budget.
    """
    if 200 <= status < 300:
        return Verdict.COMMIT
    if status == 404:
        return Verdict.RETRY if route is RouteClass.INFERENCE else Verdict.ANSWER
    if status in (408, 429) or status >= 500:
        return Verdict.RETRY
    return Verdict.ANSWER
