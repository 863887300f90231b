"""The fleet's queue through the real ``twistd -n nvpair-proxy --fleet`` (issue 30;
docs/fleet-scheduling.md#the-queue): two simulated llama.cpp nodes of one slot each, answers that
take a while, and callers with keys of their own on this machine (a loopback caller that shows a
key counts as that key). Requests wait in the proxy, take turns by caller, go to the first node
that frees, and the bounds answer as the docs say."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from nvpair.sim import SimEngine
from tests.integration.browser import Browser
from tests.integration.harness import ProxyProcess, free_port, write_fleet
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get
from tests.integration.test_fleet_schedules import started, stopped
from tests.integration.test_metrics_endpoint import scrape
from tests.integration.test_status_page import browser, every_node_up, keep_screenshot

__all__ = ["browser"]  # the module's headless Chromium, a fixture of test_status_page

#: What the status page shows of the queue: its rows' cells, once it has some.
READ_QUEUE = """
const [timeout, done] = [arguments[0], arguments[arguments.length - 1]];
const began = Date.now();
(function look() {
  const rows = [...document.querySelectorAll("#queue-body tr")];
  if (rows.length || Date.now() - began > timeout) {
    done(rows.map((row) => [...row.children].map((cell) => cell.textContent)));
  } else {
    setTimeout(look, 50);
  }
})();
"""

#: Seconds each answer takes before its first byte: long enough that requests pile up.
SERVICE = 0.6

KEYS = {"bulk": "normal", "alice": "normal", "batch": "low", "boss": "high"}


def secret(name: str) -> str:
    return f"nvp_{name}_secret"


@contextlib.asynccontextmanager
async def queued_fleet(
    tmp_path: Path, queue: str = ""
) -> AsyncIterator[tuple[int, int, list[SimEngine], ProxyProcess]]:
    """The proxy's llama.cpp facade over nodes ``a`` and ``b`` (one slot each), with keys
    for every caller of :data:`KEYS` and the ``[queue]`` lines given; yields the facade's
    port, the admin port, the sims and the proxy."""
    sims = started(
        *(
            SimEngine(reactor, "llamacpp", models=["tiny"], node=node, parallel=1)
            for node in ("a", "b")
        )
    )
    for sim in sims:
        sim.faults.first_byte_delay = SERVICE
    keys = tmp_path / "keys.toml"
    keys.write_text(
        "".join(
            f'[[keys]]\nname = "{name}"\n'
            f'sha256 = "{hashlib.sha256(secret(name).encode()).hexdigest()}"\n'
            f'priority = "{priority}"\n'
            for name, priority in KEYS.items()
        )
    )
    port, admin = free_port(), free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {s.node: s.url for s in sims}, "llamacpp")
    with fleet.open("a") as text:
        text.write('[access]\nnetworks = ["192.0.2.0/24"]\nkeys = "keys.toml"\n' + queue)
    try:
        async with every_node_up(tmp_path, fleet, admin) as proxy:
            yield port, admin, sims, proxy
    finally:
        await stopped(sims)


async def ask(port: int, caller: str, tag: str) -> tuple[str, int, str | None, str | None]:
    """A chat completion as ``caller``: (tag, status, X-Nvpair-Node, X-Nvpair-Queued-Ms)."""
    response = await treq.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps({"model": "tiny", "messages": [{"role": "user", "content": tag}]}).encode(),
        headers=Headers(
            {
                b"Content-Type": [b"application/json"],
                b"Authorization": [f"Bearer {secret(caller)}".encode()],
            }
        ),
        timeout=60,
    )
    await response.content()
    headers = response.headers
    node = headers.getRawHeaders(b"x-nvpair-node", [None])[0]
    queued = headers.getRawHeaders(b"x-nvpair-queued-ms", [None])[0]
    return (
        tag,
        response.code,
        node.decode() if node is not None else None,
        queued.decode() if queued is not None else None,
    )


async def spaced(*requests: tuple[int, str, str]) -> list[tuple[str, int, str | None, str | None]]:
    """Each request sent 50 ms after the one before (so their arrival order is theirs), all
    awaited; the answers in the order they finished."""
    finished: list[tuple[str, int, str | None, str | None]] = []
    pending = []
    for port, caller, tag in requests:
        d = Deferred.fromCoroutine(ask(port, caller, tag))
        d.addCallback(finished.append)
        pending.append(d)
        await task.deferLater(reactor, 0.05, lambda: None)
    await gatherResults(pending)
    return finished


@pytest_twisted.ensureDeferred
async def test_callers_take_turns_and_a_place_goes_to_the_first_node_that_frees(
    tmp_path: Path,
) -> None:
    """Six of one caller's requests, then one of another's of the same priority: the second
    caller's goes third, not seventh; no node ever runs two at once; those that waited say how
    long."""
    async with queued_fleet(tmp_path) as (port, _admin, sims, _proxy):
        most = {sim.node: 0 for sim in sims}

        def sample() -> None:
            for sim in sims:
                most[sim.node] = max(most[sim.node], sim.in_flight)

        sampler = task.LoopingCall(sample)
        sampler.start(0.01)
        burst = [(port, "bulk", f"batch-{n}") for n in range(6)]
        finished = await spaced(*burst, (port, "alice", "alice"))
        sampler.stop()
    order = [tag for tag, *_ in finished]
    assert all(status == 200 for _, status, _, _ in finished)
    # Two places at once: batch-0 and batch-1 start; then alice, whose turn comes before the
    # batch's third (callers take turns), on whichever node frees first.
    assert order.index("alice") <= 3, order
    assert [tag for tag in order if tag.startswith("batch")] == [f"batch-{n}" for n in range(6)]
    waited = {tag: queued for tag, _, _, queued in finished}
    assert waited["batch-0"] is None and waited["batch-1"] is None
    assert waited["alice"] is not None and int(waited["alice"]) > 0
    assert {node for _, _, node, _ in finished} == {"a", "b"}
    # Nothing dispatched beyond a node's one slot: each sim ran its answers one at a time.
    assert most == {"a": 1, "b": 1}


@pytest_twisted.ensureDeferred
async def test_a_high_priority_key_goes_before_a_low_one_already_waiting(tmp_path: Path) -> None:
    async with queued_fleet(tmp_path) as (port, _admin, _sims, _proxy):
        finished = await spaced(
            *[(port, "batch", f"batch-{n}") for n in range(5)], (port, "boss", "boss")
        )
    order = [tag for tag, *_ in finished]
    assert order.index("boss") <= 2, order


@pytest_twisted.ensureDeferred
async def test_the_queue_is_bounded_in_depth_and_in_time(tmp_path: Path) -> None:
    """``max-depth`` 1: a second waiter is 429 ``queue-full`` at once; ``max-wait`` 1s: a
    waiter not placed by then is 503 ``queue-timeout``; both say when to come back."""
    async with queued_fleet(tmp_path, '[queue]\nmax-depth = 1\nmax-wait = "1s"\n') as (
        port,
        _admin,
        sims,
        _proxy,
    ):
        for sim in sims:
            sim.faults.first_byte_delay = 3.0
        running = [Deferred.fromCoroutine(ask(port, "batch", f"run-{n}")) for n in range(2)]
        await task.deferLater(reactor, 0.3, lambda: None)
        waiting = Deferred.fromCoroutine(ask(port, "alice", "waits"))
        await task.deferLater(reactor, 0.2, lambda: None)
        full = await raw_post(port, "alice")
        assert full[0] == 429 and full[1]["x-nvpair-error"] == "queue-full"
        assert int(full[1]["retry-after"]) >= 1
        _, status, _, queued = await waiting
        assert status == 503 and queued is not None and 900 <= int(queued) <= 2500
        timed_out = await raw_post(port, "alice")
        assert timed_out[0] in (429, 503)
        await gatherResults(running)


async def raw_post(port: int, caller: str) -> tuple[int, dict[str, str]]:
    response = await treq.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        b'{"model":"tiny","messages":[{"role":"user","content":"x"}]}',
        headers=Headers({b"Authorization": [f"Bearer {secret(caller)}".encode()]}),
        timeout=30,
    )
    await response.content()
    return response.code, {
        name.decode().lower(): values[0].decode()
        for name, values in response.headers.getAllRawHeaders()
    }


@pytest_twisted.ensureDeferred
async def test_a_caller_that_leaves_while_waiting_is_never_dispatched(tmp_path: Path) -> None:
    async with queued_fleet(tmp_path) as (port, _admin, sims, _proxy):
        for sim in sims:
            sim.faults.first_byte_delay = 1.5
        running = [Deferred.fromCoroutine(ask(port, "batch", f"run-{n}")) for n in range(2)]
        await task.deferLater(reactor, 0.3, lambda: None)
        leaving = treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            b'{"model":"tiny","messages":[{"role":"user","content":"leaves"}]}',
            headers=Headers({b"Authorization": [f"Bearer {secret('alice')}".encode()]}),
        )
        await task.deferLater(reactor, 0.3, lambda: None)
        leaving.cancel()
        leaving.addErrback(lambda failure: None)
        await gatherResults(running)
        await task.deferLater(reactor, 0.5, lambda: None)
        contents = [r.body for sim in sims for r in sim.requests if r.method == "POST"]
    assert len(contents) == 2 and not any(b"leaves" in body for body in contents)


@pytest_twisted.ensureDeferred
async def test_the_operator_sees_who_waits_for_what(tmp_path: Path, browser: Browser) -> None:
    """``/status`` ``queue`` while requests wait (per facade and model, per caller), the status
    page's "Waiting" table (a screenshot is kept), each ``recent`` entry's ``queuedMs``, and
    the metrics: depth while waiting, the wait after."""
    async with queued_fleet(tmp_path) as (port, admin, sims, _proxy):
        for sim in sims:
            sim.faults.first_byte_delay = 1.5
        pending = [Deferred.fromCoroutine(ask(port, "bulk", f"bulk-{n}")) for n in range(4)]
        await task.deferLater(reactor, 0.3, lambda: None)
        pending.append(Deferred.fromCoroutine(ask(port, "alice", "alice")))
        await task.deferLater(reactor, 0.3, lambda: None)
        _, status = await admin_get(admin, "/status")
        waiting = status["queue"]["waiting"]["llamacpp"]["tiny"]
        assert waiting["waiting"] == 3 and waiting["oldestMs"] >= 200
        assert waiting["callers"] == {"key:bulk": 2, "key:alice": 1}
        assert status["queue"]["maxDepth"] == 256 and status["queue"]["enabled"] is True
        text, _ = await scrape(admin)
        assert 'nvpair_queue_depth{engine="llamacpp",model="tiny"} 3.0' in text

        def page() -> tuple[list[list[str]], bytes]:
            browser.navigate(f"http://127.0.0.1:{admin}/")
            return browser.execute_async(READ_QUEUE, 5_000), browser.screenshot()

        rows, png = await deferToThread(page)
        keep_screenshot(png, tmp_path / "issue30-queue.png")
        assert [row[:3] + row[4:] for row in rows] == [
            ["llamacpp", "tiny", "3", "key:alice \u00d71, key:bulk \u00d72"]
        ], rows
        await gatherResults(pending)
        _, status = await admin_get(admin, "/status")
        queued = sorted(w["queuedMs"] or 0 for w in status["recent"])
        assert queued[:2] == [0, 0] and all(ms > 0 for ms in queued[2:]), queued
        text, _ = await scrape(admin)
        assert 'nvpair_queue_wait_seconds_count{engine="llamacpp"} 3.0' in text
        assert 'nvpair_queue_depth{engine="llamacpp",model="tiny"}' not in text


@pytest_twisted.ensureDeferred
async def test_a_reload_re_reads_the_queue_and_keeps_who_waits(tmp_path: Path) -> None:
    """SIGHUP with a new ``[queue]``: the bounds in ``/status`` change, and the requests
    already waiting keep their place and are served."""
    async with queued_fleet(tmp_path) as (port, admin, sims, proxy):
        for sim in sims:
            sim.faults.first_byte_delay = 1.0
        pending = [Deferred.fromCoroutine(ask(port, "bulk", f"bulk-{n}")) for n in range(4)]
        await task.deferLater(reactor, 0.3, lambda: None)
        _, status = await admin_get(admin, "/status")
        assert status["queue"]["waiting"]["llamacpp"]["tiny"]["waiting"] == 2
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(fleet.read_text() + "[queue]\nmax-depth = 7\n")
        os.kill(proxy.pid, signal.SIGHUP)

        async def reloaded() -> bool:
            _, status = await admin_get(admin, "/status")
            return bool(status["queue"]["maxDepth"] == 7)

        await eventually(reloaded, "the new [queue]")
        answers = await gatherResults(pending)
    assert [status for _, status, _, _ in answers] == [200] * 4
    assert sum(queued is not None for _, _, _, queued in answers) == 2
