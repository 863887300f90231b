"""JSON log lines: component, engine, levels that change live, content never copied."""

from __future__ import annotations

import io
import json

from twisted.logger import Logger, LogLevel, LogPublisher

from nvpair.logs import JsonLineObserver, parse_level


def logger_into(observer: JsonLineObserver) -> Logger:
    publisher = LogPublisher(observer)
    return Logger(namespace="test", observer=publisher)


def test_line_has_component_engine_and_message() -> None:
    out = io.StringIO()
    log = logger_into(JsonLineObserver(out))
    log.info("facade up on {port}", engine="ollama", port=11435)
    record = json.loads(out.getvalue())
    assert record["component"] == "nvpair-proxy" and record["engine"] == "ollama"
    assert record["msg"] == "facade up on 11435" and record["port"] == 11435
    assert record["level"] == "info"


def test_level_filters_and_changes_live() -> None:
    out = io.StringIO()
    observer = JsonLineObserver(out, LogLevel.info)
    log = logger_into(observer)
    log.debug("hidden")
    observer.set_level(parse_level("debug"))
    log.debug("shown")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["shown"]


def test_non_scalar_and_long_fields_are_dropped() -> None:
    """A body passed to a logger by mistake never lands in a line as a field."""
    out = io.StringIO()
    log = logger_into(JsonLineObserver(out))
    log.info("x", body=b"secret-bytes", blob={"prompt": "secret"}, text="s" * 10_000)
    record = json.loads(out.getvalue())
    assert "body" not in record and "blob" not in record and "text" not in record


def test_failures_carry_their_stack() -> None:
    out = io.StringIO()
    log = logger_into(JsonLineObserver(out))
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.failure("it broke")
    record = json.loads(out.getvalue())
    assert record["level"] == "error" and "ZeroDivisionError" in record["stack"]


def test_unknown_level_is_refused() -> None:
    try:
        parse_level("loud")
    except ValueError as bad:
        assert "debug" in str(bad)
    else:
        raise AssertionError("accepted")
