"""``/metrics`` of the admin listener through the real ``twistd -n nvpair-proxy --fleet``
(issue 12 item 1; docs/operations.md#metrics): after a request that failed over and one for a
model nobody has, the families say what happened, with operational labels only."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_fleet import eventually
from tests.integration.test_status_page import CANARY, chat, failing_over

pytestmark = pytest.mark.integration

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
