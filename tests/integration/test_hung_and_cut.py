"""A hung node and a cut stream as an operator sees them, through the real
``twistd -n nvpair-proxy --fleet`` with an admin listener (issue 22 items 6 and 7;
docs/fleet-scheduling.md#hung-nodes, docs/operations.md#recent-workloads).

A stream its engine cuts (the simulator's die-mid-stream knobs: a chunked stream without its
final chunk, a ``Content-Length`` body short of its length) is a ``completed`` workload whose
attempt is ``truncated`` in ``/status`` and in ``nvpair_attempts_total``. A simulated engine
in a process of its own, stopped with SIGSTOP, is found hung by the liveness probes: the
request waiting on it fails over, ``/status`` says ``hung`` and why, ``nvpair_node_up`` is 0,
and with SIGCONT it is back. The status page shows the two together with a keyed caller's
request, as issue 22's closing note asks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from nvpair.fleet.lanconfig import new_key
from nvpair.sim import SimEngine
from tests.integration.browser import Browser
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get, by_id
from tests.integration.test_fleet_schedules import generate, started, stopped
from tests.integration.test_metrics_endpoint import labels, scrape
from tests.integration.test_status_page import (
    browser,
    keep_screenshot,
    page_and_screenshot,
    settled,
)

pytestmark = pytest.mark.integration

#: A hung Ollama's ``why``: two probes made it hung, and the count goes on while it lasts.
HUNG_WHY = re.compile(r"no answer to ([2-9]|\d\d+) liveness probes in a row \(GET /, 2s each\)")

__all__ = ["browser"]  # the module's headless Chromium, a fixture of test_status_page


@contextlib.asynccontextmanager
async def fleet_with_admin(
    tmp_path: Path, nodes: dict[str, str], *args: str, access: str = ""
) -> AsyncIterator[tuple[ProxyProcess, int, int]]:
    """The proxy's Ollama facade over ``nodes`` with an admin listener (and ``access``, an
    ``[access]`` table, at the fleet file's end), once every node is up; yields the proxy, the
    facade's port and the admin port."""
    port, admin = free_port(), free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, nodes)
    with fleet.open("a") as text:
        text.write(access)
    async with running_proxy(
        tmp_path, "--fleet", str(fleet), "--admin-port", str(admin), *args
    ) as proxy:

        async def all_up() -> bool:
            try:
                _, status = await admin_get(admin, "/status")
            except ConnectionRefusedError:
                return False
            return all(n["state"] == "up" for n in status["nodes"]["ollama"])

        await eventually(all_up, "every node up")
        yield proxy, port, admin


async def cut_answer(port: int, stream: bool) -> tuple[int, str]:
    """POST /api/generate; its status, and how its body ended (``whole`` or the error)."""
    response = await treq.post(
        f"http://127.0.0.1:{port}/api/generate",
        json.dumps({"model": "llama3", "prompt": "hi", "stream": stream}).encode(),
        timeout=20,
    )
    try:
        await response.content()
    except Exception as error:
        return int(response.code), type(error).__name__
    return int(response.code), "whole"


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    ("stream", "knob"), [(True, "die_after_chunks"), (False, "die_after_bytes")]
)
async def test_a_stream_its_engine_cuts_is_a_truncated_attempt(
    tmp_path: Path, stream: bool, knob: str
) -> None:
    """The node dies mid-body (a chunked stream after two chunks; a ``Content-Length`` body
    after 9 bytes): the client sees the cut, the workload is ``completed`` all the same, and
    its one attempt is ``truncated`` with its 200 in ``/status`` and in ``/metrics``, and its
    access line's outcome is ``truncated`` where the request counter's stays ``served``. A
    whole answer before it stays ``served``."""
    (a,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"))
    try:
        nodes = {"a": a.url}
        async with fleet_with_admin(tmp_path, nodes, "--log-level", "debug", "--access-log") as (
            proxy,
            port,
            admin,
        ):
            assert await cut_answer(port, stream) == (200, "whole")
            await settled(admin)
            setattr(a.faults, knob, 2 if stream else 9)
            code, ended = await cut_answer(port, stream)
            assert code == 200 and ended != "whole", ended

            async def cut_recorded() -> bool:
                _, status = await admin_get(admin, "/status")
                recent = status["recent"]
                return len(recent) == 2 and recent[0]["endedAt"] is not None

            await eventually(cut_recorded, "the cut workload's end in /status")
            _, status = await admin_get(admin, "/status")
            cut, whole = status["recent"]
            assert (cut["state"], cut["error"]) == ("completed", None)
            assert cut["attempts"] == [
                {"node": "a", "result": "truncated", "status": 200, "detail": None}
            ]
            assert [a["result"] for a in whole["attempts"]] == ["served"]
            _, got = await scrape(admin)
            assert got["nvpair_attempts_total"] == {
                labels(engine="ollama", node="a", result="served"): 1,
                labels(engine="ollama", node="a", result="truncated"): 1,
            }
            served = labels(engine="ollama", route="inference", outcome="served")
            assert got["nvpair_requests_total"][served] == 2
            outcomes = [
                r["outcome"]
                for r in proxy.logs
                if r.get("namespace", "").startswith("nvpair.facades.access")
                and r.get("route") == "inference"
            ]
            assert outcomes == ["served", "truncated"]
            # The terminal event is unchanged: completed, without an error.
            ends = [
                r
                for r in proxy.logs
                if r.get("method") in ("workload:completed", "workload:errored")
            ]
            assert [(r["method"], r["state"]) for r in ends] == [
                ("workload:completed", "completed")
            ] * 2
            assert log_problems(proxy) == []
    finally:
        await stopped([a])


# -- a hung node ------------------------------------------------------------------------------


@contextlib.contextmanager
def sim_process(node: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``python -m nvpair.sim``: one simulated Ollama serving llama3 as ``node``, in a process
    of its own so that SIGSTOP freezes it whole; its URL and process, once it answers."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "nvpair.sim", "--serve", "ollama", str(port), node, "llama3:latest"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the simulator never answered"
                time.sleep(0.1)
        yield url, process
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(timeout=20)


@pytest_twisted.ensureDeferred
async def test_a_stopped_engine_is_hung_its_request_fails_over_and_it_comes_back(
    tmp_path: Path,
) -> None:
    """``a`` (first by id) is stopped with SIGSTOP just before a request reaches it: the
    request waits on its headers until the probes find ``a`` hung (at most 6 s), then is
    answered by ``b``. ``/status`` shows ``a`` hung with the reason, ``nvpair_node_up`` is 0
    for it, the next request goes straight to ``b``; after SIGCONT ``a`` is up again."""
    (b,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"))
    try:
        with sim_process("a") as (url, frozen):
            nodes = {"a": url, "b": b.url}
            async with fleet_with_admin(tmp_path, nodes, "--log-level", "debug") as (
                proxy,
                port,
                admin,
            ):
                os.kill(frozen.pid, signal.SIGSTOP)
                began = time.monotonic()
                assert await generate(port) == (200, "b", None)
                failover = time.monotonic() - began
                print(f"request waiting on a stopped engine failed over in {failover:.2f}s")
                assert failover < 6.5
                placed = [
                    r["scheduledOn"]
                    for r in proxy.logs
                    if r.get("method") == "workload:submitted" and "scheduledOn" in r
                ]
                assert placed == ["a", "b"]
                _, status = await admin_get(admin, "/status")
                hung = by_id(status)["a"]
                assert hung["state"] == "hung"
                assert HUNG_WHY.fullmatch(hung["why"]), hung
                assert [x["result"] for x in status["recent"][0]["attempts"]] == [
                    "node_left",
                    "served",
                ]
                _, got = await scrape(admin)
                assert got["nvpair_node_up"] == {
                    labels(engine="ollama", node="a"): 0,
                    labels(engine="ollama", node="b"): 1,
                }
                began = time.monotonic()
                assert await generate(port) == (200, "b", None)
                assert time.monotonic() - began < 1
                os.kill(frozen.pid, signal.SIGCONT)

                async def back() -> bool:
                    _, status = await admin_get(admin, "/status")
                    return bool(by_id(status)["a"]["state"] == "up")

                await eventually(back, "a up again after SIGCONT")
                assert await generate(port) == (200, "a", None)
                warned = [r for r in proxy.logs if "is hung" in str(r.get("msg"))]
                assert [r["level"] for r in warned] == ["warn"]
                assert any("is no longer hung" in str(r.get("msg")) for r in proxy.logs)
                problems = [p for p in log_problems(proxy) if "is hung" not in p]
                assert problems == []
    finally:
        await stopped([b])


@pytest_twisted.ensureDeferred
async def test_with_every_owner_hung_the_client_gets_its_503_after_the_owner_wait(
    tmp_path: Path,
) -> None:
    """The only owner stopped just before the request: found hung within 6 s, the request
    waits ``--owner-wait`` (2 s here) for it to come back, then 503 ``no-owner-timeout``. A
    request arriving once it is hung is answered at once, naming it hung."""
    with sim_process("a") as (url, frozen):
        async with fleet_with_admin(tmp_path, {"a": url}, "--owner-wait", "2s") as (
            proxy,
            port,
            _admin,
        ):
            os.kill(frozen.pid, signal.SIGSTOP)
            began = time.monotonic()
            status, node, error = await generate(port)
            waited = time.monotonic() - began
            print(f"every owner hung: 503 after {waited:.2f}s with --owner-wait 2s")
            assert (status, node, error) == (503, None, "no-owner-timeout")
            assert 2 <= waited < 2 + 6.5
            response = await treq.post(
                f"http://127.0.0.1:{port}/api/generate",
                json.dumps({"model": "llama3", "prompt": "hi"}).encode(),
                timeout=10,
            )
            answer: Any = json.loads(await response.content())
            assert response.code == 502
            assert answer == {"error": 'every node that serves model "llama3" is down: a (hung)'}
            problems = [p for p in log_problems(proxy) if "is hung" not in p]
            assert problems == []


@pytest_twisted.ensureDeferred
async def test_the_status_page_shows_a_keyed_caller_a_truncated_stream_and_a_hung_node(
    tmp_path: Path, browser: Browser
) -> None:
    """In headless Chromium, one page (issue 22's closing note): ``a`` stopped shows ``hung``
    with its reason; a request with the fleet key ``laptop`` (a loopback caller showing a valid
    key counts as that key, docs/lan.md#keys) is served by ``b`` and its row names the key; a
    stream ``b`` then cuts shows its attempt ``truncated 200`` in a ``completed`` row. A
    screenshot is kept."""
    (b,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"))
    secret, block = new_key("laptop")
    (tmp_path / "keys.toml").write_text(block)
    access = '[access]\nnetworks = ["192.0.2.0/24"]\nkeys = "keys.toml"\n'
    try:
        with sim_process("a") as (url, frozen):
            async with fleet_with_admin(tmp_path, {"a": url, "b": b.url}, access=access) as (
                proxy,
                port,
                admin,
            ):
                os.kill(frozen.pid, signal.SIGSTOP)

                async def hung() -> bool:
                    _, status = await admin_get(admin, "/status")
                    return bool(by_id(status)["a"]["state"] == "hung")

                await eventually(hung, "a hung")
                keyed = await treq.post(
                    f"http://127.0.0.1:{port}/api/generate",
                    json.dumps({"model": "llama3", "prompt": "hi", "stream": False}).encode(),
                    headers=Headers({b"authorization": [b"Bearer " + secret.encode()]}),
                    timeout=20,
                )
                await keyed.content()
                assert keyed.code == 200
                await settled(admin)
                b.faults.die_after_chunks = 2
                code, ended = await cut_answer(port, stream=True)
                assert code == 200 and ended != "whole", ended

                async def both_ended() -> bool:
                    _, status = await admin_get(admin, "/status")
                    recent = status["recent"]
                    return len(recent) == 2 and recent[0]["endedAt"] is not None

                await eventually(both_ended, "the cut workload's end in /status")
                seen, png = await deferToThread(page_and_screenshot, browser, admin)
                keep_screenshot(png, tmp_path / "status-page-key-truncated-hung.png")
                cells = {c["node"]: c for c in seen["cells"]}
                assert cells["a"]["state"] == "hung", seen
                assert HUNG_WHY.search(cells["a"]["text"])
                assert cells["b"]["state"] == "up", seen
                cut, served = seen["rows"]
                assert (cut["state"], cut["key"]) == ("completed", None), seen
                assert [
                    (x["node"], x["result"], x["status"], x["text"]) for x in cut["attempts"]
                ] == [("b", "truncated", 200, "b truncated 200")], seen
                assert (served["state"], served["key"]) == ("completed", "key laptop"), seen
                assert [(x["node"], x["result"]) for x in served["attempts"]] == [
                    ("b", "served")
                ], seen
                assert [p for p in log_problems(proxy) if "is hung" not in p] == []
    finally:
        await stopped([b])
