"""Child processes and what the kernel says about them: ports, start and stop, CPU, peak RSS.

Everything here is loopback-only and bounded: a child that does not start listening in time is
an error, and every child is killed with its process group when its block ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TWISTD = str(Path(PYTHON).parent / "twistd")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(port: int, seconds: float = 60) -> None:
    """Until something accepts connections on ``port``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {seconds}s")


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {seconds}s")
        time.sleep(0.05)


@contextmanager
def process(argv: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` in a session of its own; SIGTERM (then SIGKILL) its group on exit."""
    child: subprocess.Popen[bytes] = subprocess.Popen(argv, start_new_session=True, **kwargs)
    try:
        yield child
    finally:
        stop(child)


def stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    with suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (``/proc/PID/stat`` utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, so utime (14) and stime (15) are [11] and [12].
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The process's high-water resident set (``VmHWM``), in MiB."""
    return _status_mb(pid, "VmHWM")


def rss_mb(pid: int) -> float:
    """The process's resident set now (``VmRSS``), in MiB."""
    return _status_mb(pid, "VmRSS")


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def listen_overflows() -> int:
    """The kernel's count of connections dropped at a full accept queue (all sockets).

    A held-streams run reports its growth: a dropped SYN costs the client a one-second
    retransmit, which would show as TTFB and must not be blamed on the proxy unseen.
    """
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(row.get("ListenOverflows", "0"))
    return 0


def refused_connects() -> int:
    """The kernel's count of outgoing connections that failed before they were established
    (``Tcp: AttemptFails``, all sockets): the only trace a refused connection leaves."""
    lines = Path("/proc/net/snmp").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("Tcp:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(row.get("AttemptFails", "0"))
    return 0
