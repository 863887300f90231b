"""Fleet mode's outbox: each event one readable log record, its fields the record's own
(docs/README.md#logging: workload events go to the log at debug level, operational fields
only)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.logger import Logger, LogLevel, LogPublisher

from nvpair.broker.outboxes import LogOutbox, event_record
from nvpair.common.logs import LogObserver
from nvpair.dispatch.workload import State, Workloads


@pytest.fixture
def debug_log() -> Iterator[tuple[LogOutbox, io.StringIO]]:
    """A LogOutbox whose records land, as JSON lines at debug level, in the StringIO."""
    out = io.StringIO()
    observer = LogObserver(out, LogLevel.debug)
    outbox = LogOutbox()
    outbox.log = Logger(
        namespace="nvpair.broker.outboxes.LogOutbox", observer=LogPublisher(observer)
    )
    try:
        yield outbox, out
    finally:
        observer.set_level(LogLevel.info)  # the debug gate is process-wide


def records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_workload_event_is_one_record_with_its_fields(
    debug_log: tuple[LogOutbox, io.StringIO],
) -> None:
    """Not a JSON string inside the line: workloadId, state, node and stats are fields."""
    outbox, out = debug_log
    clock = iter(range(1000, 2000, 10))
    workloads = Workloads(outbox.notify, lambda: next(clock), run_id="r1", wanted=outbox.wanted)
    workload = workloads.admit("ollama", "llama3:latest")
    workload.submitted("node-a")
    workload.started("node-a")
    workload.terminal(State.FAILED, "cancelled", None)
    lines = records(out)
    assert [r["method"] for r in lines] == [
        "workload:submitted",
        "workload:submitted",
        "workload:started",
        "workload:errored",
    ]
    last = lines[-1]
    assert last["msg"] == (
        "workload:errored: workload 1 (ollama llama3:latest) failed on node-a: cancelled"
    )
    assert (last["workloadId"], last["state"], last["scheduledOn"]) == ("1", "failed", "node-a")
    assert (last["engine"], last["model"], last["seq"], last["runId"]) == (
        "ollama",
        "llama3:latest",
        4,
        "r1",
    )
    assert last["level"] == "debug" and "params" not in last
    assert lines[0]["msg"] == "workload:submitted: workload 1 (ollama llama3:latest) queued"


def test_stats_and_other_events_flatten() -> None:
    """A nested object's fields (stats) and lists (aliases) become plain fields."""
    template, fields = event_record(
        "workload:completed",
        {"workloadInfo": {"id": "7", "state": "completed", "stats": {"ttftMs": 12}}},
    )
    assert fields["ttftMs"] == 12 and fields["workloadId"] == "7"
    template, fields = event_record(
        "ollama:ready", {"port": 11435, "aliases": ["127.0.0.1:1", "127.0.0.1:2"], "tls": False}
    )
    assert template == "{method}"
    assert fields == {"port": 11435, "aliases": "127.0.0.1:1,127.0.0.1:2", "tls": False}
    template, fields = event_record(
        "discovery:node-activity", {"nodeId": "a", "engine": "llamacpp", "inFlight": 2}
    )
    assert template == "{method}: {engine} node {nodeId} has {inFlight} in flight"


def test_a_field_named_like_the_records_own_is_kept_apart() -> None:
    _, fields = event_record("x", {"level": "warn", "msg": "m", "format": "f"})
    assert fields == {"event_level": "warn", "event_msg": "m", "event_format": "f"}


def test_nothing_is_built_above_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    observer = LogObserver(out, LogLevel.info)
    outbox = LogOutbox()
    outbox.log = Logger(observer=LogPublisher(observer))

    def built(method: str, params: object) -> None:
        raise AssertionError(f"{method} built above debug")

    # Not only left unwritten by the observer's level: never made into a record at all.
    monkeypatch.setattr("nvpair.broker.outboxes.event_record", built)
    assert not outbox.wanted()
    outbox.notify("workload:submitted", {"workloadInfo": {"id": "1"}})
    assert out.getvalue() == ""
