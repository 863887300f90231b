"""``twistd nvpair-proxy``: the command line (docs/README.md#command-line), and a thin
``makeService``.

Every option has its documented default; options with an environment variable take it when the
flag is absent. A malformed value is a usage error naming the option, never a silent default:
one line on stderr and a non-zero exit, under ``twistd`` as under the ``nvpair-proxy`` console
script (:mod:`nvpair.cli`).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

from twisted.application.service import IService
from twisted.python import usage

from nvpair.cli_actions import PROG as PROG
from nvpair.cli_actions import ActionOptions, docs_dir, version
from nvpair.common.durations import parse_duration
from nvpair.common.logs import parse_level, parse_log_format
from nvpair.config import DEFAULTS, Config, parse_count
from nvpair.facades.ports import ascii_digits, bind_host, valid_port
from nvpair.fleet.file import FleetFileError, load_fleet

#: option name -> environment variable consulted when the flag is not given.
ENVIRONMENT = {
    "state-dir": "NVPAIR_STATE_DIR",
    "cluster-dir": "NVPAIR_CLUSTER_DIR",
    "fleet": "NVPAIR_FLEET",
    "response-header-timeout": "NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT",
    "log-level": "NVPAIR_LOG_LEVEL",
}

T = TypeVar("T")

if TYPE_CHECKING:
    from nvpair.service import ProxyService

#: The exit status of a usage error (POSIX utilities' and argparse's convention).
USAGE_STATUS = 2


def usage_exit(error: usage.UsageError, err: IO[str] | None = None) -> NoReturn:
    """End the process for a usage error: one line naming what is wrong, on stderr."""
    out = err or sys.stderr
    out.write(f"{PROG}: {error}\n")
    out.flush()
    raise SystemExit(USAGE_STATUS)


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/nvpair``, else ``~/.local/state/nvpair``."""
    base = environ.get("XDG_STATE_HOME")
    if base:
        return Path(base) / "nvpair"
    return Path(environ.get("HOME") or Path.home()) / ".local" / "state" / "nvpair"


def _port(text: str) -> int:
    port = int(text) if ascii_digits(text) else -1
    if not valid_port(port):
        raise ValueError(f"{text!r} is not a port in 1-65535")
    return port


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


class Options(ActionOptions):
    """Options for ``twistd -n nvpair-proxy`` (docs/README.md#command-line)."""

    synopsis = "[options]"
    longdesc = (
        "One facade per enabled engine; with no --fleet, the broker drives the process over "
        "JSON-RPC on stdin/stdout. Durations use Go's form: 250ms, 10s, 30m, 1h30m, 0. "
        f"The docs/ pages named above are in {docs_dir()}."
    )

    optParameters: list[list[Any]] = [
        [
            name,
            None,
            None,
            f"{help_text} [default: {DEFAULTS.get(name) or 'none'}]"
            + (f" [env ${ENVIRONMENT[name]}]" if name in ENVIRONMENT else ""),
        ]
        for name, help_text in (
            (
                "state-dir",
                "Persisted per-engine ports; default $XDG_STATE_HOME/nvpair, "
                "else ~/.local/state/nvpair.",
            ),
            ("cluster-dir", "Cluster membership, key pair and peer pins."),
            ("broker", "The broker link: stdio, or a Twisted client endpoint string."),
            ("fleet", "Standalone mode: facades and nodes from this TOML file."),
            ("bind", "Facade listen interface."),
            (
                "response-header-timeout",
                "Header cap and first-body cap per attempt; 0 disables both.",
            ),
            ("dial-timeout", "Per-attempt connect timeout."),
            ("job-deadline", "No new attempts after this, from admission."),
            ("max-dispatch-attempts", "Dispatch budget per inference request."),
            ("retry-backoff", "First backoff between rounds; doubles, capped at 8x."),
            ("client-write-timeout", "A client that accepts no bytes this long is dropped."),
            ("max-request-body", "Larger request bodies (bytes) get 413."),
            (
                "max-body-memory",
                "Request bodies held at once (bytes), all requests together; past it 503.",
            ),
            ("log-level", "debug, info, warn or error."),
            ("log-format", "text, json, or auto: text when stderr is a terminal, else json."),
            ("admin-port", "Admin listener (health, metrics, status): loopback, plus [admin]."),
            (
                "request-head-timeout",
                "A request line and headers not complete this long after their first byte "
                "close the connection.",
            ),
            ("idle-timeout", "A kept-alive client connection idle this long is closed."),
            (
                "listen-backlog",
                "Connections queued per facade port before accept (the kernel caps it at "
                "net.core.somaxconn).",
            ),
            (
                "owner-wait",
                "Fleet mode: how long an in-flight request waits for an owner after every "
                "owner left; 0 waits up to --job-deadline.",
            ),
            (
                "fail-threshold",
                "Fleet mode: failed attempts in a row that hold a node back for a cool-down.",
            ),
            ("cooldown", "Fleet mode: the first cool-down of a held-back node; 0 holds none."),
            ("cooldown-max", "Fleet mode: cool-downs double up to this."),
        )
    ]

    optFlags: list[list[Any]] = [
        ["access-log", None, "One info line per finished request (never its content)."],
    ]

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._environ = os.environ if environ is None else environ
        self.config: Config | None = None
        #: The process :func:`makeService` built from these options.
        self.service: ProxyService | None = None
        #: Whoever runs twistd's machinery returns the exit status itself (the console script,
        #: :mod:`nvpair.cli`); under plain ``twistd``, which cannot, the process ends with it
        #: after its shutdown (:func:`exit_with_status`).
        self.returns_status = False

    def opt_version(self) -> NoReturn:
        """Display nvpair-proxy's version and exit."""
        sys.stdout.write(f"{PROG} {version()}\n")
        sys.stdout.flush()
        raise SystemExit(0)

    def parseOptions(self, options: list[str] | None = None) -> None:
        try:
            super().parseOptions(options)
        except usage.UsageError as error:
            if self.parent is None:
                # Parsed on its own (tests, tools): the caller reports it.
                raise
            # Parsed as twistd's subcommand: twistd would print its whole help, then the
            # message, both on stdout (the broker's in broker mode). One line on stderr
            # instead, and exit, as usage.Options' own --help exits from parsing.
            usage_exit(error)

    def _value(self, name: str) -> str | None:
        """The flag if given, else its environment variable, else the documented default."""
        flag: str | None = self[name]
        if flag is not None:
            return flag
        if name in ENVIRONMENT and ENVIRONMENT[name] in self._environ:
            return self._environ[ENVIRONMENT[name]]
        return DEFAULTS.get(name)

    def _parse(self, name: str, parse: Callable[[str], T]) -> T | None:
        text = self._value(name)
        if text is None:
            return None
        try:
            return parse(text)
        except ValueError as bad:
            raise usage.UsageError(f"--{name}: {bad}") from None

    def _defaulted(self, name: str, parse: Callable[[str], T]) -> T:
        """An option with a default: never absent."""
        value = self._parse(name, parse)
        assert value is not None, f"--{name} has no default"
        return value

    def postOptions(self) -> None:
        fleet = self._parse("fleet", _nonempty)
        if fleet is not None and self["broker"] is not None:
            raise usage.UsageError("--fleet and --broker are mutually exclusive")
        parsed = None
        if fleet is not None:
            try:
                parsed = load_fleet(Path(fleet), self._environ)
            except FleetFileError as bad:
                raise usage.UsageError(f"--fleet: {bad}") from None
        state_dir = self._parse("state-dir", _nonempty)
        cluster_dir = self._parse("cluster-dir", _nonempty)
        config = Config(
            state_dir=Path(state_dir) if state_dir else default_state_dir(self._environ),
            cluster_dir=Path(cluster_dir) if cluster_dir else None,
            broker=self._defaulted("broker", _nonempty),
            fleet=parsed,
            fleet_file=Path(fleet) if fleet else None,
            bind=self._defaulted("bind", bind_host),
            response_header_timeout=self._defaulted("response-header-timeout", parse_duration),
            dial_timeout=self._defaulted("dial-timeout", parse_duration),
            job_deadline=self._defaulted("job-deadline", parse_duration),
            max_dispatch_attempts=self._defaulted("max-dispatch-attempts", parse_count),
            retry_backoff=self._defaulted("retry-backoff", parse_duration),
            client_write_timeout=self._defaulted("client-write-timeout", parse_duration),
            max_request_body=self._defaulted("max-request-body", parse_count),
            max_body_memory=self._defaulted("max-body-memory", parse_count),
            log_level=self._defaulted("log-level", parse_level),
            log_format=self._defaulted("log-format", parse_log_format),
            access_log=bool(self["access-log"]),
            admin_port=self._parse("admin-port", _port),
            request_head_timeout=self._defaulted("request-head-timeout", parse_duration),
            idle_timeout=self._defaulted("idle-timeout", parse_duration),
            listen_backlog=self._defaulted("listen-backlog", parse_count),
            owner_wait=self._defaulted("owner-wait", parse_duration),
            fail_threshold=self._defaulted("fail-threshold", parse_count),
            cooldown=self._defaulted("cooldown", parse_duration),
            cooldown_max=self._defaulted("cooldown-max", parse_duration),
        )
        if config.cooldown_max < config.cooldown:
            raise usage.UsageError("--cooldown-max: must not be shorter than --cooldown")
        if parsed is not None and parsed.admin is not None and config.admin_port is None:
            # Its port is --admin-port's (docs/lan.md#the-admin-view-from-the-lan).
            raise usage.UsageError("--fleet: [admin] bind needs --admin-port, the port it uses")
        self.config = config


#: Said on stderr when the process waits for a broker on a terminal: a person typed the command.
TERMINAL_HINT = f"""\
{PROG}: waiting for a broker on stdin (JSON-RPC, one object per line): no --fleet was given.
  To run standalone:  {PROG} --fleet FILE   ({PROG} --example-fleet prints one to start from)
  To try it first:    make demo   (in a source checkout: simulated engines behind all three facades)
  Ctrl-D or Ctrl-C ends this process.
"""


def terminal_hint(config: Config, stdin: IO[str], err: IO[str]) -> bool:
    """Tell a person at a terminal what the process is waiting for; True when it did.

    Only in broker mode on stdio with stdin a terminal: a broker's pipe never gets it, and
    stdout (the broker's) never does.
    """
    if config.fleet is not None or config.broker != "stdio":
        return False
    try:
        interactive = stdin.isatty()
    except (AttributeError, ValueError):  # closed, or no stdin at all
        return False
    if interactive:
        err.write(TERMINAL_HINT)
        err.flush()
    return interactive


def exit_with_status(root: ProxyService, exit: Callable[[int], object] = os._exit) -> None:
    """End the process with ``root``'s exit status, if :meth:`~ProxyService.fail` set one.

    twistd offers a service no way to set the exit status (Twisted issue #11335): its run()
    returns None, so the process would exit 0 whatever ended it. Registered with ``atexit``,
    this runs at interpreter exit: after the ordered shutdown (the reactor's "before shutdown"
    phase) and after twistd's own epilogue (pid file removed, log closed), when the status is
    the only thing left to give, and os._exit is the one way left to give it. It skips only the
    ``atexit`` handlers registered before it (the standard library's logging flush: this
    process logs through twisted.logger). The console script needs none of this: it runs
    twistd's runner itself and returns the status (:func:`nvpair.cli.main`).
    """
    status = root.exit_status
    if not status:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    exit(status)


def leave_tls_unloaded(config: Config, modules: dict[str, Any] = sys.modules) -> bool:
    """Keep pyOpenSSL (and cryptography under it) out of a process that will never speak TLS;
    True when it did (docs/performance.md#memory).

    Only a cluster member, or a fleet whose ``[access]`` names a certificate, speaks TLS, so a
    node with neither never needs it; but Twisted's reactor imports its TLS support whenever
    pyOpenSSL is installed. (A reload that adds the certificate later says that TLS needs a
    restart.) An ``OpenSSL``
    entry of None in ``sys.modules`` makes every later import of it fail, which Twisted reads as
    "TLS unavailable". That is done only while neither OpenSSL nor a reactor has been imported:
    a process that already has either (a test run, ``twistd -r uvloop``) is left as it is.
    """
    if config.cluster_dir is not None:
        return False
    access = config.fleet.access if config.fleet is not None else None
    if access is not None and access.tls is not None:
        return False
    if "OpenSSL" in modules or "twisted.internet.reactor" in modules:
        return False
    modules["OpenSSL"] = None
    return True


def makeService(options: Options) -> IService:
    """Build the process with the global reactor (the only module that imports it)."""
    assert options.config is not None
    leave_tls_unloaded(options.config)
    from twisted.internet import reactor

    from nvpair import service
    from nvpair.common import heap

    assert options.config is not None
    terminal_hint(options.config, sys.stdin, sys.stderr)
    root = service.build(reactor, options.config)
    # Once every service has started, what the startup made is frozen for the collector.
    reactor.callWhenRunning(heap.settle)
    options.service = root
    if not options.returns_status:
        atexit.register(exit_with_status, root)
    return root
