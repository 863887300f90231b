"""The process configuration: every option of the contract's command line, as one value."""

from __future__ import annotations

from pathlib import Path

from attrs import frozen
from twisted.logger import LogLevel


@frozen
class Config:
    """Parsed, validated options (contract cli-and-http.md, "Command line").

    Durations are seconds; ``0`` for :attr:`response_header_timeout` disables both the header
    cap and the first-body cap (spec §5.1).
    """

    state_dir: Path
    cluster_dir: Path | None = None
    broker: str = "stdio"
    fleet: Path | None = None
    bind: str = "::"
    response_header_timeout: float = 30 * 60.0
    dial_timeout: float = 10.0
    job_deadline: float = 10 * 60.0
    max_dispatch_attempts: int = 5
    retry_backoff: float = 0.25
    client_write_timeout: float = 60.0
    max_request_body: int = 64 * 1024 * 1024
    log_level: LogLevel = LogLevel.info
    admin_port: int | None = None
    request_head_timeout: float = 30.0
    idle_timeout: float = 5 * 60.0
