"""Workload events and stats for every dialect, through the real process (issue 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims
from tests.integration.harness import ProxyProcess

PROMPT = "one two three"  # the sims count 3 prompt tokens; they generate 4 tokens
CHAT = [{"role": "user", "content": PROMPT}]

# (engine, model, path, body, expected stats but ttftMs; "rate" = derived from streaming time)
CASES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "ollama",
        "llama3:latest",
        "/api/chat",
        {"messages": CHAT},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "ollama",
        "llama3:latest",
        "/api/generate",
        {"prompt": PROMPT, "stream": False},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "ollama",
        "llama3:latest",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": "rate", "estimated": False},
    ),
    (
        "ollama",
        "llama3:latest",
        "/v1/completions",
        {"prompt": PROMPT},
        {"promptTokens": 3, "completionTokens": 4, "estimated": False},
    ),
    (
        "lmstudio",
        "qwen",
        "/v1/chat/completions",
        {"messages": CHAT},
        {"promptTokens": 3, "completionTokens": 4, "estimated": False},
    ),
    (
        "lmstudio",
        "qwen",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True},
        {"completionTokens": 4, "tokensPerSecond": "rate", "estimated": True},
    ),
    (
        "lmstudio",
        "qwen",
        "/api/v0/chat/completions",
        {"messages": CHAT},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "lmstudio",
        "qwen",
        "/api/v1/chat",
        {"input": PROMPT, "stream": True},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "llamacpp",
        "tiny",
        "/completion",
        {"prompt": PROMPT, "stream": True},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "llamacpp",
        "tiny",
        "/completion",
        {"prompt": PROMPT},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "llamacpp",
        "tiny",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
    (
        "llamacpp",
        "tiny",
        "/v1/chat/completions",
        {"messages": CHAT},
        {"promptTokens": 3, "completionTokens": 4, "tokensPerSecond": 50.0, "estimated": False},
    ),
]


def workload_frames(proxy: ProxyProcess) -> list[dict[str, Any]]:
    return [f for f in proxy.frames if str(f.get("method", "")).startswith("workload:")]


@pytest.mark.parametrize(
    ("engine", "model", "path", "body", "expected"),
    CASES,
    ids=[f"{c[0]}{c[2]}-{'stream' if c[3].get('stream') else 'whole'}" for c in CASES],
)
@pytest_twisted.ensureDeferred
async def test_stats_per_dialect(
    tmp_path: Path,
    engine: str,
    model: str,
    path: str,
    body: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    async with (
        sims((engine, [model], "a")) as (sim,),
        running_proxy(tmp_path) as proxy,
    ):
        sim.chunk_interval = 0.03
        port = await enabled_proxy_for(
            proxy, engine, [{"id": "a", "url": sim.url, "models": [model]}]
        )
        response = await treq.post(
            f"http://127.0.0.1:{port}{path}", json.dumps({"model": model, **body}).encode()
        )
        await response.content()
        assert response.code == 200
        end = await proxy.wait_for_method("workload:completed")
        info = end["params"]["workloadInfo"]
        stats = dict(info["stats"])
        assert stats.pop("ttftMs") >= 0
        if expected.get("tokensPerSecond") == "rate":
            assert stats.pop("tokensPerSecond") > 0
            expected = {k: v for k, v in expected.items() if k != "tokensPerSecond"}
        assert stats == expected
        methods = [f["method"] for f in workload_frames(proxy)]
        assert methods == [
            "workload:submitted",
            "workload:submitted",
            "workload:started",
            "workload:completed",
        ]
        assert [f["params"]["workloadInfo"]["seq"] for f in workload_frames(proxy)] == [1, 2, 3, 4]


@pytest_twisted.ensureDeferred
async def test_failover_events_through_the_process(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path, "--retry-backoff", "50ms") as proxy,
    ):
        a.faults.status = 503
        nodes = [{"id": s.node, "url": s.url, "models": ["tiny"]} for s in (a, b)]
        port = await enabled_proxy_for(proxy, "llamacpp", nodes)
        response = await treq.post(f"http://127.0.0.1:{port}/completion", b'{"prompt":"x"}')
        await response.content()
        await proxy.wait_for_method("workload:completed")
        infos = [f["params"]["workloadInfo"] for f in workload_frames(proxy)]
        assert [(i["state"], i.get("scheduledOn")) for i in infos] == [
            ("queued", None),
            ("queued", "a"),
            ("queued", None),
            ("queued", "b"),
            ("running", "b"),
            ("completed", "b"),
        ]
        activity = [
            f["params"] for f in proxy.frames if f.get("method") == "discovery:node-activity"
        ]
        assert {"nodeId": "b", "engine": "llamacpp", "inFlight": 1} in activity


@pytest_twisted.ensureDeferred
async def test_client_disconnect_reports_cancelled_at_once(tmp_path: Path) -> None:
    async with (
        sims(("ollama", ["llama3:latest"], "a")) as (sim,),
        running_proxy(tmp_path) as proxy,
    ):
        sim.faults.stall = True
        port = await enabled_proxy_for(
            proxy, "ollama", [{"id": "a", "url": sim.url, "models": ["llama3:latest"]}]
        )
        d = treq.post(f"http://127.0.0.1:{port}/api/chat", b'{"model":"llama3"}')
        await proxy.wait_for(
            lambda f: (
                f.get("method") == "workload:submitted"
                and f["params"]["workloadInfo"].get("scheduledOn") == "a"
            )
        )
        d.addErrback(lambda _: None)
        d.cancel()
        errored = await proxy.wait_for_method("workload:errored", timeout=5)
        info = errored["params"]["workloadInfo"]
        assert (info["state"], info["error"]) == ("cancelled", "requester-gone")
        # Cancelled, never a node failure: the node was not retried after the client left.
        assert len(sim.requests) <= 1
