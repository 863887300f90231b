"""Twisted's own log lines in the process's words, or dropped (docs/README.md#logging)."""

from __future__ import annotations

import inspect
from typing import Any

from twisted.application import app
from twisted.internet import asyncioreactor, base, protocol, tcp
from twisted.logger import LogLevel, formatEvent

from nvpair.common.twistedlines import TwistedLines, event_loop

LINES = TwistedLines("1.2.3", "epoll")


def legacy(text: str) -> dict[str, Any]:
    """An event as twisted.python.log.msg publishes it to a twisted.logger observer."""
    return {
        "message": (text,),
        "isError": 0,
        "system": "-",
        "time": 5.0,
        "log_time": 5.0,
        "log_text": text,
        "log_format": "{log_text}",
        "log_level": LogLevel.info,
        "log_namespace": "log_legacy",
    }


def new(template: str, **fields: Any) -> dict[str, Any]:
    return {
        "log_format": template,
        "log_level": LogLevel.info,
        "log_time": 5.0,
        "log_namespace": "twisted",
        **fields,
    }


def test_the_templates_matched_are_twisteds_own() -> None:
    """Matching is on Twisted's message texts: a Twisted that words them otherwise fails here
    rather than letting class names back into the log."""
    sources = "".join(
        inspect.getsource(source)
        for source in (app.AppLogger, base.ReactorBase, protocol.Factory, tcp.Port)
    )
    for text in (
        "twistd {version} ({exe} {pyVersion}) starting up.",
        "reactor class: {reactor}.",
        "Server Shut Down.",
        "Main loop terminated.",
        "Starting factory {factory!r}",
        "Stopping factory {factory!r}",
        '"%s starting on %s"',
        "({self._type} Port {self._realPortNumber} Closed)",
    ):
        assert text in sources, text


def test_the_start_line_names_nvpair_proxy_and_its_version() -> None:
    event = new(
        "twistd {version} ({exe} {pyVersion}) starting up.",
        version="26.10.0",
        exe="/venv/bin/python3.11",
        pyVersion="3.11.7",
    )
    said = LINES(event)
    assert said is not None and formatEvent(said) == (
        "nvpair-proxy 1.2.3 starting (Twisted 26.10.0, Python 3.11.7)"
    )
    assert said["exe"] == "/venv/bin/python3.11" and said["log_time"] == 5.0


def test_the_reactor_class_is_the_event_loops_name() -> None:
    said = LINES(new("reactor class: {reactor}.", reactor="twisted.internet.epollreactor.X"))
    assert said is not None and formatEvent(said) == "event loop: epoll"
    assert "reactor" not in said


def test_the_end_is_said_once() -> None:
    said = LINES(new("Server Shut Down."))
    assert said is not None and formatEvent(said) == "nvpair-proxy stopped"
    assert LINES(new("Main loop terminated.")) is None


def test_a_ports_start_and_a_factorys_start_and_stop_are_dropped() -> None:
    assert LINES(legacy("SniffingFactory starting on 11434")) is None
    assert LINES(legacy("QuietSite starting on 21500")) is None
    assert LINES(new("Starting factory {factory!r}", factory=object())) is None
    assert LINES(new("Stopping factory {factory!r}", factory=object())) is None


def test_a_port_closing_is_debug_detail() -> None:
    said = LINES(legacy("(TCP Port 11434 Closed)"))
    assert said is not None and said["log_level"] == LogLevel.debug
    assert formatEvent(said) == "stopped listening on port 11434" and said["port"] == 11434


def test_a_legacy_error_is_a_failure_with_its_stack() -> None:
    from twisted.python.failure import Failure

    failure = Failure(ZeroDivisionError("boom"))
    event = {**legacy("Traceback ..."), "isError": 1, "failure": failure, "why": "reading"}
    said = LINES(event)
    assert said is not None and said["log_failure"] is failure
    assert formatEvent(said) == "reading" and said["log_level"] == LogLevel.critical


def test_other_lines_pass_unchanged() -> None:
    for event in (
        legacy("something else"),
        new("Received SIGTERM, shutting down."),
        new("{engine} facade listening on {port}", engine="ollama", port=1),
    ):
        assert LINES(event) is event


def test_event_loop_names() -> None:
    class EPollReactor:
        pass

    assert event_loop(EPollReactor()) == "epoll"
    assert event_loop(object()) == "object"

    class Loop:
        pass

    Loop.__module__ = "uvloop"
    reactor = asyncioreactor.AsyncioSelectorReactor.__new__(asyncioreactor.AsyncioSelectorReactor)
    reactor._asyncioEventloop = Loop()  # type: ignore[assignment]
    assert event_loop(reactor) == "asyncio on uvloop"
