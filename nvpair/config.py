"""The process configuration: every option of the command line, as one value.

Each default is stated once, as the text a user would type (:data:`DEFAULTS`); the command
line shows that text and :class:`Config`'s defaults are that text parsed, so the two agree by
construction (docs/README.md#command-line).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen
from twisted.logger import LogLevel

from nvpair.common.durations import parse_duration
from nvpair.common.logs import parse_level, parse_log_format
from nvpair.fleet.file import Fleet

#: Every option's default, as the text a user would type.
DEFAULTS: Mapping[str, str] = {
    "broker": "stdio",
    "bind": "::",
    "response-header-timeout": "30m",
    "dial-timeout": "10s",
    "job-deadline": "10m",
    "max-dispatch-attempts": "5",
    "retry-backoff": "250ms",
    "client-write-timeout": "60s",
    "max-request-body": "67108864",
    "max-body-memory": "268435456",
    "log-level": "info",
    "log-format": "auto",
    "request-head-timeout": "30s",
    "idle-timeout": "5m",
    "listen-backlog": "4096",
    "owner-wait": "30s",
    "fail-threshold": "3",
    "cooldown": "5s",
    "cooldown-max": "2m",
}


def parse_count(text: str) -> int:
    """A positive whole number (``--max-dispatch-attempts``, ``--max-request-body``,
    ``--max-body-memory``)."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"{text!r} is not a positive whole number")
    return int(text)


def _default(option: str, parse: Callable[[str], object]) -> Any:
    return field(default=parse(DEFAULTS[option]))


@frozen
class Config:
    """Parsed, validated options.

    Durations are seconds; ``0`` for :attr:`response_header_timeout` disables both the header
    cap and the first-body cap (docs/retry-budget.md#per-attempt-budgets).
    """

    state_dir: Path
    cluster_dir: Path | None = None
    broker: str = DEFAULTS["broker"]
    #: Standalone mode: the fleet file, parsed once (``--fleet``), and where it was read.
    fleet: Fleet | None = None
    fleet_file: Path | None = None
    bind: str = DEFAULTS["bind"]
    response_header_timeout: float = _default("response-header-timeout", parse_duration)
    dial_timeout: float = _default("dial-timeout", parse_duration)
    job_deadline: float = _default("job-deadline", parse_duration)
    max_dispatch_attempts: int = _default("max-dispatch-attempts", parse_count)
    retry_backoff: float = _default("retry-backoff", parse_duration)
    client_write_timeout: float = _default("client-write-timeout", parse_duration)
    max_request_body: int = _default("max-request-body", parse_count)
    #: The request bodies held at once, every facade's together
    #: (docs/robustness.md#what-a-request-body-costs).
    max_body_memory: int = _default("max-body-memory", parse_count)
    log_level: LogLevel = _default("log-level", parse_level)  # noqa: RUF009 (a constant)
    #: ``auto`` (text on a terminal, else JSON), ``text`` or ``json``.
    log_format: str = _default("log-format", parse_log_format)
    #: One info line per finished request (docs/README.md#the-access-log).
    access_log: bool = False
    admin_port: int | None = None
    request_head_timeout: float = _default("request-head-timeout", parse_duration)
    idle_timeout: float = _default("idle-timeout", parse_duration)
    #: Connections the kernel queues for a facade before accept; Linux caps it at
    #: ``net.core.somaxconn``. Twisted's default of 50 overflows on a burst of clients.
    listen_backlog: int = _default("listen-backlog", parse_count)
    #: Fleet mode: how long an in-flight request waits for an owner after every owner left
    #: (0: up to the job deadline, as in broker mode) (docs/fleet-scheduling.md#owner-wait).
    owner_wait: float = _default("owner-wait", parse_duration)
    #: Fleet mode's passive health (docs/fleet-scheduling.md#passive-health): failed attempts
    #: in a row that hold a node back, the first cool-down, and the longest.
    fail_threshold: int = _default("fail-threshold", parse_count)
    cooldown: float = _default("cooldown", parse_duration)
    cooldown_max: float = _default("cooldown-max", parse_duration)
