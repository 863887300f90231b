"""The cold-start mix's pure parts: the seeded workload, the placement, the summary."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from bench.mixload import (
    MODELS,
    NODES,
    PLACEMENT,
    WAITED_MS,
    Mix,
    Outcome,
    models_of,
    offered_concurrency,
    summarize,
    workload,
    zipf_weights,
)

LONG = Mix(seconds=4000)


def test_the_same_seed_gives_the_same_workload() -> None:
    """Both orders of a round meet exactly the same requests, byte for byte."""
    first, again = workload(13, Mix()), workload(13, Mix())
    assert first == again
    assert [r.body() for r in first] == [r.body() for r in again]
    assert workload(14, Mix()) != first


def test_arrivals_are_ordered_within_the_run_at_the_mean_rate() -> None:
    requests = workload(1, LONG)
    times = [r.at for r in requests]
    assert times == sorted(times)
    assert times[0] > 0 and times[-1] < LONG.seconds
    assert len(requests) / LONG.seconds == pytest.approx(LONG.rate, rel=0.05)


def test_poisson_gaps_are_exponential() -> None:
    """The coefficient of variation of exponential gaps is 1 (evenly spaced would be 0)."""
    times = [r.at for r in workload(2, LONG)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean = sum(gaps) / len(gaps)
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert spread / mean == pytest.approx(1, abs=0.1)


def test_popularity_follows_the_zipf_weights() -> None:
    weights = zipf_weights(6, 1.0)
    assert sum(weights) == pytest.approx(1)
    assert weights == sorted(weights, reverse=True)
    assert weights[0] / weights[1] == pytest.approx(2)
    requests = workload(3, LONG)
    counts = Counter(r.model for r in requests)
    for model, weight in zip(MODELS, weights, strict=True):
        assert counts[model] / len(requests) == pytest.approx(weight, abs=0.02)


def test_the_mix_of_routes_streams_and_lengths() -> None:
    requests = workload(4, LONG)
    streamed = sum(r.stream for r in requests) / len(requests)
    chat = sum(r.chat for r in requests) / len(requests)
    assert streamed == pytest.approx(LONG.stream_share, abs=0.03)
    assert chat == pytest.approx(LONG.chat_share, abs=0.03)
    low, high = LONG.tokens
    assert all(low <= r.tokens <= high for r in requests)
    # Log-uniform: as many answers below the geometric middle as above it.
    middle = (low * high) ** 0.5
    assert sum(r.tokens < middle for r in requests) / len(requests) == pytest.approx(0.5, abs=0.03)


def test_a_request_body_is_what_an_ollama_client_sends() -> None:
    chat = next(r for r in workload(5, Mix()) if r.chat)
    plain = next(r for r in workload(5, Mix()) if not r.chat)
    assert chat.path == "/api/chat" and plain.path == "/api/generate"
    body = json.loads(chat.body())
    assert body["model"] == chat.model
    assert body["messages"] == [{"role": "user", "content": chat.prompt}]
    assert body["stream"] is chat.stream
    assert body["options"] == {"num_predict": chat.tokens}
    assert json.loads(plain.body())["prompt"] == plain.prompt


def test_placement_makes_the_choice_of_node_matter() -> None:
    """Every model has an owner; the most asked-for is everywhere, others on two or three."""
    assert [model for model, _ in PLACEMENT] == list(MODELS)
    sizes = [len(nodes) for _, nodes in PLACEMENT]
    assert sizes[0] == len(NODES)
    assert all(2 <= size <= 3 for size in sizes[1:])
    assert all(set(nodes) <= set(NODES) for _, nodes in PLACEMENT)
    assert models_of("n0") == ("llama3.1:8b", "qwen2.5:7b", "gemma2:9b")
    assert sum(len(models_of(n)) for n in NODES) == sum(sizes)


def test_the_default_mix_runs_more_than_one_request_at_once() -> None:
    """Least-reservations order spreads only under concurrency: the default mix has it."""
    mix = Mix()
    assert offered_concurrency(workload(13, mix), mix) > 1.5


def test_summary_takes_ttft_from_streamed_answers_only() -> None:
    outcomes = [
        Outcome(True, 200, 3.0, "n0"),
        Outcome(True, 200, 2004.0, "n1"),
        Outcome(True, 200, 4.0, "n0"),
        Outcome(False, 200, 1500.0, "n2"),
        Outcome(True, 502, 1.0, "", "status 502"),
        Outcome(True, None, None, "", "TimeoutError: "),
    ]
    summary = summarize(outcomes)
    assert summary.requests == 6
    assert summary.failed == 2
    assert summary.ttft_p50_ms == 4.0  # nearest rank of 3, 4, 2004
    assert summary.ttft_p99_ms == 2004.0
    assert summary.answer_p50_ms == 1500.0
    assert summary.waited == 1
    assert summary.served == {"n0": 2, "n1": 1, "n2": 1}


def test_summary_of_nothing_answered() -> None:
    summary = summarize([Outcome(True, 503, 2.0, "n0", "status 503")])
    assert summary.ttft_p50_ms is None and summary.ttft_p99_ms is None
    assert summary.answer_p50_ms is None
    assert (summary.failed, summary.waited, summary.served) == (1, 0, {})


def test_a_wait_is_a_first_token_later_than_the_threshold() -> None:
    late = summarize([Outcome(True, 200, WAITED_MS + 1), Outcome(True, 200, WAITED_MS)])
    assert late.waited == 1


def test_a_flat_popularity_asks_for_every_model_alike() -> None:
    """``--coldstart-zipf 0``: what the bench then runs is a uniform mix."""
    counts = Counter(request.model for request in workload(13, Mix(seconds=4000, zipf=0.0)))
    assert set(counts) == set(MODELS)
    assert max(counts.values()) < 1.25 * min(counts.values())
