"""Twisted's own log lines, in the process's words (docs/README.md#logging).

twistd, the reactor and every listening port log lines written for Twisted's developers:
``SniffingFactory starting on 11434``, ``(TCP Port 11434 Closed)``, ``reactor class:
twisted.internet.epollreactor.EPollReactor.``. Each line a normal start, SIGHUP and stop prints
is either reworded here, or dropped where the process says the same thing itself (each facade
and the admin listener log where they listen). Lines not recognised pass unchanged.

Pure: an event in, an event (a new dict: a published event is shared by every observer) or None
out. Matching is on Twisted's message templates, which are constants of the Twisted release.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.logger import LogLevel

Event = dict[str, Any]

#: Where a reworded line says it comes from.
NAMESPACE = "nvpair.process"

_TWISTD_START = "twistd {version} ({exe} {pyVersion}) starting up."
_REACTOR = "reactor class: {reactor}."
_STOPPED = "Server Shut Down."
_LOOP_ENDED = "Main loop terminated."
_FACTORY = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}"})

#: A port's own lines (twisted.python.log, so their text is all there is).
_PORT_STARTED = re.compile(r".* starting on .*")
_PORT_CLOSED = re.compile(r"\((?:[A-Z]+ )?Port (?P<port>.+) Closed\)")
_PROTOCOL = re.compile(r"(?:Starting|Stopping) protocol .*")

#: Reactor classes by the event loop a person knows them as.
_LOOPS = {
    "EPollReactor": "epoll",
    "PollReactor": "poll",
    "SelectReactor": "select",
    "KQueueReactor": "kqueue",
    "AsyncioSelectorReactor": "asyncio",
}


def event_loop(reactor: object) -> str:
    """The reactor's event loop in a word or two: ``epoll``, ``asyncio on uvloop``."""
    name = _LOOPS.get(type(reactor).__name__, type(reactor).__name__)
    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is not None:
        library = type(loop).__module__.split(".", 1)[0]
        if library != "asyncio":
            return f"{name} on {library}"
    return name


def _reworded(event: Event, template: str, **fields: object) -> Event:
    """A new event at ``event``'s time and level saying ``template`` with ``fields``."""
    return {
        "log_time": event.get("log_time"),
        "log_level": event.get("log_level", LogLevel.info),
        "log_namespace": NAMESPACE,
        "log_format": template,
        **fields,
    }


@frozen
class TwistedLines:
    """Rewords or drops Twisted's own lines.

    :param version: nvpair-proxy's version, for the start line.
    :param loop: the event loop's name (:func:`event_loop`).
    """

    version: str
    loop: str

    def __call__(self, event: Event) -> Event | None:
        template = event.get("log_format")
        if template == "{log_text}" and event.get("log_namespace") == "log_legacy":
            return _legacy(event, str(event.get("log_text", "")))
        handler = _BY_TEMPLATE.get(template) if isinstance(template, str) else None
        return event if handler is None else handler(self, event)

    def _started(self, event: Event) -> Event:
        return _reworded(
            event,
            "nvpair-proxy {version} starting (Twisted {twisted}, Python {python})",
            version=self.version,
            twisted=event.get("version"),
            python=event.get("pyVersion"),
            exe=event.get("exe"),
        )

    def _reactor(self, event: Event) -> Event:
        return _reworded(event, "event loop: {loop}", loop=self.loop)

    def _stopped(self, event: Event) -> Event:
        return _reworded(event, "nvpair-proxy stopped")

    def _dropped(self, event: Event) -> None:
        return None


def _legacy(event: Event, text: str) -> Event | None:
    failure = event.get("failure")
    if event.get("isError") and failure is not None and "log_failure" not in event:
        # twisted.python.log.err: its text is the whole traceback; the failure itself makes
        # the record's error and stack, as for a failure logged by twisted.logger.
        return {
            **_reworded(event, "{why}", why=event.get("why") or "unhandled error"),
            "log_level": LogLevel.critical,
            "log_failure": failure,
        }
    if _PORT_STARTED.fullmatch(text) or _PROTOCOL.fullmatch(text):
        # The facade or the admin listener said where it listens, in its own line.
        return None
    closed = _PORT_CLOSED.fullmatch(text)
    if closed is not None:
        # Shutdown (or a facade moving) already says why: the detail is for debugging.
        port = closed.group("port")
        return {
            **_reworded(event, "stopped listening on port {port}"),
            "log_level": LogLevel.debug,
            "port": int(port) if port.isdigit() else port,
        }
    return event


_BY_TEMPLATE: dict[str, Callable[[TwistedLines, Event], Event | None]] = {
    _TWISTD_START: TwistedLines._started,
    _REACTOR: TwistedLines._reactor,
    _STOPPED: TwistedLines._stopped,
    _LOOP_ENDED: TwistedLines._dropped,
    **dict.fromkeys(_FACTORY, TwistedLines._dropped),
}
