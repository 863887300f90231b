"""Hung nodes against real ``llama-server`` processes stopped with SIGSTOP (issue 22 item 6;
docs/fleet-scheduling.md#hung-nodes), through ``twistd -n nvpair-proxy --fleet``.

A stopped server accepts connections (the kernel queues them) and answers nothing: it fails no
poll until the poll's own bound (tens of seconds) runs out. The liveness probe (``GET /health``
every 2 s, bounded at 2 s) finds it: it stops being dispatched to within 5 s, a request waiting
on its headers there fails over within 6 s, and with every owner stopped the client gets its
503 within ``--owner-wait`` + 6 s. With SIGCONT it comes back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import pytest_twisted
import treq

from tests.integration.harness import ProxyProcess, free_port, log_problems
from tests.real.servers import (
    LlamaServer,
    fleet_proxy,
    llama_server_binary,
    llama_server_process,
    post_chat,
    sleep,
)
from tests.real.test_llama_pair import placed
from tests.real.tiny_gguf import write_tiny_gguf


class Engines(NamedTuple):
    binary: Path
    model: Path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Engines:
    return Engines(
        llama_server_binary(), write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    )


@pytest.fixture
def pair(engines: Engines) -> Iterator[tuple[LlamaServer, LlamaServer]]:
    """Two fresh servers of ``tiny`` per test: ``a`` (first by node id) is the one stopped."""
    with (
        llama_server_process(engines.binary, engines.model) as a,
        llama_server_process(engines.binary, engines.model) as b,
    ):
        yield a, b


async def chat(port: int) -> tuple[int, str | None, str | None]:
    """A short chat completion for ``tiny``; (status, X-Nvpair-Node, X-Nvpair-Error)."""
    response, _ = await post_chat(port, timeout=120)

    def header(name: bytes) -> str | None:
        values = response.headers.getRawHeaders(name)
        return values[0].decode() if values else None

    return int(response.code), header(b"x-nvpair-node"), header(b"x-nvpair-error")


def hung_after(proxy: ProxyProcess, stopped_at: float) -> float:
    """Seconds from ``stopped_at`` (wall clock) to the proxy's warning that ``a`` is hung."""
    (warned,) = [r for r in proxy.logs if "a's llamacpp is hung" in str(r.get("msg"))]
    return float(warned["time"]) - stopped_at


async def status_of(admin: int, node: str) -> dict[str, Any]:
    response = await treq.get(f"http://127.0.0.1:{admin}/status", timeout=10)
    status = json.loads(await response.content())
    (entry,) = [n for n in status["nodes"]["llamacpp"] if n["id"] == node]
    return dict(entry)


@pytest_twisted.ensureDeferred
async def test_a_stopped_engine_stops_being_dispatched_to_within_5s_and_comes_back(
    tmp_path: Path, pair: tuple[LlamaServer, LlamaServer]
) -> None:
    """Both servers idle: ``a`` first by id, then ``b``, so that ``a`` is the one dispatched
    to least recently (docs/fleet-scheduling.md#ties-spread). Stopped and left alone, ``a``
    gets nothing sent to it 4.5 s later: its unanswered probe has sent it after ``b`` already,
    or it is hung.
    Once hung, ``/status`` says so and why. SIGCONT: ``a`` is up and serves again."""
    a, b = pair
    admin = free_port()
    nodes = {"a": a.url, "b": b.url}
    async with fleet_proxy(tmp_path, nodes, "--log-level", "debug", "--admin-port", str(admin)) as (
        proxy,
        port,
    ):
        assert (await chat(port))[:2] == (200, "a")
        assert (await chat(port))[:2] == (200, "b")
        os.kill(a.process.pid, signal.SIGSTOP)
        stopped_at = time.time()
        await sleep(4.5)
        began = time.monotonic()
        assert await chat(port) == (200, "b", None)
        assert time.monotonic() - began < 1
        assert placed(proxy) == ["a", "b", "b"]
        await sleep(max(0.0, stopped_at + 6.5 - time.time()))
        detected = hung_after(proxy, stopped_at)
        print(f"a stopped engine found hung {detected:.2f}s after SIGSTOP")
        assert detected < 6.5
        entry = await status_of(admin, "a")
        assert entry["state"] == "hung"
        # Two probes made it hung; the count goes on while it lasts.
        why = re.fullmatch(
            r"no answer to (\d+) liveness probes in a row \(GET /health, 2s each\)", entry["why"]
        )
        assert why is not None and int(why.group(1)) >= 2, entry
        for _ in range(3):
            assert (await chat(port))[:2] == (200, "b")
        os.kill(a.process.pid, signal.SIGCONT)
        resumed = time.monotonic()
        while (await status_of(admin, "a"))["state"] != "up":
            assert time.monotonic() - resumed < 5, "a never came back"
            await sleep(0.1)
        print(f"a up again {time.monotonic() - resumed:.2f}s after SIGCONT")
        assert (await chat(port))[:2] == (200, "a")
        assert "a" not in placed(proxy)[3:-1]
        assert [p for p in log_problems(proxy) if "is hung" not in p] == []


@pytest_twisted.ensureDeferred
async def test_an_attempt_waiting_on_a_stopped_engine_fails_over_within_6s(
    tmp_path: Path, pair: tuple[LlamaServer, LlamaServer]
) -> None:
    """``a`` stopped just before the request reaches it: the request waits on its headers
    until ``a`` is found hung, then is answered by ``b`` — within 6 s (44 s before the
    probe: the poll's own bound and interval)."""
    a, b = pair
    nodes = {"a": a.url, "b": b.url}
    async with fleet_proxy(tmp_path, nodes, "--log-level", "debug") as (proxy, port):
        assert (await chat(port))[:2] == (200, "a")
        # Ties spread: the next new conversation goes to b, which leaves a the one dispatched
        # to least recently, first for the request after (docs/fleet-scheduling.md#ties-spread).
        assert (await chat(port))[:2] == (200, "b")
        os.kill(a.process.pid, signal.SIGSTOP)
        began = time.monotonic()
        assert await chat(port) == (200, "b", None)
        took = time.monotonic() - began
        print(f"an attempt waiting on a stopped engine failed over after {took:.2f}s")
        assert took < 6.5
        assert placed(proxy) == ["a", "b", "a", "b"]
        assert [p for p in log_problems(proxy) if "is hung" not in p] == []


@pytest_twisted.ensureDeferred
async def test_with_every_owner_stopped_the_client_gets_its_503_within_owner_wait_plus_6s(
    tmp_path: Path, engines: Engines
) -> None:
    """The only server stopped just before the request: found hung, then the owner wait
    (5 s here), then 503 ``no-owner-timeout`` — within ``--owner-wait`` + 6 s (70 s before
    with a 30 s owner wait)."""
    with llama_server_process(engines.binary, engines.model) as a:
        async with fleet_proxy(tmp_path, {"a": a.url}, "--owner-wait", "5s") as (proxy, port):
            assert (await chat(port))[:2] == (200, "a")
            os.kill(a.process.pid, signal.SIGSTOP)
            began = time.monotonic()
            assert await chat(port) == (503, None, "no-owner-timeout")
            took = time.monotonic() - began
            print(f"every owner stopped: 503 after {took:.2f}s with --owner-wait 5s")
            assert 5 <= took < 5 + 6.5
            assert [p for p in log_problems(proxy) if "is hung" not in p] == []
