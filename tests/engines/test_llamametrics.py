"""A llama-server's busy slots read at ``/metrics`` (docs/fleet-scheduling.md#sleeping-servers):
the pure reader against text captured from a real server (``--metrics``, one of its two slots
generating; and asleep), hostile text, and the poll asking ``/metrics`` in place of ``/slots``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvpair.engines.llamametrics import metrics_slots, requests_processing
from nvpair.engines.loadstate import (
    UNKNOWN,
    Answer,
    LoadState,
    llamacpp_follow_up,
    read_llamacpp,
    read_llamacpp_slots,
)

DATA = Path(__file__).resolve().parents[1] / "data"
#: A real llama-server's /metrics, one of its two slots generating.
BUSY = (DATA / "llama-metrics-busy.prom").read_bytes()
#: The same server's /metrics asleep (answered from what it cached, without waking it).
ASLEEP = (DATA / "llama-metrics-asleep.prom").read_bytes()
PROPS = {"total_slots": 2, "endpoint_metrics": True, "endpoint_slots": True, "is_sleeping": False}


def same(key: str) -> str:
    return key


def first(props: object) -> list[Answer | None]:
    models = {"object": "list", "data": [{"id": "tiny"}]}
    return [
        Answer(200, b'{"status":"ok"}'),
        Answer(200, json.dumps(props).encode()),
        Answer(200, json.dumps(models).encode()),
    ]


def test_real_metrics_text_reads_its_busy_slots() -> None:
    assert requests_processing(BUSY, 2) == 1
    assert requests_processing(ASLEEP, 2) == 0


def test_with_metrics_on_the_poll_asks_metrics_never_slots() -> None:
    answers = first(PROPS)
    assert llamacpp_follow_up(answers) == ((None, "/metrics"),)
    state = read_llamacpp(answers, same)
    assert state == LoadState(warm_all=True, slots=2)
    read = read_llamacpp_slots(state, [(None, Answer(200, BUSY))], same)
    assert read == LoadState(warm_all=True, slots=2, busy=1)


@pytest.mark.parametrize(
    "props",
    [
        {**PROPS, "endpoint_metrics": False},
        {k: v for k, v in PROPS.items() if k != "endpoint_metrics"},
        {**PROPS, "endpoint_metrics": "true"},
        {**PROPS, "total_slots": True},
        {**PROPS, "total_slots": 0},
        {**PROPS, "total_slots": 2.0},
        {**PROPS, "total_slots": 10**30},
    ],
)
def test_without_metrics_or_a_slot_count_the_poll_asks_slots(props: object) -> None:
    assert metrics_slots(props) is None
    assert llamacpp_follow_up(first(props)) == ((None, "/slots"),)


def test_a_sleeping_server_is_asked_neither() -> None:
    assert llamacpp_follow_up(first({**PROPS, "is_sleeping": True})) == ()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"llamacpp:requests_processing NaN\n",
        b"llamacpp:requests_processing +Inf\n",
        b"llamacpp:requests_processing 1e400\n",
        b"llamacpp:requests_processing -1\n",
        b"llamacpp:requests_processing 0.5\n",
        b"llamacpp:requests_processing 3\n",  # more than its two slots
        b"llamacpp:requests_processing 1\nllamacpp:requests_processing 0\n",
        b"llamacpp:requests_processing " + b"9" * 100_000 + b"\n",
        b"llamacpp:requests_processing\n",
        b"# llamacpp:requests_processing 1\n",
        b"\xff\xfe" * 1000,
    ],
)
def test_unreadable_metrics_leave_the_slot_count_unknown(body: bytes) -> None:
    assert requests_processing(body, 2) is None
    state = read_llamacpp(first(PROPS), same)
    assert read_llamacpp_slots(state, [(None, Answer(200, body))], same) == LoadState(warm_all=True)


@pytest.mark.parametrize("answer", [None, Answer(501, BUSY), Answer(503, b"")])
def test_a_failed_metrics_answer_leaves_the_slot_count_unknown(answer: Answer | None) -> None:
    state = read_llamacpp(first(PROPS), same)
    assert read_llamacpp_slots(state, [(None, answer)], same) == LoadState(warm_all=True)
    assert read_llamacpp_slots(state, [(None, answer)], same) != UNKNOWN


def test_a_timestamped_sample_reads_too() -> None:
    assert requests_processing(b"llamacpp:requests_processing 2 1700000000000\n", 2) == 2
