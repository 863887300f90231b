"""JSON log lines: component, engine, levels that change live, content never copied."""

from __future__ import annotations

import io
import json
import re

import pytest
from twisted.logger import Logger, LogLevel, LogPublisher

from nvpair.common.logs import LogObserver, chosen_format, parse_level, parse_log_format


def logger_into(observer: LogObserver) -> Logger:
    publisher = LogPublisher(observer)
    return Logger(namespace="test", observer=publisher)


def test_line_has_component_engine_and_message() -> None:
    out = io.StringIO()
    log = logger_into(LogObserver(out))
    log.info("facade up on {port}", engine="ollama", port=11435)
    record = json.loads(out.getvalue())
    assert record["component"] == "nvpair-proxy" and record["engine"] == "ollama"
    assert record["msg"] == "facade up on 11435" and record["port"] == 11435
    assert record["level"] == "info"


def test_level_filters_and_changes_live() -> None:
    out = io.StringIO()
    observer = LogObserver(out, LogLevel.info)
    log = logger_into(observer)
    log.debug("hidden")
    observer.set_level(parse_level("debug"))
    log.debug("shown")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["shown"]


def test_non_scalar_and_long_fields_are_dropped() -> None:
    """A body passed to a logger by mistake never lands in a line as a field."""
    out = io.StringIO()
    log = logger_into(LogObserver(out))
    log.info("x", body=b"secret-bytes", blob={"prompt": "secret"}, text="s" * 10_000)
    record = json.loads(out.getvalue())
    assert "body" not in record and "blob" not in record and "text" not in record


def test_failures_carry_their_stack() -> None:
    out = io.StringIO()
    log = logger_into(LogObserver(out))
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


def test_text_lines_for_a_person() -> None:
    """Time, level, message, then the fields the message does not already say; no namespace."""
    out = io.StringIO()
    log = logger_into(LogObserver(out, text=True))
    log.warn("{node} held back: {why}", node="node-a", why="status 503", engine="ollama")
    line = out.getvalue()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} warn  node-a held back: status 503 engine=ollama\n",
        line,
    )


def test_text_lines_keep_the_guard_on_fields() -> None:
    out = io.StringIO()
    log = logger_into(LogObserver(out, text=True))
    log.info("x", body=b"secret-bytes", blob={"prompt": "secret"}, text="s" * 10_000)
    assert "secret" not in out.getvalue() and "sss" not in out.getvalue()


def test_text_failures_carry_their_error_and_stack() -> None:
    out = io.StringIO()
    log = logger_into(LogObserver(out, text=True))
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.failure("it broke")
    first, *stack = out.getvalue().splitlines()
    assert first.endswith(' error it broke error="division by zero"')
    assert stack[0] == "  | Traceback (most recent call last):"
    assert "ZeroDivisionError" in stack[-1]


def test_readable_rewords_drops_and_is_filtered_after() -> None:
    """What ``readable`` returns is what is written, at the level it gives."""

    def readable(event: dict[str, object]) -> dict[str, object] | None:
        if event.get("log_format") == "drop me":
            return None
        if event.get("log_format") == "detail":
            return {**event, "log_level": LogLevel.debug}
        return {**event, "log_format": "said {what}"}

    out = io.StringIO()
    log = logger_into(LogObserver(out, readable=readable))
    log.info("drop me")
    log.info("detail")
    log.info("anything", what="otherwise")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["said otherwise"]


def test_log_formats() -> None:
    assert [parse_log_format(name) for name in ("auto", "text", "json")] == ["auto", "text", "json"]
    with pytest.raises(ValueError, match="expected one of auto, text, json"):
        parse_log_format("yaml")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    assert chosen_format("auto", _Terminal()) == "text"
    assert chosen_format("auto", io.StringIO()) == "json"
    closed = io.StringIO()
    closed.close()
    assert chosen_format("auto", closed) == "json"
    assert chosen_format("json", _Terminal()) == "json"
    assert chosen_format("text", io.StringIO()) == "text"
