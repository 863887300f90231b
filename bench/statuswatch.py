"""What the proxy's ``/status`` said of each node's cache while a multi-turn run played.

A thread reads the admin listener's ``/status`` once a second (``nodes.llamacpp[*].cache``:
the node's cache share over its last answers and, while affinity skips it, ``suspendedUntil``;
docs/operations.md#status) and keeps each reading with the seconds since the run began. The
reading of what it kept is pure (:func:`first_suspensions`) and tested on its own.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence

import attrs

#: One reading: seconds since the run began, and node id -> its ``cache`` object (or None).
Reading = tuple[float, Mapping[str, object]]


def node_caches(status: object, engine: str = "llamacpp") -> dict[str, object]:
    """Node id -> its ``cache`` entry in a ``/status`` document (None where it has none)."""
    nodes = status.get("nodes") if isinstance(status, dict) else None
    listed = nodes.get(engine) if isinstance(nodes, dict) else None
    out: dict[str, object] = {}
    for node in listed if isinstance(listed, list) else ():
        if isinstance(node, dict) and isinstance(node.get("id"), str):
            out[node["id"]] = node.get("cache")
    return out


@attrs.frozen
class Suspension:
    """When a node was first seen suspended, and what its cache entry said then."""

    node: str
    seconds: float
    cache: Mapping[str, object]


def first_suspensions(readings: Sequence[Reading]) -> list[Suspension]:
    """Each node's first reading with ``suspendedUntil`` set, in the order they came."""
    seen: dict[str, Suspension] = {}
    for seconds, caches in readings:
        for node, cache in caches.items():
            if node in seen or not isinstance(cache, dict):
                continue
            if cache.get("suspendedUntil") is not None:
                seen[node] = Suspension(node, seconds, cache)
    return sorted(seen.values(), key=lambda s: s.seconds)


class StatusWatch:
    """Reads ``/status`` on ``admin`` every ``interval`` seconds from :meth:`start` to
    :meth:`stop`; :attr:`readings` holds what it read (a failed read is skipped)."""

    def __init__(self, admin: int, interval: float = 1.0) -> None:
        self._url = f"http://127.0.0.1:{admin}/status"
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._began = 0.0
        self.readings: list[Reading] = []

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            try:
                with urllib.request.urlopen(self._url, timeout=5) as answer:
                    status = json.loads(answer.read())
            except (OSError, ValueError):
                continue
            self.readings.append((time.monotonic() - self._began, node_caches(status)))
