"""Standalone fleet mode: the default a new user starts with
(docs/broker-protocol.md#standalone-fleet-mode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import reactor, task

from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port, run_twistd, write_fleet


async def eventually(check: object, context: object = None, timeout: float = 10.0) -> None:
    """Poll ``check()`` (an async callable returning bool) until it holds."""
    for _ in range(int(timeout / 0.1)):
        if await check():  # type: ignore[operator]
            return
        await task.deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"condition never held; {context}")


async def generates(port: int, prompt: str) -> bool:
    """Whether the Ollama facade on ``port`` answers a llama3 generation 200 now."""
    body = {"model": "llama3", "prompt": prompt, "stream": False}
    try:
        response = await treq.post(
            f"http://127.0.0.1:{port}/api/generate", json.dumps(body).encode(), timeout=5
        )
    except Exception:
        return False
    await response.content()
    return bool(response.code == 200)


@pytest_twisted.ensureDeferred
async def test_fleet_polls_inventories_and_routes(tmp_path: Path) -> None:
    """Facades from the file; a node whose poll fails leaves discovery until it answers."""
    async with sims(("ollama", ["llama3:latest"], "a"), ("ollama", ["qwen2:7b"], "b")) as (a, b):
        port = free_port()
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(
            f'inventory-interval = "100ms"\n'
            f"[facades.ollama]\nport = {port}\n"
            f'[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "{a.url}"\n'
            f'[[nodes]]\nid = "b"\n[nodes.engines]\nollama = "{b.url}"\n'
        )
        # A request caught between the node going and its poll failing waits for an owner
        # until the job deadline (docs/retry-budget.md#job-deadline); keep that short here.
        args = ("--fleet", str(fleet), "--job-deadline", "1s", "--retry-backoff", "50ms")
        async with running_proxy(tmp_path, *args) as proxy:
            url = f"http://127.0.0.1:{port}/api/generate"

            async def status(model: str) -> int:
                try:
                    response = await treq.post(
                        url,
                        json.dumps({"model": model, "prompt": "x", "stream": False}).encode(),
                        timeout=5,
                    )
                except Exception:
                    return 0
                await response.content()
                return int(response.code)

            async def served(model: str) -> bool:
                return await status(model) == 200

            async def gone(model: str) -> bool:
                return await status(model) in (502, 503)

            await eventually(lambda: served("qwen2:7b"), proxy.logs)
            await eventually(lambda: served("llama3"))
            await b.refuse()
            await eventually(lambda: gone("qwen2:7b"))
            assert await served("llama3")
            b.resume()
            await eventually(lambda: served("qwen2:7b"))
            # A model that appears on a node is picked up by the next poll.
            a.models.append("phi3:latest")
            await eventually(lambda: served("phi3"))
            assert proxy.raw_stdout == b""


def test_fleet_and_broker_are_exclusive(tmp_path: Path) -> None:
    fleet = tmp_path / "f.toml"
    fleet.write_text("[facades.ollama]\n")
    result = run_twistd(tmp_path, "--fleet", str(fleet), "--broker", "unix:path=/nonexistent")
    assert result.returncode != 0 and "mutually exclusive" in result.stderr + result.stdout


def test_bad_fleet_file_names_the_key(tmp_path: Path) -> None:
    fleet = tmp_path / "f.toml"
    fleet.write_text("[facades.vllm]\n")
    result = run_twistd(tmp_path, "--fleet", str(fleet))
    assert result.returncode != 0 and "facades.vllm" in result.stderr + result.stdout


@pytest_twisted.ensureDeferred
async def test_fleet_workload_events_are_log_records_with_their_fields(tmp_path: Path) -> None:
    """Fleet mode at debug level: each workload event is one record whose operational fields
    (workloadId, state, node, model) are fields of the record, not a JSON string in it; the
    prompt is in no line."""
    canary = "CANARY-fleet-4b1e-do-not-log"
    async with sims(("ollama", ["llama3:latest"], "a")) as (a,):
        port = free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
        args = ("--fleet", str(fleet), "--log-level", "debug")
        async with running_proxy(tmp_path, *args) as proxy:
            await eventually(lambda: generates(port, canary), proxy.logs)
            completed = await proxy.wait_for_log(lambda r: r.get("method") == "workload:completed")
    assert completed["level"] == "debug"
    assert (completed["state"], completed["scheduledOn"], completed["model"]) == (
        "completed",
        "a",
        "llama3:latest",
    )
    assert completed["msg"] == (
        f"workload:completed: workload {completed['workloadId']} (ollama llama3:latest) "
        "completed on a"
    )
    events = [r for r in proxy.logs if str(r.get("method", "")).startswith("workload:")]
    assert all("params" not in r and "workloadId" in r for r in events)
    assert canary.encode() not in proxy.raw_stderr and canary.encode() not in proxy.raw_stdout
