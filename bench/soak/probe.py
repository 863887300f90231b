"""What the soak reads about the proxy process from outside: RSS and fds from ``/proc``, its TCP
sockets sorted by peer, and the problems in its JSON-lines stderr log.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import attrs

_LISTEN = "0A"


def rss_kb(pid: int) -> int:
    """Resident set size in KiB (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@attrs.frozen
class Sockets:
    """The process's TCP sockets by kind.

    :param upstream: connected to a simulated engine (pooled, polling or in use).
    :param clients: accepted on a facade or the admin port.
    :param listening: listening sockets.
    :param other: anything else (half-gone sockets no longer in the table, say).
    """

    upstream: int = 0
    clients: int = 0
    listening: int = 0
    other: int = 0


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed between listdir and readlink
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def classify_sockets(
    table_lines: Iterable[str],
    inodes: set[str],
    own_ports: frozenset[int],
    peer_ports: frozenset[int],
) -> Sockets:
    """Pure: sort the sockets of ``inodes`` using ``/proc/net/tcp``-format lines.

    :param own_ports: the process's listening ports (a connection on one is a client's).
    :param peer_ports: the simulated engines' ports (a connection to one is upstream).
    """
    upstream = clients = listening = 0
    seen = set()
    for line in table_lines:
        fields = line.split()
        if len(fields) < 10 or fields[9] not in inodes or not fields[0].endswith(":"):
            continue
        seen.add(fields[9])
        local, remote, state = _port(fields[1]), _port(fields[2]), fields[3]
        if state == _LISTEN:
            listening += 1
        elif remote in peer_ports:
            upstream += 1
        elif local in own_ports:
            clients += 1
    other = len(inodes - seen)
    return Sockets(upstream, clients, listening, other)


def sockets(pid: int, own_ports: frozenset[int], peer_ports: frozenset[int]) -> Sockets:
    inodes = _socket_inodes(pid)
    lines: list[str] = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as text:
            lines += text.readlines()[1:]
    return classify_sockets(lines, inodes, own_ports, peer_ports)


@attrs.frozen
class LogSummary:
    """The proxy's stderr log, summed up.

    :param levels: lines per level (``unparsed`` for lines that are not JSON objects).
    :param messages: (level, namespace) -> lines, for warn and error lines.
    :param problems: lines that carry a failure: a ``stack`` field (our observer's rendering of
        ``log_failure``), or ``Traceback`` / ``Unhandled Error`` anywhere in the text.
    """

    levels: Counter[str]
    messages: Counter[str]
    problems: tuple[str, ...]


def summarize_log(lines: Iterable[str]) -> LogSummary:
    """Pure: the :class:`LogSummary` of JSON-lines log text."""
    levels: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    problems = []
    for line in lines:
        if not line.strip():
            continue
        failure = "Traceback" in line or "Unhandled Error" in line
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            levels["unparsed"] += 1
        else:
            level = str(record.get("level", "?"))
            levels[level] += 1
            failure = failure or "stack" in record
            if level in ("warn", "error"):
                messages[f"{level} {record.get('namespace', '-')}: {_template(record)}"] += 1
        if failure:
            problems.append(line.rstrip("\n"))
    return LogSummary(levels, messages, tuple(problems))


def _template(record: dict[str, object]) -> str:
    # Group lines by message with the node/engine names and numbers blanked out, so one kind of
    # event is one row however many nodes it happened on.
    text = str(record.get("msg", ""))
    for key in ("node", "engine"):
        value = record.get(key)
        if isinstance(value, str) and value:
            text = text.replace(value, f"<{key}>")
    return "".join("#" if ch.isdigit() else ch for ch in text)[:120]


def read_log(path: Path) -> LogSummary:
    with path.open(errors="replace") as text:
        return summarize_log(text)
