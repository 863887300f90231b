"""``/metrics`` of the admin listener through the real ``twistd -n nvpair-proxy``
(issue 12 item 1, issue 20 item 1; docs/operations.md#metrics): after a request that failed
over and one for a model nobody has, the families say what happened, with operational labels
only; every route class's success is ``served``; each configured node's ``nvpair_node_up``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor
from twisted.internet.error import ConnectionRefusedError
from twisted.web.http_headers import Headers

from nvpair.sim import SimEngine
from tests.certs import make_identity, write_cluster_dir
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port, log_problems, write_fleet
from tests.integration.test_cluster_nodes import member
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get, by_id
from tests.integration.test_fleet_schedules import generate, started, stopped
from tests.integration.test_status_page import CANARY, chat, failing_over

pytestmark = pytest.mark.integration

ALICE, BOB = make_identity("alice"), make_identity("bob")

Labels = tuple[tuple[str, str], ...]


async def scrape(admin: int) -> tuple[str, dict[str, dict[Labels, float]]]:
    response = await treq.get(f"http://127.0.0.1:{admin}/metrics", timeout=10)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
    text = (await response.content()).decode()
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return text, samples


def labels(**values: str) -> Labels:
    return tuple(sorted(values.items()))


@pytest_twisted.ensureDeferred
async def test_metrics_count_a_failover_and_a_refusal(tmp_path: Path) -> None:
    async with failing_over(tmp_path, "a", "b") as (_proxy, port, admin):
        assert (await chat(port))[:2] == (200, "b")
        missing = await treq.post(
            f"http://127.0.0.1:{port}/api/generate",
            b'{"model": "nobody-has-it", "prompt": "x"}',
            timeout=10,
        )
        await missing.content()
        assert missing.code == 502

        async def counted() -> bool:
            _, samples = await scrape(admin)
            return len(samples.get("nvpair_requests_total", {})) >= 2

        await eventually(counted, "both requests counted")
        text, got = await scrape(admin)
        assert got["nvpair_requests_total"] == {
            labels(engine="ollama", route="inference", outcome="served"): 1,
            labels(engine="ollama", route="inference", outcome="no-owner"): 1,
        }
        assert got["nvpair_attempts_total"] == {
            labels(engine="ollama", node="a", result="status"): 1,
            labels(engine="ollama", node="b", result="served"): 1,
        }
        assert got["nvpair_failovers_total"] == {labels(engine="ollama"): 1}
        assert got["nvpair_time_to_first_byte_seconds_count"] == {labels(engine="ollama"): 1}
        duration = got["nvpair_request_duration_seconds_count"]
        assert duration == {labels(engine="ollama", route="inference"): 2}
        # The simulated Ollama reports its counts and eval rate: the engine's own figures.
        tokens = got["nvpair_tokens_total"]
        assert tokens[labels(engine="ollama", kind="completion")] > 0
        assert got["nvpair_tokens_per_second_count"] == {labels(engine="ollama"): 1}
        assert got["nvpair_facade_up"] == {labels(engine="ollama"): 1}
        assert got["nvpair_discovery_nodes"] == {labels(engine="ollama"): 2}
        # Nothing in flight any more: the family is there, without a sample.
        assert "# TYPE nvpair_in_flight gauge" in text and "nvpair_in_flight" not in got
        assert "process_resident_memory_bytes" in got
        # Operational labels only: neither the prompt nor the unknown model's name.
        assert CANARY not in text and "nobody-has-it" not in text


async def answered(method: str, url: str, body: bytes | None = None, **headers: str) -> int:
    """The status of one request, its body read to the end."""
    response = await treq.request(
        method,
        url,
        data=body,
        headers=Headers({name.replace("_", "-"): [value] for name, value in headers.items()}),
        timeout=10,
    )
    await response.content()
    return int(response.code)


@pytest_twisted.ensureDeferred
async def test_every_route_class_served_is_counted_served(tmp_path: Path) -> None:
    """One request of each route class, each answered by an engine: ``outcome="served"`` for
    every one — a merged model list and a preflight included, which were counted as
    ``internal`` (a bug's 500) — and nothing else counted.

    Node B (with the admin listener) serves its llama.cpp facade's plaintext clients from its
    discovery and node A's peer requests, over pinned mutual TLS, from its own engine."""
    a_dir = write_cluster_dir(tmp_path / "a-cluster", ALICE, [BOB])
    b_dir = write_cluster_dir(tmp_path / "b-cluster", BOB, [ALICE])
    a_port, b_port, admin = free_port(), free_port(), free_port()
    async with (
        sims(("llamacpp", ["tiny"], "engine")) as (engine,),
        running_proxy(tmp_path / "a", "--cluster-dir", str(a_dir)) as a,
        running_proxy(tmp_path / "b", "--cluster-dir", str(b_dir), "--admin-port", str(admin)) as b,
    ):
        await member(b, "llamacpp", b_port)
        b.notify("llamacpp:node/set-local-backend", {"url": engine.url})
        b.discovery("llamacpp", [{"id": "engine", "url": engine.url, "models": ["tiny"]}])
        await b.barrier()
        await member(a, "llamacpp", a_port)
        a.discovery(
            "llamacpp", [{"id": "bob", "url": f"https://127.0.0.1:{b_port}", "models": ["tiny"]}]
        )
        await a.barrier()

        at_b = f"http://127.0.0.1:{b_port}"
        completion = json.dumps({"prompt": "hi", "n_predict": 2}).encode()
        assert await answered("POST", f"{at_b}/completion", completion) == 200
        assert await answered("GET", f"{at_b}/v1/models") == 200
        preflight = await answered(
            "OPTIONS",
            f"{at_b}/completion",
            origin="http://localhost:3000",
            access_control_request_method="POST",
        )
        assert preflight == 204  # granted: the intersection of every engine's answer
        assert await answered("GET", f"{at_b}/health") == 200
        # A's inference request, sent to B over mutual TLS: a peer request at B.
        assert await answered("POST", f"http://127.0.0.1:{a_port}/completion", completion) == 200
        assert [r.path for r in engine.requests if r.method != "OPTIONS"].count("/completion") == 2

        async def all_counted() -> bool:
            _, samples = await scrape(admin)
            return sum(samples.get("nvpair_requests_total", {}).values()) >= 5

        await eventually(all_counted, "five requests counted")
        _, got = await scrape(admin)
        assert got["nvpair_requests_total"] == {
            labels(engine="llamacpp", route=route, outcome="served"): 1
            for route in ("inference", "inventory", "preflight", "other", "peer")
        }
        assert got["nvpair_request_duration_seconds_count"] == {
            labels(engine="llamacpp", route=route): 1
            for route in ("inference", "inventory", "preflight", "other", "peer")
        }
        assert log_problems(b) == []


@pytest_twisted.ensureDeferred
async def test_node_up_per_configured_node(tmp_path: Path) -> None:
    """``nvpair_node_up{engine,node}``: 1 for a node that answers, 0 for one whose poll fails
    (down) and for one that passive health holds back; the held-back node is 1 again once
    its cool-down is over and its engine still answers."""
    a, b = started(
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"),
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"),
    )
    a.faults.status = 503
    port, admin = free_port(), free_port()
    nodes = {"a": a.url, "b": b.url, "gone": f"http://127.0.0.1:{free_port()}"}
    fleet = write_fleet(tmp_path / "fleet.toml", port, nodes)
    args = ["--fail-threshold", "1", "--cooldown", "2s", "--admin-port", str(admin)]
    try:
        async with running_proxy(tmp_path, "--fleet", str(fleet), *args) as proxy:

            async def polled() -> bool:
                try:
                    _, status = await admin_get(admin, "/status")
                except ConnectionRefusedError:
                    return False
                states = {n["id"]: n["state"] for n in status["nodes"]["ollama"]}
                return states == {"a": "up", "b": "up", "gone": "down"}

            await eventually(polled, "a and b up, gone down")
            # ``a`` answers 503: the request fails over to ``b`` and ``a`` is held back.
            assert await generate(port) == (200, "b", None)
            assert by_id((await admin_get(admin, "/status"))[1])["a"]["state"] == "held-back"
            _, got = await scrape(admin)
            assert got["nvpair_node_up"] == {
                labels(engine="ollama", node="a"): 0,
                labels(engine="ollama", node="b"): 1,
                labels(engine="ollama", node="gone"): 0,
            }

            async def a_back() -> bool:
                _, samples = await scrape(admin)
                return samples["nvpair_node_up"][labels(engine="ollama", node="a")] == 1

            await eventually(a_back, "a up once its cool-down is over")
            assert log_problems(proxy) == []
    finally:
        await stopped([a, b])
