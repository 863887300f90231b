"""The resilient loop through the real process and simulated engines (issue 3,
docs/request-path.md#the-failover-loop)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import defer, reactor, task

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims

FAST = ("--retry-backoff", "50ms")


def nodes_for(*engines: object) -> list[dict[str, object]]:
    return [{"id": e.node, "url": e.url, "models": ["tiny"]} for e in engines]  # type: ignore[attr-defined]


async def complete(port: int, stream: bool = False) -> tuple[int, bytes]:
    body = json.dumps({"model": "tiny", "prompt": "hello", "stream": stream}).encode()
    response = await treq.post(f"http://127.0.0.1:{port}/completion", body, timeout=30)
    return response.code, await response.content()


@pytest_twisted.ensureDeferred
async def test_retryable_status_fails_over_to_the_next_owner(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path, *FAST) as proxy,
    ):
        a.faults.status = 503
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a, b))
        code, body = await complete(port)
        assert code == 200 and b"from b" in body
        assert len(a.requests) == 1 and len(b.requests) == 1


@pytest_twisted.ensureDeferred
async def test_headers_then_silence_fails_over_after_the_first_body_timeout(
    tmp_path: Path,
) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path, "--response-header-timeout", "300ms", *FAST) as proxy,
    ):
        a.faults.stall = True
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a, b))
        code, body = await complete(port, stream=True)
        assert code == 200 and b'" b"' in body  # b's streamed token
        assert a.abandoned == 1 and len(b.requests) == 1


@pytest_twisted.ensureDeferred
async def test_budget_exhausted_final_attempt_answers_for_itself(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path, "--max-dispatch-attempts", "3", *FAST) as proxy,
    ):
        a.faults.status = 503
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a))
        code, body = await complete(port)
        assert code == 503 and len(a.requests) == 3
        assert json.loads(body)["error"]["type"] == "unavailable_error"  # the engine's own body


@pytest_twisted.ensureDeferred
async def test_deadline_ends_slow_failures_with_503(tmp_path: Path) -> None:
    args = (
        "--response-header-timeout",
        "300ms",
        "--job-deadline",
        "1s",
        "--max-dispatch-attempts",
        "100",
        *FAST,
    )
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path, *args) as proxy,
    ):
        a.faults.stall = True
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a))
        response = await treq.post(f"http://127.0.0.1:{port}/completion", b'{"prompt":"x"}')
        body = json.loads(await response.content())
        assert response.code == 503 and body["error"]["code"] == "deadline"
        assert int(response.headers.getRawHeaders(b"retry-after")[0]) >= 1
        assert 2 <= len(a.requests) <= 5


@pytest_twisted.ensureDeferred
async def test_node_leaving_discovery_mid_attempt_fails_over_promptly(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path, *FAST) as proxy,
    ):
        a.faults.stall = True  # would hold the request for the 30 min default cap
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a, b))
        started = time.monotonic()
        pending = defer.ensureDeferred(complete(port))
        for _ in range(100):
            if a.in_flight:
                break
            await task.deferLater(reactor, 0.02, lambda: None)
        proxy.discovery("llamacpp", nodes_for(b))
        code, body = await pending
        assert code == 200 and b"from b" in body
        assert time.monotonic() - started < 5
        assert a.abandoned == 1


@pytest_twisted.ensureDeferred
async def test_burst_spreads_across_equally_idle_owners(tmp_path: Path) -> None:
    """100 concurrent requests over 4 equal nodes: the reservations spread them evenly."""
    specs = [("llamacpp", ["tiny"], name) for name in ("a", "b", "c", "d")]
    async with sims(*specs) as engines, running_proxy(tmp_path, *FAST) as proxy:
        for engine in engines:
            engine.chunk_interval = 0.2
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(*engines))
        results = await defer.gatherResults(
            [defer.ensureDeferred(complete(port, stream=True)) for _ in range(100)]
        )
        assert all(code == 200 for code, _ in results)
        counts = sorted(len(engine.requests) for engine in engines)
        assert sum(counts) == 100
        assert counts[-1] - counts[0] <= 4, counts


@pytest_twisted.ensureDeferred
async def test_shutdown_cancels_what_is_in_flight_and_exits_zero(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path, *FAST) as proxy,
    ):
        a.faults.stall = True
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a))
        pending = treq.post(f"http://127.0.0.1:{port}/completion", b'{"prompt":"x"}')
        for _ in range(100):
            if a.in_flight:
                break
            await task.deferLater(reactor, 0.02, lambda: None)
        proxy.close_stdin()
        assert await proxy.ended == 0
        # The terminal event of what shutdown cancelled still reached the broker.
        errored = [f for f in proxy.frames if f.get("method") == "workload:errored"]
        assert len(errored) == 1
        info = errored[0]["params"]["workloadInfo"]
        assert (info["state"], info["error"]) == ("cancelled", "shutdown")
        failures: list[object] = []
        pending.addErrback(failures.append)
        await task.deferLater(reactor, 0.5, lambda: None)
        assert len(failures) == 1  # the connection closed with no answer
        for _ in range(50):
            if not a.in_flight:
                break
            await task.deferLater(reactor, 0.05, lambda: None)
        assert a.in_flight == 0


@pytest_twisted.ensureDeferred
async def test_redelivered_snapshot_does_not_clear_live_reservations(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path, *FAST) as proxy,
    ):
        for engine in (a, b):
            engine.faults.first_byte_delay = 1.0  # keep each request in flight a while
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a, b))
        snapshot = {
            "generation": 1,
            "nodes": [
                {"id": "a", "pending": 0, "gpuPressure": 0},
                {"id": "b", "pending": 0, "gpuPressure": 0},
            ],
        }
        proxy.notify("node/set-priority", snapshot)
        await proxy.barrier()

        async def started_on() -> str:
            before = {e.node: len(e.requests) for e in (a, b)}
            d = defer.ensureDeferred(complete(port))
            for _ in range(100):
                grown = [e.node for e in (a, b) if len(e.requests) > before[e.node]]
                if grown:
                    pending.append(d)
                    return grown[0]
                await task.deferLater(reactor, 0.01, lambda: None)
            raise AssertionError("never dispatched")

        pending: list[defer.Deferred[tuple[int, bytes]]] = []
        assert await started_on() == "a"
        proxy.notify("node/set-priority", snapshot)  # redelivered: a stays reserved
        await proxy.barrier()
        assert await started_on() == "b"
        proxy.notify("node/set-priority", {**snapshot, "generation": 2})  # supersedes both
        await proxy.barrier()
        assert await started_on() == "a"
        results = await defer.gatherResults(pending)
        assert [code for code, _ in results] == [200, 200, 200]
