"""Fleet mode plays the scheduler, end to end through ``twistd -n nvpair-proxy --fleet`` with
simulated nodes (issue 13 item 7; docs/fleet-scheduling.md): a warm node wins over a lower id,
a second request joins the load the first one set off, a loading node is skipped, a failing
node is held back and returns after its cool-down, and a request whose every owner vanished
gives up after ``--owner-wait``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError

from nvpair.sim import SimEngine
from tests.integration.conftest import running_proxy
from tests.integration.harness import free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually


def fleet_file(
    tmp_path: Path,
    engine: str,
    port: int,
    sims: Sequence[SimEngine],
    interval: str = "100ms",
    queue: bool = True,
) -> Path:
    """:param queue: false: the plain order alone, every request dispatched at once
    (``[queue] enabled = false``, docs/fleet-scheduling.md#the-queue)."""
    nodes = {sim.node: sim.url for sim in sims}
    path = write_fleet(tmp_path / "fleet.toml", port, nodes, engine, interval)
    if not queue:
        path.write_text(path.read_text() + "\n[queue]\nenabled = false\n")
    return path


def posts(sim: SimEngine) -> int:
    return sum(1 for r in sim.requests if r.method == "POST")


def polls(sim: SimEngine, path: str) -> int:
    return sum(1 for r in sim.requests if r.path == path)


async def polled(sims: Sequence[SimEngine], path: str, times: int = 2) -> None:
    """Until the proxy has asked every sim ``path`` ``times`` more times from now: its answer
    to all but the last has then been read."""
    marks = [polls(s, path) for s in sims]

    async def done() -> bool:
        return all(polls(s, path) >= m + times for s, m in zip(sims, marks, strict=True))

    await eventually(done, f"polls of {path}")


#: Each generation's prompt is its own: a new conversation, which no node served before, so
#: the fleet order decides where it goes, not affinity (docs/fleet-scheduling.md#affinity-order).
PROMPTS = itertools.count()


async def generate(port: int, model: str = "llama3") -> tuple[int, str | None, str | None]:
    """POST /api/generate of a new prompt; (status, the X-Nvpair-Node that answered,
    X-Nvpair-Error)."""
    prompt = f"hi {next(PROMPTS)}"
    response = await treq.post(
        f"http://127.0.0.1:{port}/api/generate",
        json.dumps({"model": model, "prompt": prompt, "stream": False}).encode(),
        timeout=20,
    )
    await response.content()
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    error = response.headers.getRawHeaders(b"x-nvpair-error")
    return (
        int(response.code),
        node[0].decode() if node else None,
        error[0].decode() if error else None,
    )


async def ollama_error(port: int, model: str) -> tuple[int, str | None, object]:
    """POST /api/generate for ``model``; (status, X-Nvpair-Error, the answer)."""
    response = await treq.post(
        f"http://127.0.0.1:{port}/api/generate",
        json.dumps({"model": model, "prompt": "hi", "stream": False}).encode(),
        timeout=20,
    )
    reason = response.headers.getRawHeaders(b"x-nvpair-error")
    return (
        int(response.code),
        reason[0].decode() if reason else None,
        json.loads(await response.content()),
    )


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


def started(*sims: SimEngine) -> list[SimEngine]:
    for sim in sims:
        sim.listen()
    return list(sims)


async def stopped(sims: Sequence[SimEngine]) -> None:
    for sim in sims:
        await sim.stop()


@pytest_twisted.ensureDeferred
async def test_a_warm_node_wins_over_a_lower_id(tmp_path: Path) -> None:
    """``a`` would be first by id, but only ``b`` has llama3 in memory (``/api/ps``): ``b``
    serves at once and ``a`` never loads it."""
    sims = started(
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="a", load_delay=5, warm=()),
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="b", load_delay=5),
    )
    a = sims[0]
    port = free_port()
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(fleet_file(tmp_path, "ollama", port, sims))
        ) as proxy:
            await polled(sims, "/api/ps")
            for _ in range(3):
                began = reactor.seconds()
                assert await generate(port) == (200, "b", None)
                assert reactor.seconds() - began < 2
            assert posts(a) == 0 and a.memory.loads == 0
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)


@pytest_twisted.ensureDeferred
async def test_a_second_request_joins_the_load_the_first_set_off(tmp_path: Path) -> None:
    """Both nodes cold, polled once and not again for a minute: a request for llama3 goes to
    ``a`` (by id), and a second one sent while ``a`` loads goes to ``a`` too, which counts as
    loading llama3 from the first dispatch on — not to ``b``, which would load it a second time
    (docs/fleet-scheduling.md#dispatched-is-loading)."""
    sims = started(
        *(
            SimEngine(reactor, "ollama", models=["llama3:latest"], node=n, load_delay=1.5, warm=())
            for n in ("a", "b")
        )
    )
    a, b = sims
    port = free_port()
    # The plain order's rule: with the queue, a's one place (Ollama runs one request per model
    # by default) is taken, and the second request starts at once where it can, loading on b.
    fleet = fleet_file(tmp_path, "ollama", port, sims, interval="60s", queue=False)
    try:
        async with running_proxy(tmp_path, "--fleet", str(fleet)) as proxy:

            async def in_discovery() -> bool:
                if not all(polls(s, "/api/ps") >= 1 for s in sims):
                    return False
                try:
                    response = await treq.get(f"http://127.0.0.1:{port}/api/tags", timeout=5)
                except ConnectionRefusedError:
                    return False  # not listening yet
                return bool((await response.json()).get("models"))

            await eventually(in_discovery, "the first polls")
            await sleep(0.2)
            polled_before = [polls(s, "/api/ps") for s in sims]
            first = Deferred.fromCoroutine(generate(port))

            async def dispatched() -> bool:
                return posts(a) + posts(b) >= 1

            await eventually(dispatched, "the first dispatch")
            assert a.memory.loading("llama3:latest")
            assert await generate(port) == (200, "a", None)
            assert await first == (200, "a", None)
            # No poll came between: only the dispatch told the proxy.
            assert [polls(s, "/api/ps") for s in sims] == polled_before
            assert (a.memory.loads, b.memory.loads) == (1, 0) and posts(b) == 0
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)


@pytest_twisted.ensureDeferred
async def test_a_loading_node_is_skipped(tmp_path: Path) -> None:
    """``a`` restarts its llama-server (503 ``Loading model`` everywhere, ``/health`` included):
    it stays in discovery as loading, and requests go to ``b`` without touching it, even when
    ``b`` fails them."""
    sims = started(
        SimEngine(reactor, "llamacpp", models=["tiny"], node="a", load_delay=60),
        SimEngine(reactor, "llamacpp", models=["tiny"], node="b"),
    )
    a = sims[0]
    port = free_port()
    try:
        async with running_proxy(
            tmp_path,
            "--fleet",
            str(fleet_file(tmp_path, "llamacpp", port, sims)),
            "--retry-backoff",
            "50ms",
        ) as proxy:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()

            async def served_by(status: int = 200) -> str | None:
                response = await treq.post(url, body, timeout=20)
                await response.content()
                assert response.code == status
                node = response.headers.getRawHeaders(b"x-nvpair-node")
                return node[0].decode() if node else None

            await polled(sims, "/health")
            assert await served_by() == "a"
            a.memory.load("tiny")
            await polled([a], "/health")
            before = posts(a)
            for _ in range(4):
                assert await served_by() == "b"
            # Every attempt goes to b, none to the loading a: the final one answers b's 500.
            sims[1].faults.status = 500
            assert await served_by(500) == "b"
            assert posts(a) == before
            # Loading, not gone: ``a`` never left discovery.
            assert not any("a left llamacpp discovery" in str(r.get("msg")) for r in proxy.logs)
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)


@pytest_twisted.ensureDeferred
async def test_a_failing_node_is_held_back_and_returns(tmp_path: Path) -> None:
    """``a`` answers 500 to everything: after two failures it is held back (requests go to ``b``
    straight away), tried once per cool-down, and serves again once it recovers."""
    sims = started(
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"),
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"),
    )
    a = sims[0]
    a.faults.status = 500
    port = free_port()
    args = ["--fail-threshold", "2", "--cooldown", "1s", "--cooldown-max", "8s"]
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(fleet_file(tmp_path, "ollama", port, sims)), *args
        ) as proxy:
            await polled(sims, "/api/ps")
            for _ in range(2):
                assert await generate(port) == (200, "b", None)
            assert posts(a) == 2
            await proxy.wait_for_log(lambda r: "held back" in str(r.get("msg", "")))
            for _ in range(5):
                assert await generate(port) == (200, "b", None)
            assert posts(a) == 2
            # The cool-down (1 s) ends: one trial, which fails; the next cool-down is 2 s.
            await sleep(1.1)
            for _ in range(3):
                assert await generate(port) == (200, "b", None)
            assert posts(a) == 3
            a.faults.clear()
            await sleep(2.1)
            assert await generate(port) == (200, "a", None)
            assert posts(a) == 4
            # Healthy again: it takes turns with b, equally warm, the one dispatched to least
            # recently first (docs/fleet-scheduling.md#ties-spread).
            assert await generate(port) == (200, "b", None)
            assert await generate(port) == (200, "a", None)
            await proxy.wait_for_log(lambda r: "answers again" in str(r.get("msg", "")))
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)


@pytest_twisted.ensureDeferred
async def test_a_request_whose_owners_vanished_gives_up_after_owner_wait(tmp_path: Path) -> None:
    """The only owner fails once and is switched off: 503 ``no-owner-timeout`` after about
    ``--owner-wait``, not the ten-minute job deadline."""
    sims = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"))
    (a,) = sims
    a.faults.status = 503
    a.faults.header_delay = 0.3
    port = free_port()
    args = ["--owner-wait", "1s", "--retry-backoff", "100ms", "--max-dispatch-attempts", "50"]
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(fleet_file(tmp_path, "ollama", port, sims)), *args
        ) as proxy:
            await polled(sims, "/api/tags")
            began = reactor.seconds()
            result: list[tuple[int, str | None, object]] = []
            asked = Deferred.fromCoroutine(ollama_error(port, "llama3")).addCallback(result.append)

            async def dispatched() -> bool:
                return posts(a) >= 1

            await eventually(dispatched)
            await a.refuse()
            await asked
            elapsed = reactor.seconds() - began
            # Issue 20 item 2: the answer names the wait that ran out, not the deadline.
            message = (
                'no node serving model "llama3" came back within the owner wait (--owner-wait 1s)'
            )
            assert result == [(503, "no-owner-timeout", {"error": message})]
            assert 1.0 <= elapsed < 8.0
            assert log_problems(proxy) == []
    finally:
        await stopped(sims)
