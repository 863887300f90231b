"""Runs the real ``twistd -n nvpair-proxy`` process and plays the broker on its stdio."""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor
from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

TWISTD = str(Path(sys.executable).parent / "twistd")
#: The console script ``pip install`` puts on the PATH (pyproject's ``[project.scripts]``).
NVPAIR_PROXY = str(Path(sys.executable).parent / "nvpair-proxy")

Frame = dict[str, Any]


def free_port() -> int:
    """A port nobody listens on, from below the kernel's ephemeral range.

    The proxy binds it a moment later; a port from the ephemeral range could meanwhile become
    the local end of some outgoing connection (this test's own clients make many).
    """
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET6) as probe:
            try:
                probe.bind(("::", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class _Waiter:
    def __init__(self, predicate: Callable[[Frame], bool], d: Deferred[Frame]) -> None:
        self.predicate = predicate
        self.d = d


class ProxyProcess(ProcessProtocol):
    """The proxy as a child process; this side is its broker.

    :ivar frames: every JSON-RPC frame the proxy wrote to stdout, in order.
    :ivar raw_stdout: every byte of stdout (to prove nothing else is written there).
    :ivar logs: every stderr line parsed as JSON (non-JSON lines land in ``bad_log_lines``).
    """

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.raw_stdout = b""
        self.logs: list[dict[str, Any]] = []
        self.raw_stderr = b""
        self.bad_log_lines: list[bytes] = []
        self._out_buffer = b""
        self._err_buffer = b""
        self._waiters: list[_Waiter] = []
        self._log_waiters: list[_Waiter] = []
        self._next_id = 1000
        self.ended: Deferred[int] = Deferred()
        self.exit_code: int | None = None

    # -- process protocol ------------------------------------------------------------------

    def outReceived(self, data: bytes) -> None:
        self.raw_stdout += data
        self._out_buffer += data
        *lines, self._out_buffer = self._out_buffer.split(b"\n")
        for line in lines:
            frame = json.loads(line)
            self.frames.append(frame)
            self._wake(self._waiters, frame)

    def errReceived(self, data: bytes) -> None:
        self.raw_stderr += data
        self._err_buffer += data
        *lines, self._err_buffer = self._err_buffer.split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                self.bad_log_lines.append(line)
                continue
            self.logs.append(record)
            self._wake(self._log_waiters, record)

    def processEnded(self, reason: Failure) -> None:
        if reason.check(ProcessDone):
            self.exit_code = 0
        elif reason.check(ProcessTerminated):
            value = reason.value
            assert isinstance(value, ProcessTerminated)
            self.exit_code = value.exitCode if value.exitCode is not None else -1
        self.ended.callback(self.exit_code if self.exit_code is not None else -1)

    @staticmethod
    def _wake(waiters: list[_Waiter], item: Frame) -> None:
        for waiter in list(waiters):
            if waiter.predicate(item):
                waiters.remove(waiter)
                waiter.d.callback(item)

    # -- playing the broker ----------------------------------------------------------------

    def send(self, message: Frame | bytes) -> None:
        line = message if isinstance(message, bytes) else json.dumps(message).encode()
        assert self.transport is not None
        self.transport.write(line + b"\n")

    def notify(self, method: str, params: Frame) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(
        self, method: str, params: dict[str, object], timeout: float = 10
    ) -> Deferred[Frame]:
        """Send a request; fires with the whole answer frame (``result`` or ``error``)."""
        self._next_id += 1
        request_id = self._next_id
        d = self.wait_for(
            lambda f: f.get("id") == request_id and "method" not in f, timeout=timeout
        )
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return d

    def wait_for(self, predicate: Callable[[Frame], bool], timeout: float = 10) -> Deferred[Frame]:
        """The first frame (already seen or still to come) matching ``predicate``."""
        for frame in self.frames:
            if predicate(frame):
                return defer.succeed(frame)
        d: Deferred[Frame] = Deferred()
        self._waiters.append(_Waiter(predicate, d))
        d.addTimeout(timeout, reactor)
        return d

    def wait_for_method(self, method: str, timeout: float = 10) -> Deferred[Frame]:
        return self.wait_for(lambda f: f.get("method") == method, timeout)

    def wait_for_log(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10
    ) -> Deferred[dict[str, Any]]:
        for record in self.logs:
            if predicate(record):
                return defer.succeed(record)
        d: Deferred[dict[str, Any]] = Deferred()
        self._log_waiters.append(_Waiter(predicate, d))
        d.addTimeout(timeout, reactor)
        return d

    async def barrier(self) -> None:
        """Wait until the proxy has handled every line sent so far.

        Lines are handled in order, so the answer to a request sent now (an unknown method:
        -32601) proves every notification before it was applied.
        """
        answer = await self.request("test/barrier", {})
        assert answer["error"]["code"] == -32601

    def close_stdin(self) -> None:
        assert self.transport is not None
        self.transport.closeStdin()

    def answer_subscribes(self) -> None:
        """Answer every ``<engine>:discovery:subscribe`` the proxy sends with ``{}``."""

        def answered(frame: Frame) -> bool:
            if str(frame.get("method", "")).endswith(":discovery:subscribe") and "id" in frame:
                self.send({"jsonrpc": "2.0", "id": frame["id"], "result": {}})
            return False

        for frame in self.frames:
            answered(frame)
        self._waiters.append(_Waiter(answered, Deferred()))

    @property
    def pid(self) -> int:
        """The process id (while the process runs)."""
        assert self.transport is not None and self.transport.pid is not None
        pid: int = self.transport.pid
        return pid

    def terminate(self) -> Deferred[int]:
        if self.exit_code is None and self.transport is not None:
            with contextlib.suppress(Exception):  # already gone
                self.transport.signalProcess("TERM")
        return self.ended

    async def enable(self, engine: str, port: int, **extra: Any) -> Frame:
        answer = await self.request("facade/enable", {"engine": engine, "port": port, **extra})
        assert "result" in answer, answer
        return answer

    def discovery(self, engine: str, nodes: Sequence[Frame]) -> None:
        self.notify(f"{engine}:discovery:nodes", {"nodes": list(nodes)})


def run_twistd(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``twistd -n nvpair-proxy ARGS`` to completion (for usage errors)."""
    return subprocess.run(
        [TWISTD, "--pidfile=", "-n", "nvpair-proxy", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


_WITH_OPEN_FILES = """
import os, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""


def start_proxy(
    state_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    twistd_reactor: str | None = None,
    console_script: bool = False,
    open_files: int | None = None,
    run_as: tuple[str, str] | None = None,
) -> ProxyProcess:
    """Spawn ``twistd -n nvpair-proxy`` with this side as its broker.

    ``--pidfile=`` keeps parallel test processes from fighting over one twistd.pid.

    :param console_script: spawn the installed ``nvpair-proxy`` console script instead, as an
        operator runs it (it writes no pid file by itself).
    :param open_files: the process's open-files limit, soft and hard (the process raises its
        soft limit to the hard one, so both are set); None: this process's.
    :param run_as: a user and group to run it as, with no supplementary groups (as a unit's
        dynamic user runs: docs/lan.md#as-a-service); needs root.
    """
    proxy = ProxyProcess()
    # NVPAIR_TEST_REACTOR=uvloop runs the whole integration suite on another twistd reactor.
    chosen = twistd_reactor or os.environ.get("NVPAIR_TEST_REACTOR")
    reactor_args = ["-r", chosen] if chosen else []
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    environ.update(env or {})
    if console_script:
        command = [NVPAIR_PROXY, *(["--reactor", chosen] if chosen else [])]
    else:
        command = [TWISTD, "--pidfile=", *reactor_args, "-n", "nvpair-proxy"]
    if open_files is not None:
        # Set in the child before it becomes the proxy: exec keeps the limit and the pid.
        command = [sys.executable, "-c", _WITH_OPEN_FILES, str(open_files), *command]
    if run_as is not None:
        # setpriv execs the proxy: its pid is the proxy's, which the test signals.
        user, group = run_as
        setpriv = ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups"]
        command = [*setpriv, *command]
    reactor.spawnProcess(
        proxy,
        command[0],
        [*command, "--state-dir", str(state_dir), *args],
        env=environ,
        path=str(state_dir),
    )
    return proxy


# -- after-checks for fault tests -----------------------------------------------------------------

#: The terminal workload methods (broker-protocol.md "Workload events").
TERMINAL_METHODS = frozenset({"workload:completed", "workload:errored"})


def open_fds(pid: int) -> int:
    """How many file descriptors process ``pid`` has open right now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def workload_events(frames: Sequence[Frame]) -> dict[str, list[Frame]]:
    """The ``workload:*`` frames among ``frames``, grouped by workload id, in order."""
    grouped: dict[str, list[Frame]] = {}
    for frame in frames:
        if str(frame.get("method", "")).startswith("workload:"):
            grouped.setdefault(frame["params"]["workloadInfo"]["id"], []).append(frame)
    return grouped


def terminal_problems(frames: Sequence[Frame]) -> list[str]:
    """Every workload among ``frames`` that does not end in exactly one terminal event."""
    problems: list[str] = []
    for workload, events in workload_events(frames).items():
        methods = [event["method"] for event in events]
        terminals = [m for m in methods if m in TERMINAL_METHODS]
        if len(terminals) != 1 or methods[-1] not in TERMINAL_METHODS:
            problems.append(f"workload {workload}: {methods}")
    return problems


def stderr_mark(proxy: ProxyProcess) -> int:
    """Where the next whole stderr line will start (for :func:`log_problems`)."""
    return proxy.raw_stderr.rfind(b"\n") + 1


def log_problems(proxy: ProxyProcess, stderr_from: int = 0) -> list[str]:
    """What the proxy's finished stderr lines (from ``stderr_from``, a :func:`stderr_mark`) say
    went wrong: a traceback, an "Unhandled Error", a record at error level or with a stack, a
    line that is not a JSON record."""
    problems: list[str] = []
    text = proxy.raw_stderr[stderr_from:]
    for marker in (b"Traceback", b"Unhandled Error"):
        if marker in text:
            problems.append(f"{marker.decode()} on stderr")
    *lines, _unfinished = text.split(b"\n")
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"not JSON: {line[:200]!r}")
            continue
        if not isinstance(record, dict):
            problems.append(f"not a record: {line[:200]!r}")
        elif record.get("level") == "error" or "stack" in record:
            problems.append(f"{record.get('level')}: {record.get('msg')} {record.get('error')}")
    return problems


# -- open-files limits ----------------------------------------------------------------------------


def fd_limits(pid: int) -> tuple[int | None, int | None]:
    """Process ``pid``'s soft and hard open-files limits, from ``/proc/PID/limits`` (None:
    unlimited)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return (
                None if soft == "unlimited" else int(soft),
                None if hard == "unlimited" else int(hard),
            )
    raise ValueError(f"no open-files limit in /proc/{pid}/limits")


@contextlib.contextmanager
def soft_fd_limit(soft: int) -> Iterator[int]:
    """This process's soft open-files limit set to ``soft`` (at most the hard limit) for the
    body of a ``with``, and restored after; yields the limit in force.

    A child spawned meanwhile inherits it: lowering it around a spawn shows whether the child
    raises its own.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = soft if hard == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield wanted
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (before, hard))


def write_fleet(
    path: Path,
    port: int,
    nodes: dict[str, str],
    engine: str = "ollama",
    interval: str = "100ms",
) -> Path:
    """A fleet file at ``path``: ``engine``'s facade on ``port`` in front of ``nodes`` (node id
    -> the engine's URL), polled every ``interval``."""
    text = f'inventory-interval = "{interval}"\n[facades.{engine}]\nport = {port}\n'
    for node, url in nodes.items():
        text += f'[[nodes]]\nid = "{node}"\n[nodes.engines]\n{engine} = "{url}"\n'
    path.write_text(text)
    return path
