"""Through ``twistd -n nvpair-proxy --fleet`` to two real ``llama-server`` processes, each serving
the tiny GGUF under a model name of its own (``tiny-a`` on ``node-a``, ``tiny-b`` on ``node-b``).

What the simulators stand in for elsewhere, against the real engine: routing by model, a
streaming OpenAI client, the proxy's stats beside the engine's own report, failover when an
engine dies before its first byte, llama.cpp's own routes relayed untouched, and a browser's
preflight granted exactly what llama-server grants.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from tests.integration.harness import ProxyProcess, log_problems
from tests.real.servers import (
    LlamaServer,
    fleet_proxy,
    llama_server_binary,
    llama_server_process,
    post_chat,
    sleep,
)
from tests.real.tiny_gguf import write_tiny_gguf


class Pair(NamedTuple):
    a: LlamaServer
    b: LlamaServer
    binary: Path
    model: Path

    def nodes(self) -> dict[str, str]:
        """The fleet: node id to URL."""
        return {"node-a": self.a.url, "node-b": self.b.url}

    def url_of(self, node: str) -> str:
        return self.nodes()[node]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with (
        llama_server_process(binary, model, alias="tiny-a") as a,
        llama_server_process(binary, model, alias="tiny-b") as b,
    ):
        yield Pair(a, b, binary, model)


def header(response: Any, name: bytes) -> str | None:
    values = response.headers.getRawHeaders(name)
    return values[0].decode() if values else None


async def chat(port: int, model: str) -> tuple[Any, dict[str, Any]]:
    """A short non-streaming chat completion through the proxy: the response and its body."""
    response, body = await post_chat(port, model)
    assert response.code == 200, (response.code, body[:300])
    return response, json.loads(body)


def events(proxy: ProxyProcess, method: str) -> list[dict[str, Any]]:
    """Every ``method`` event so far: fleet mode logs each at debug level as a record of its
    own, the event's fields (``workloadInfo``'s and its ``stats``') the record's."""
    return [record for record in proxy.logs if record.get("method") == method]


async def get_json(url: str) -> tuple[Any, Any]:
    response = await treq.get(url, timeout=10)
    return response, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_each_model_is_answered_by_the_engine_that_serves_it(
    tmp_path: Path, pair: Pair
) -> None:
    """docs/candidate-order.md#owners: a request goes to a node that lists its model. ``tiny-b``
    is answered by ``node-b`` although ``node-a`` wins every tie by id, and ``tiny-a`` by
    ``node-a``; each answer is that engine's own (its ``model``)."""
    async with fleet_proxy(tmp_path, pair.nodes()) as (proxy, port):
        for model, node in [("tiny-b", "node-b"), ("tiny-a", "node-a"), ("tiny-b", "node-b")]:
            response, body = await chat(port, model)
            assert header(response, b"x-nvpair-node") == node
            assert body["model"] == model and body["object"] == "chat.completion"
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_openai_stream_and_the_proxy_stats_are_the_engine_report(
    tmp_path: Path, pair: Pair
) -> None:
    """An OpenAI SDK stream through the proxy arrives chunk by chunk from the engine that
    serves the model, and the workload's stats (fleet mode logs the terminal event at debug
    level) are llama-server's own figures: its ``usage`` and its ``timings`` rate, not an
    estimate."""
    async with fleet_proxy(tmp_path, pair.nodes(), "--log-level", "debug") as (proxy, port):

        def stream() -> tuple[str | None, list[str], Any, dict[str, Any]]:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            raw = client.chat.completions.with_raw_response.create(
                model="tiny-b",
                messages=[{"role": "user", "content": "hello there"}],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=8,
            )
            pieces: list[str] = []
            usage = None
            timings: dict[str, Any] = {}
            for chunk in raw.parse():
                assert chunk.model == "tiny-b"
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
                timings = (chunk.model_extra or {}).get("timings", timings)
            return raw.headers.get("x-nvpair-node"), pieces, usage, timings

        node, pieces, usage, timings = await deferToThread(stream)
        assert node == "node-b"
        assert usage is not None and len(pieces) > 1
        assert usage.completion_tokens == timings["predicted_n"] >= 1
        await proxy.wait_for_log(lambda record: record.get("method") == "workload:completed")
        (stats,) = events(proxy, "workload:completed")
        assert stats["scheduledOn"] == "node-b" and stats["model"] == "tiny-b"
        assert stats["estimated"] is False
        assert stats["promptTokens"] == usage.prompt_tokens
        assert stats["completionTokens"] == usage.completion_tokens
        assert stats["tokensPerSecond"] == round(timings["predicted_per_second"], 2)
        assert stats["ttftMs"] >= 0
        assert log_problems(proxy) == []


def placed(proxy: ProxyProcess) -> list[str]:
    """Every node a dispatch went to so far, in order."""
    return [
        info["scheduledOn"] for info in events(proxy, "workload:submitted") if "scheduledOn" in info
    ]


def request_waiting_at(port: int) -> bool:
    """Whether a connection to loopback ``port`` holds request bytes its server has not read
    (``/proc/net/tcp``: state 01, established, with a receive queue)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        waiting = int(queues.split(":")[1], 16)
        if int(local.split(":")[1], 16) == port and state == "01" and waiting > 0:
            return True
    return False


@pytest_twisted.ensureDeferred
async def test_an_engine_killed_before_its_first_byte_leaves_the_answer_to_the_other(
    tmp_path: Path, pair: Pair
) -> None:
    """docs/retry-budget.md: a transport failure before the first byte is retried on another
    owner. A third server also serves ``tiny-a`` as ``doomed`` (first by id); it is stopped,
    the request reaches it and waits unread, and it is killed (SIGKILL): the answer comes
    from ``node-a``, and the client never sees the failure."""
    with llama_server_process(pair.binary, pair.model, alias="tiny-a") as doomed:
        nodes = {"doomed": doomed.url, "node-a": pair.a.url}
        # One poll only: while the doomed server is stopped no poll of it is outstanding, and
        # it stays in discovery (the proxy learns of its death from the request alone; it is
        # killed long before its liveness probes could find it hung). Those probes may leave
        # bytes waiting at it too, so the chat is known to be there once it was dispatched.
        quiet = fleet_proxy(tmp_path, nodes, "--log-level", "debug", interval="1h")
        async with quiet as (proxy, port):
            os.kill(doomed.process.pid, signal.SIGSTOP)
            try:
                answer: Deferred[tuple[Any, dict[str, Any]]] = Deferred.fromCoroutine(
                    chat(port, "tiny-a")
                )
                deadline = time.monotonic() + 20
                while not (request_waiting_at(doomed.port) and "doomed" in placed(proxy)):
                    assert time.monotonic() < deadline, "the request never reached doomed"
                    assert not answer.called, "answered before reaching doomed"
                    await sleep(0.02)
            finally:
                os.kill(doomed.process.pid, signal.SIGKILL)
            response, body = await answer
            assert header(response, b"x-nvpair-node") == "node-a"
            assert body["model"] == "tiny-a" and body["choices"]
            assert placed(proxy) == ["doomed", "node-a"]
            assert doomed.process.wait(timeout=10) == -signal.SIGKILL
            assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("path", ["/props", "/slots"])
async def test_llamacpp_own_routes_pass_through(tmp_path: Path, pair: Pair, path: str) -> None:
    """docs/request-path.md: a route outside inference and model lists is forwarded to one
    node and its answer relayed as the engine sent it: ``/props`` (the serving model's alias
    among it) and ``/slots`` through the proxy equal what that node answers directly."""
    async with fleet_proxy(tmp_path, pair.nodes()) as (proxy, port):
        response, relayed = await get_json(f"http://127.0.0.1:{port}{path}")
        node = header(response, b"x-nvpair-node")
        assert response.code == 200 and node in pair.nodes()
        direct_response, direct = await get_json(pair.url_of(node) + path)
        assert direct_response.code == 200
        assert relayed == direct
        if path == "/props":
            assert relayed["model_alias"] == {"node-a": "tiny-a", "node-b": "tiny-b"}[node]
        else:
            assert [slot["id"] for slot in relayed] == [0, 1]
        assert log_problems(proxy) == []


def access_control(response: Any) -> dict[str, list[bytes]]:
    return {
        name.decode().lower(): values
        for name, values in response.headers.getAllRawHeaders()
        if name.lower().startswith(b"access-control-")
    }


@pytest_twisted.ensureDeferred
async def test_a_browser_preflight_is_granted_what_llama_server_grants(
    tmp_path: Path, pair: Pair
) -> None:
    """docs/browser-policy.md#preflight: a preflight is asked of every node and, all granting,
    answered 204 with their intersection. Two llama-servers grant alike (the origin reflected,
    credentials, their methods, any header), so the proxy grants exactly that, with
    ``Vary: Origin`` since the origin is echoed."""
    origin = b"http://127.0.0.2:9000"
    preflight = Headers(
        {
            b"Origin": [origin],
            b"Access-Control-Request-Method": [b"POST"],
            b"Access-Control-Request-Headers": [b"content-type, authorization"],
        }
    )

    async def ask(base: str) -> Any:
        response = await treq.request(
            "OPTIONS", base + "/v1/chat/completions", headers=preflight, timeout=10
        )
        await response.content()
        return response

    engines = [await ask(server.url) for server in (pair.a, pair.b)]
    assert [r.code for r in engines] == [200, 200]
    granted = access_control(engines[0])
    assert granted == access_control(engines[1])
    assert granted["access-control-allow-origin"] == [origin]
    async with fleet_proxy(tmp_path, pair.nodes()) as (proxy, port):
        response = await ask(f"http://127.0.0.1:{port}")
        assert response.code == 204
        assert access_control(response) == granted
        assert response.headers.getRawHeaders(b"vary") == [b"Origin"]
        assert not response.headers.hasHeader(b"x-nvpair-error")
        assert log_problems(proxy) == []
