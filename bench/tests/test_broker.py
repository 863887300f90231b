"""The bench's broker: answers the proxy's subscription, matches answers to requests, drains
notifications; and the discovery snapshot it sends."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from bench.broker import Broker, BrokerError, snapshot

#: A stand-in for the proxy's side of the link: enable, subscribe, a workload event, the barrier.
PROXY = textwrap.dedent(
    """
    import json, sys

    def out(frame):
        sys.stdout.write(json.dumps(frame) + "\\n")
        sys.stdout.flush()

    def read():
        return json.loads(sys.stdin.readline())

    enable = read()
    assert enable["method"] == "facade/enable", enable
    out({"jsonrpc": "2.0", "method": "workload:submitted", "params": {}})
    out({"jsonrpc": "2.0", "id": enable["id"], "result": {"engine": "ollama", "port": 1}})
    out({"jsonrpc": "2.0", "id": 7, "method": "ollama:discovery:subscribe", "params": {}})
    answer = read()
    assert answer == {"jsonrpc": "2.0", "id": 7, "result": {}}, answer
    nodes = read()
    assert nodes["method"] == "ollama:discovery:nodes", nodes
    barrier = read()
    out({"jsonrpc": "2.0", "id": barrier["id"], "error": {"code": -32601, "message": "no"}})
    refused = read()
    out({"jsonrpc": "2.0", "id": refused["id"], "error": {"code": -32602, "message": "bad"}})
    assert sys.stdin.readline() == ""  # EOF
    """
)


def test_the_broker_plays_its_part_of_the_link() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PROXY], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        broker = Broker(child)
        broker.enable("ollama", 1)
        broker.notify("ollama:discovery:nodes", snapshot({"n0": "http://x"}, {"n0": ["m:1b"]}))
        broker.barrier()
        with pytest.raises(BrokerError):
            broker.enable("ollama", 2)
        broker.close()
        assert child.wait(timeout=10) == 0
        broker.drained()
        assert broker.notifications["workload:submitted"] == 1
    finally:
        child.kill()
        child.wait()


def test_a_snapshot_lists_every_node_with_its_url_and_models() -> None:
    urls = {"n1": "http://127.0.0.1:2", "n0": "http://127.0.0.1:1"}
    params = snapshot(urls, {"n0": ("a:1b",), "n1": ("a:1b", "b:7b")})
    assert params == {
        "nodes": [
            {"id": "n0", "url": "http://127.0.0.1:1", "models": ["a:1b"]},
            {"id": "n1", "url": "http://127.0.0.1:2", "models": ["a:1b", "b:7b"]},
        ]
    }
