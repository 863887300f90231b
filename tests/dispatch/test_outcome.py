"""The status table (docs/retry-budget.md#retryable-failures), every class."""

from __future__ import annotations

import pytest

from nvpair.dispatch.outcome import Verdict, classify
from nvpair.engines.table import RouteClass

INF, OTHER = RouteClass.INFERENCE, RouteClass.OTHER


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_2xx_commits(status: int) -> None:
    assert classify(status, INF) is Verdict.COMMIT
    assert classify(status, OTHER) is Verdict.COMMIT


@pytest.mark.parametrize("status", [300, 301, 302, 304, 307, 308])
def test_3xx_is_forwarded_not_retried(status: int) -> None:
    assert classify(status, INF) is Verdict.ANSWER


@pytest.mark.parametrize("status", [400, 401, 403, 405, 409, 413, 422, 499])
def test_other_4xx_are_answers(status: int) -> None:
    assert classify(status, INF) is Verdict.ANSWER
    assert classify(status, OTHER) is Verdict.ANSWER


def test_404_is_retried_on_inference_only() -> None:
    """Positive inventory can be stale; on other routes a 404 is the same everywhere."""
    assert classify(404, INF) is Verdict.RETRY
    assert classify(404, OTHER) is Verdict.ANSWER


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_408_429_and_5xx_are_retried(status: int) -> None:
    assert classify(status, INF) is Verdict.RETRY
    assert classify(status, OTHER) is Verdict.RETRY
