"""What the multi-turn bench reads of the proxy's /status while a run plays."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.statuswatch import (
    Reading,
    StatusWatch,
    Suspension,
    first_suspensions,
    node_caches,
)

SUSPENDED = {"share": 0.02, "answers": 20, "suspendedUntil": "2026-12-02T14:02:11.000+00:00"}


def status(n0: object, n1: object = None) -> dict[str, object]:
    return {
        "mode": "fleet",
        "nodes": {"llamacpp": [{"id": "n0", "cache": n0}, {"id": "n1", "cache": n1}]},
    }


def test_node_caches_reads_each_node_s_cache_entry() -> None:
    assert node_caches(status({"share": 0.5}, None)) == {"n0": {"share": 0.5}, "n1": None}
    # A tree without the field, or a document of another shape: nothing, never a crash.
    assert node_caches({"nodes": {"llamacpp": [{"id": "n0"}]}}) == {"n0": None}
    odd_ones: list[object] = [None, [], {"nodes": []}, {"nodes": {"llamacpp": [1, {"id": 2}]}}]
    for odd in odd_ones:
        assert node_caches(odd) == {}


def test_the_first_reading_with_a_suspension_is_kept_per_node() -> None:
    later = {**SUSPENDED, "answers": 30}
    readings: list[Reading] = [
        (1.0, {"n0": {"share": 0.1, "suspendedUntil": None}, "n1": None}),
        (2.0, {"n0": SUSPENDED, "n1": {"share": 0.9, "suspendedUntil": None}}),
        (3.0, {"n0": later, "n1": {"share": 0.1, "suspendedUntil": "x"}}),
    ]
    assert first_suspensions(readings) == [
        Suspension("n0", 2.0, SUSPENDED),
        Suspension("n1", 3.0, {"share": 0.1, "suspendedUntil": "x"}),
    ]
    assert first_suspensions([]) == []


@contextmanager
def admin(documents: list[bytes]) -> Iterator[int]:
    """An HTTP server answering ``/status`` with each of ``documents`` in turn (then the last)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = documents.pop(0) if len(documents) > 1 else documents[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_watch_reads_status_over_a_socket_and_skips_what_it_cannot_read() -> None:
    documents = [
        b"not json",
        json.dumps(status(None)).encode(),
        json.dumps(status(SUSPENDED)).encode(),
    ]
    with admin(documents) as port:
        watch = StatusWatch(port, interval=0.05)
        watch.start()
        deadline = time.monotonic() + 10
        while len(watch.readings) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        watch.stop()
    assert watch.readings[0][1] == {"n0": None, "n1": None}
    assert [s.node for s in first_suspensions(watch.readings)] == ["n0"]
    assert all(seconds > 0 for seconds, _ in watch.readings)


def test_a_watch_on_a_closed_port_reads_nothing_and_stops() -> None:
    with admin([b"{}"]) as port:
        pass
    watch = StatusWatch(port, interval=0.01)
    watch.start()
    time.sleep(0.1)
    watch.stop()
    assert watch.readings == []
