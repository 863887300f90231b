"""The floor proxy as a process in front of simulated nodes: it relays, streams, and fails
over once on a 503 or a refused connection. Real processes on loopback, a few seconds."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.client import HTTPConnection
from pathlib import Path

from bench.contenders import (
    BODY,
    HEADERS,
    PATH,
    STREAM_BODY,
    Node,
    Running,
    Setup,
    floor,
    node,
)
from bench.held import one_stream
from bench.procs import free_port, wait_until


@contextmanager
def floor_in_front(*nodes: Node) -> Iterator[Running]:
    with tempfile.TemporaryDirectory() as tmp, floor(Setup(nodes, ordered=True), Path(tmp)) as f:
        yield f


def post(port: int) -> tuple[int, bytes]:
    connection = HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", PATH, BODY, HEADERS)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_relays_a_whole_answer() -> None:
    with node() as a, floor_in_front(a) as proxy:
        status, body = post(proxy.port)
    assert status == 200
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == " tok tok tok tok"


def test_relays_a_stream_intact() -> None:
    """Every event in order, [DONE] last, a clean end of the chunked body."""
    with node(tokens=10) as a, floor_in_front(a) as proxy:
        result = asyncio.run(one_stream(proxy.port, 14, 10))
    assert result.intact, result.error


def test_fails_over_once_on_a_503() -> None:
    with node(fault="503") as busy, node() as healthy, floor_in_front(busy, healthy) as proxy:
        status, _ = post(proxy.port)
        tried = busy.counts()[0], healthy.counts()[0]
    assert status == 200
    assert tried == (1, 1)


def test_fails_over_on_a_refused_connection() -> None:
    nowhere = Node(free_port(), free_port(), 0)
    with node() as healthy, floor_in_front(nowhere, healthy) as proxy:
        status, _ = post(proxy.port)
    assert status == 200


def test_answers_the_last_503_when_every_node_is_busy() -> None:
    with node(fault="503") as a, node(fault="503") as b, floor_in_front(a, b) as proxy:
        status, _ = post(proxy.port)
        tried = a.counts()[0], b.counts()[0]
    assert status == 503
    assert tried == (1, 1)


def test_a_client_leaving_mid_stream_ends_the_upstream_answer() -> None:
    """Backpressure's other half: the upstream stream stops when the client is gone, rather
    than running to its end into nowhere."""
    with node(tokens=100, interval=0.1) as slow, floor_in_front(slow) as proxy:
        connection = HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("POST", PATH, STREAM_BODY, HEADERS)
        response = connection.getresponse()
        assert response.status == 200
        assert response.read(1)
        connection.close()
        wait_until(lambda: slow.abandoned() == 1, 5, "the upstream answer abandoned")
