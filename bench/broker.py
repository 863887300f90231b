"""Plays the broker on a proxy's stdio (docs/broker-protocol.md), from a thread.

The bench is synchronous, so a reader thread takes every line the proxy writes to stdout: the
answers to this side's requests, the proxy's own requests (``<engine>:discovery:subscribe``,
answered ``{}`` as a broker does), and its notifications (workload events, node activity),
which are counted and dropped. stdout must be drained all the time: a proxy whose pipe fills
would block on its next event.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import IO, Any

Frame = dict[str, Any]


class BrokerError(RuntimeError):
    """The proxy answered with an error, or not in time."""


class Broker:
    """The broker side of one proxy process started with ``stdin`` and ``stdout`` as pipes.

    :param child: the proxy.
    """

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        if child.stdin is None or child.stdout is None:
            raise ValueError("the proxy needs stdin and stdout as pipes")
        self._stdin: IO[bytes] = child.stdin
        self._stdout: IO[bytes] = child.stdout
        self._write_lock = threading.Lock()
        self._changed = threading.Condition()
        self._answers: dict[int, Frame] = {}
        self._subscribed: set[str] = set()
        self._next_id = 0
        self.notifications: Counter[str] = Counter()
        """Notifications received, by method."""
        self._reader = threading.Thread(target=self._read, name="broker-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stdout:
            try:
                frame = json.loads(line)
            except ValueError:
                continue  # stdout is the broker's: the tests hold it clean
            if not isinstance(frame, dict):
                continue
            method = frame.get("method")
            if isinstance(method, str) and "id" in frame:
                self._answer_request(frame, method)
            elif isinstance(method, str):
                self.notifications[method] += 1
            elif isinstance(frame.get("id"), int):
                with self._changed:
                    self._answers[frame["id"]] = frame
                    self._changed.notify_all()

    def _answer_request(self, frame: Frame, method: str) -> None:
        engine, _, rest = method.partition(":")
        if rest == "discovery:subscribe":
            self.send({"jsonrpc": "2.0", "id": frame["id"], "result": {}})
            with self._changed:
                self._subscribed.add(engine)
                self._changed.notify_all()
        else:
            error = {"code": -32601, "message": f"the bench's broker has no {method}"}
            self.send({"jsonrpc": "2.0", "id": frame["id"], "error": error})

    def send(self, frame: Frame) -> None:
        line = json.dumps(frame).encode() + b"\n"
        with self._write_lock:
            self._stdin.write(line)
            self._stdin.flush()

    def notify(self, method: str, params: Mapping[str, object]) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": dict(params)})

    def request(self, method: str, params: Mapping[str, object], timeout: float = 30) -> Frame:
        """Send a request; the whole answer frame (``result`` or ``error``)."""
        with self._changed:
            self._next_id += 1
            request_id = self._next_id
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)})
        with self._changed:
            if not self._changed.wait_for(lambda: request_id in self._answers, timeout):
                raise BrokerError(f"no answer to {method} after {timeout}s")
            return self._answers.pop(request_id)

    def wait_subscribed(self, engine: str, timeout: float = 30) -> None:
        """Until the proxy has asked for ``engine``'s discovery (and been answered)."""
        with self._changed:
            if not self._changed.wait_for(lambda: engine in self._subscribed, timeout):
                raise BrokerError(f"no {engine}:discovery:subscribe after {timeout}s")

    def barrier(self) -> None:
        """Until the proxy has handled every line sent so far: lines are handled in order, so
        the answer to an unknown method (-32601) comes after every notification before it."""
        answer = self.request("bench/barrier", {})
        if answer.get("error", {}).get("code") != -32601:
            raise BrokerError(f"unexpected answer to the barrier: {answer}")

    def enable(self, engine: str, port: int) -> None:
        """``facade/enable`` on ``port`` (ignoring a persisted one), then the subscription."""
        params = {"engine": engine, "port": port, "ignorePersistedPort": True}
        answer = self.request("facade/enable", params)
        if "result" not in answer:
            raise BrokerError(f"facade/enable {engine} on {port}: {answer.get('error')}")
        self.wait_subscribed(engine)

    def close(self) -> None:
        """EOF on the proxy's stdin: it stops its facades and exits 0."""
        with self._write_lock:
            self._stdin.close()

    def drained(self, timeout: float = 10) -> None:
        """After the proxy has exited: its last lines read, its stdout closed."""
        self._reader.join(timeout)
        if not self._reader.is_alive():
            self._stdout.close()


def snapshot(urls: Mapping[str, str], inventories: Mapping[str, Sequence[str]]) -> Frame:
    """``discovery:nodes`` params: every node by id, plaintext ``url``, its models."""
    return {
        "nodes": [
            {"id": node, "url": url, "models": list(inventories[node])}
            for node, url in sorted(urls.items())
        ]
    }
