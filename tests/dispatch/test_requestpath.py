"""The request path's entry: a table from route class to server."""

from __future__ import annotations

import pytest

from nvpair.dispatch.job import Job, Services
from nvpair.dispatch.requestpath import SERVERS, Unanswered
from nvpair.engines.table import RouteClass
from nvpair.observe.metrics import Metrics
from tests.fakes import harness


def test_every_route_class_has_a_server() -> None:
    """The request path's entry is a table: a route class without a server cannot exist."""
    assert set(SERVERS) == set(RouteClass)


async def _silent(services: Services, job: Job) -> None:
    """A server with a bug: it returns without answering or saying why."""


def test_a_server_that_ends_unanswered_is_a_bug_never_a_client_left_waiting() -> None:
    """``internal`` is what a bug is counted as, and only a bug: a server that returns without
    recording an answer fails (the facade then answers 500 ``internal``), so no client waits
    for ever and no success can pass for a bug (docs/operations.md#metrics)."""
    metrics = Metrics()
    h = harness(metrics=metrics, servers={**SERVERS, RouteClass.INFERENCE: _silent})
    _, d = h.serve()
    failures: list[object] = []
    d.addErrback(lambda failure: failures.append(failure.value))
    assert len(failures) == 1 and isinstance(failures[0], Unanswered)
    assert metrics.requests == {("lmstudio", "inference", "internal"): 1}
    assert h.path.in_flight == 0


@pytest.mark.parametrize("route", [RouteClass.INFERENCE, RouteClass.OTHER])
def test_an_answered_request_is_not_a_bug(route: RouteClass) -> None:
    """The guard's other side: a refusal is counted by its reason, not as ``internal``."""
    metrics = Metrics()
    h = harness(metrics=metrics)
    path = "/v1/chat/completions" if route is RouteClass.INFERENCE else "/api/v0/system"
    request, d = h.serve(
        route_path=path, method=b"POST" if route is RouteClass.INFERENCE else b"GET"
    )
    assert request.reason() == "no-owner" and d.called
    assert metrics.requests == {("lmstudio", route.value, "no-owner"): 1}
