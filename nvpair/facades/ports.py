"""Ports: what counts as one, the host facades bind, loopback aliases, and the persisted
per-engine port files.

Persisted ports (docs/ports.md#persisted-port-files) are read and atomically written as
``{"port": 11500}`` files.

Which file belongs to which engine, and what to do with the result, is the caller's business
(``engines.py`` and the service); this module only knows the file format and how to replace
a file without ever leaving a half-written one behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

import attrs

__all__ = [
    "MAX_PORT",
    "MIN_PORT",
    "PortAbsent",
    "PortCorrupt",
    "PortFound",
    "PortRead",
    "bind_host",
    "parse_alias",
    "parse_aliases",
    "read_persisted_port",
    "valid_port",
    "write_persisted_port",
]

MIN_PORT = 1
MAX_PORT = 65535

# A real port file is about 16 bytes. Reading at most this much keeps a stray multi-gigabyte
# file in the state directory from being loaded into memory just to be called corrupt.
_MAX_FILE_BYTES = 4096


@attrs.frozen
class PortFound:
    """The file holds a usable port."""

    port: int


@attrs.frozen
class PortAbsent:
    """There is no file (nor, possibly, its directory): nothing was persisted yet."""


@attrs.frozen
class PortCorrupt:
    """
    The file exists but cannot be used; the caller reports *reason* and ignores the file.

    An unreadable file (a directory in its place, no permission) lands here too: the answer to
    a file we cannot use is the same whatever the cause (docs/ports.md#persisted-port-files).
    """

    reason: str


# A union of three frozen classes rather than one class with two optional fields, so that
# "a port and a problem" or "neither" cannot be represented, and a ``match`` over the result
# is checked for exhaustiveness by mypy.
PortRead: TypeAlias = PortFound | PortAbsent | PortCorrupt


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty run of 0-9 (``str.isdigit`` also takes other scripts'
    digits and superscripts)."""
    return text.isascii() and text.isdigit()


def valid_port(value: object, *, zero: bool = False) -> bool:
    """Whether ``value`` is a TCP port (an int, never a bool); ``zero``: 0 too ("default")."""
    # bool is an int subclass, and {"port": true} is not a port.
    low = 0 if zero else MIN_PORT
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_PORT


Resolver = Callable[[str, None, int, int], object]


def bind_host(text: str, resolve: Resolver = socket.getaddrinfo) -> str:
    """``--bind``: an IP address, or a name that resolves to an IPv4 one; ValueError naming
    the host else (docs/ports.md#bind-failures).

    Checked once at start, so that a typo is a usage error naming the host rather than
    every facade failing to bind. A name is resolved as the listener will bind it: an IPv4
    socket, for anything that is not an IPv6 address literal.
    """
    if not text.strip():
        raise ValueError("must not be empty")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        return text
    try:
        resolve(text, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ValueError(f"cannot resolve host {text!r}: {why}") from None
    return text


def read_persisted_port(path: Path) -> PortRead:
    """
    Read a persisted port file.

    Extra keys next to ``port`` are ignored, so a later version may add fields without
    making this one discard the port.

    :param path: the port file, e.g. ``STATE_DIR/proxy-port.json``.
    :return: :class:`PortFound` with the port; :class:`PortAbsent` if the file does not
        exist; :class:`PortCorrupt` with a short one-line reason if it is unreadable, not
        JSON, not an object, or its ``port`` is missing, not an integer (booleans and
        ``11500.0`` included) or outside 1-65535.
    """
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return PortAbsent()
    except OSError as e:
        return PortCorrupt(f"unreadable: {e.strerror or type(e).__name__}")
    if len(data) > _MAX_FILE_BYTES:
        return PortCorrupt(f"larger than {_MAX_FILE_BYTES} bytes")
    try:
        document = json.loads(data)
    # ValueError covers bad JSON and bad UTF-8; RecursionError is what "[[[[..." raises.
    except (ValueError, RecursionError):
        return PortCorrupt("not JSON")
    if not isinstance(document, dict):
        return PortCorrupt("not a JSON object")
    if "port" not in document:
        return PortCorrupt('no "port" key')
    port = document["port"]
    if isinstance(port, bool) or not isinstance(port, int):
        return PortCorrupt('"port" is not an integer')
    if not valid_port(port):
        return PortCorrupt(f'"port" is outside {MIN_PORT}-{MAX_PORT}')
    return PortFound(port)


def write_persisted_port(
    path: Path,
    port: int,
    *,
    replace: Callable[[str, str], None] = os.replace,
) -> None:
    """
    Atomically write ``{"port": port}`` to *path*.

    The content goes to a temporary file in the same directory (a rename is only atomic
    within one filesystem), is flushed and fsynced, and then renamed over *path*. A crash at
    any point leaves either the old file or the new one, never a mixture; on failure the
    temporary file is removed. Missing directories are created.

    :param path: the port file.
    :param port: the port, 1-65535.
    :param replace: the rename step, ``os.replace`` unless a test needs it to fail.
    :raises ValueError: if *port* is not an integer in 1-65535 (nothing is written).
    :raises OSError: if the directory or file cannot be written; the old file is untouched.
    """
    if not valid_port(port):
        raise ValueError(f"port must be an integer in {MIN_PORT}-{MAX_PORT}, not {port!r}")
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    content = json.dumps({"port": port}).encode("ascii") + b"\n"
    fd, temporary = tempfile.mkstemp(dir=str(directory), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            # Without this a power cut after the rename can leave an empty file under the
            # final name on filesystems that reorder data and metadata writes.
            os.fsync(f.fileno())
        replace(temporary, str(path))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable, where the platform allows it."""
    # Best effort: the new file is already in place and readable; some platforms (Windows)
    # and filesystems cannot open or fsync a directory, and that must not fail the write.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def parse_alias(text: object) -> tuple[str, int]:
    """A loopback ``host:port`` alias (``127.0.0.1:11434``, ``[::1]:11434``); ValueError else."""
    if not isinstance(text, str):
        raise ValueError("an alias is a host:port string")
    host, sep, port_text = text.rpartition(":")
    if not sep or not ascii_digits(port_text):
        raise ValueError(f"alias {text!r} is not host:port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    port = int(port_text)
    if not valid_port(port):
        raise ValueError(f"alias {text!r} has no valid port")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"alias {text!r} is not a loopback address")
    return host, port


#: Aliases one facade may listen on: a handful is what inherited host variables need, and
#: each one is a listening socket.
MAX_ALIASES = 16


def parse_aliases(values: object) -> tuple[str, ...]:
    """A facade's aliases: a list of distinct loopback ``host:port``; ValueError says why."""
    if values is None:
        return ()
    if not isinstance(values, list):
        raise ValueError("aliases must be a list of loopback host:port")
    if len(values) > MAX_ALIASES:
        raise ValueError(f"at most {MAX_ALIASES} aliases")
    seen: set[tuple[str, int]] = set()
    for alias in values:
        parsed = parse_alias(alias)
        if parsed in seen:
            raise ValueError(f"alias {alias!r} is listed twice")
        seen.add(parsed)
    return tuple(values)
