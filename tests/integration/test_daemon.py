"""The real ``twistd -n nvpair-proxy`` process, driven over its stdio as the broker would."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task
from twisted.web.http_headers import Headers

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims
from tests.integration.harness import TWISTD, free_port, run_twistd


def node(node_id: str, url: str, *models: str) -> dict[str, object]:
    return {"id": node_id, "url": url, "models": list(models)}


def test_twistd_lists_the_plugin() -> None:
    """After the README's install, `twistd --help` lists nvpair-proxy."""
    out = subprocess.run([TWISTD, "--help"], capture_output=True, text=True, check=True).stdout
    assert "nvpair-proxy" in out


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--dial-timeout", "10"),
        ("--job-deadline", "ten minutes"),
        ("--max-dispatch-attempts", "0"),
        ("--log-level", "loud"),
        ("--admin-port", "70000"),
    ],
)
def test_malformed_option_exits_nonzero_naming_it(tmp_path: Path, flag: str, value: str) -> None:
    result = run_twistd(tmp_path, flag, value)
    assert result.returncode != 0
    assert flag in result.stderr + result.stdout


@pytest_twisted.ensureDeferred
async def test_enable_announces_ready_and_subscribes(tmp_path: Path) -> None:
    """facade/enable: result, <engine>:ready with all three fields, then discovery:subscribe."""
    async with running_proxy(tmp_path) as proxy:
        port = free_port()
        answer = await proxy.request(
            "facade/enable", {"engine": "lmstudio", "port": port, "aliases": []}
        )
        assert answer["result"] == {"engine": "lmstudio", "port": port, "aliases": []}
        ready = await proxy.wait_for_method("lmstudio:ready")
        assert ready["params"] == {"port": port, "aliases": [], "tls": False}
        subscribe = await proxy.wait_for_method("lmstudio:discovery:subscribe")
        assert subscribe["params"] == {} and "id" in subscribe
        again = await proxy.request("facade/enable", {"engine": "lmstudio", "port": port})
        assert again["result"]["port"] == port
        moved = await proxy.request("facade/enable", {"engine": "lmstudio", "port": port + 1})
        assert moved["error"]["code"] == -32602


@pytest_twisted.ensureDeferred
async def test_inference_streams_through_the_owner(tmp_path: Path) -> None:
    """Filter to owners (Ollama names normalized), stream the answer chunk by chunk."""
    async with (
        sims(("ollama", ["qwen2:7b"], "node-a"), ("ollama", ["llama3:latest"], "node-b")) as (
            a,
            b,
        ),
        running_proxy(tmp_path) as proxy,
    ):
        b.chunk_interval = 0.05
        port = await enabled_proxy_for(
            proxy,
            "ollama",
            [node("a", a.url, "qwen2:7b"), node("b", b.url, "llama3:latest")],
        )
        response = await treq.post(
            f"http://127.0.0.1:{port}/api/chat",
            json.dumps(
                {"model": "Llama3", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            unbuffered=True,
        )
        assert response.code == 200
        assert response.headers.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
        arrivals: list[bytes] = []
        await response.collect(arrivals.append)
        lines = [json.loads(line) for line in b"".join(arrivals).splitlines()]
        assert "".join(line["message"]["content"] for line in lines) == "".join(b.tokens)
        assert lines[-1]["done"] is True
        # Streamed, not buffered: the answer arrived in more than one piece.
        assert len(arrivals) > 1
        assert [r.path for r in a.requests] == []
        assert [r.path for r in b.requests] == ["/api/chat"]


@pytest_twisted.ensureDeferred
async def test_pin_then_priority_then_default(tmp_path: Path) -> None:
    """node/select pins an eligible node; an ineligible pin is ignored."""
    async with (
        sims(
            ("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b"), ("llamacpp", ["big"], "c")
        ) as (a, b, c),
        running_proxy(tmp_path) as proxy,
    ):
        nodes = [node("a", a.url, "tiny"), node("b", b.url, "tiny"), node("c", c.url, "big")]
        port = await enabled_proxy_for(proxy, "llamacpp", nodes)
        url = f"http://127.0.0.1:{port}/completion"

        async def served_by() -> str:
            response = await treq.post(url, json.dumps({"model": "tiny", "prompt": "x"}).encode())
            await response.content()
            assert response.code == 200
            for sim in (a, b, c):
                if sim.requests:
                    sim.requests.clear()
                    return str(sim.node)
            raise AssertionError("nobody served")

        assert await served_by() == "a"
        proxy.notify("llamacpp:node/select", {"nodeId": "b"})
        await proxy.barrier()
        assert await served_by() == "b"
        proxy.notify("llamacpp:node/select", {"nodeId": "c"})
        proxy.notify(
            "node/set-priority",
            {"generation": 1, "nodes": [{"id": "b", "pending": 0, "gpuPressure": 0}]},
        )
        await proxy.barrier()
        assert await served_by() == "b"
        proxy.notify("llamacpp:node/select", {"nodeId": None})
        proxy.notify(
            "node/set-priority",
            {
                "generation": 2,
                "nodes": [
                    {"id": "a", "pending": 3, "gpuPressure": 0},
                    {"id": "b", "pending": 0, "gpuPressure": 0.5},
                ],
            },
        )
        await proxy.barrier()
        assert await served_by() == "b"
        # A stale generation is ignored.
        proxy.notify(
            "node/set-priority",
            {"generation": 1, "nodes": [{"id": "a", "pending": 0, "gpuPressure": 0}]},
        )
        await proxy.barrier()
        assert await served_by() == "b"


@pytest_twisted.ensureDeferred
async def test_proxy_generated_errors_in_the_facade_dialect(tmp_path: Path) -> None:
    """No owner → 502; bad bodies → 400/413; X-Nvpair-Error; no CORS headers; no workload."""
    async with (
        sims(("ollama", ["llama3:latest"], "a")) as (a,),
        running_proxy(tmp_path, "--max-request-body", "1000") as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", [node("a", a.url, "llama3:latest")])
        base = f"http://127.0.0.1:{port}"
        headers: dict[str | bytes, str | bytes] = {"Origin": "http://localhost"}
        cases: list[tuple[str, bytes, int, str, dict[str, type]]] = [
            ("/api/chat", b'{"model":"mistral"}', 502, "no-owner", {"error": str}),
            ("/v1/chat/completions", b'{"model":"mistral"}', 502, "no-owner", {"error": dict}),
            ("/api/chat", b"[1,2]", 400, "bad-json", {"error": str}),
            ("/api/chat", b"{not json", 400, "bad-json", {"error": str}),
            ("/api/chat", b'{"messages":[]}', 400, "model-missing", {"error": str}),
            (
                "/api/chat",
                b'{"model":"llama3","pad":"' + b"x" * 2000 + b'"}',
                413,
                "body-too-large",
                {"error": str},
            ),
        ]
        for path, body, status, reason, shape in cases:
            response = await treq.post(base + path, body, headers=headers)
            document: dict[str, Any] = json.loads(await response.content())
            assert response.code == status, (path, body[:20])
            assert response.headers.getRawHeaders(b"x-nvpair-error") == [reason.encode()]
            if shape["error"] is dict:
                assert document["error"]["code"] == reason
                assert document["error"]["type"] == "nvpair_proxy"
            else:
                assert isinstance(document["error"], str)
            cors = [
                n
                for n, _ in response.headers.getAllRawHeaders()
                if n.lower().startswith(b"access-control-")
            ]
            assert cors == []
        assert a.requests == []


@pytest_twisted.ensureDeferred
async def test_other_routes_are_forwarded_verbatim(tmp_path: Path) -> None:
    """Unclassified routes reach an engine unchanged: method, path, query, body, headers."""
    async with (
        sims(("ollama", ["llama3:latest"], "a")) as (a,),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", [node("a", a.url, "llama3:latest")])
        response = await treq.request(
            "DELETE",
            f"http://127.0.0.1:{port}/api/delete?x=1",
            data=b'{"model":"llama3"}',
            headers=Headers(
                {b"X-Custom": [b"kept"], b"Proxy-Authorization": [b"hop"], b"TE": [b"trailers"]}
            ),
        )
        assert response.code == 200 and await response.content() == b""
        seen = a.requests[-1]
        assert (seen.method, seen.path, seen.body) == (
            "DELETE",
            "/api/delete?x=1",
            b'{"model":"llama3"}',
        )
        assert seen.headers["x-custom"] == ["kept"]
        assert "proxy-authorization" not in seen.headers and "te" not in seen.headers
        version = await treq.get(f"http://127.0.0.1:{port}/api/version")
        assert version.code == 200 and "version" in json.loads(await version.content())


@pytest_twisted.ensureDeferred
async def test_client_disconnect_closes_the_upstream(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path) as proxy,
    ):
        a.chunk_interval = 0.2
        a.tokens = [f" t{i}" for i in range(200)]
        port = await enabled_proxy_for(proxy, "llamacpp", [node("a", a.url, "tiny")])
        client = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"model": "tiny", "prompt": "x", "stream": True}).encode()
        client.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        for _ in range(50):
            await task.deferLater(reactor, 0.05, lambda: None)
            if a.in_flight:
                break
        assert a.in_flight == 1
        client.close()
        for _ in range(50):
            await task.deferLater(reactor, 0.05, lambda: None)
            if not a.in_flight:
                break
        assert a.in_flight == 0 and a.abandoned == 1


@pytest_twisted.ensureDeferred
async def test_admin_surface_on_loopback(tmp_path: Path) -> None:
    """--admin-port: health, readiness, status (facades, nodes, in flight) and metrics."""
    admin = free_port()
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path, "--admin-port", str(admin)) as proxy,
    ):
        base = f"http://127.0.0.1:{admin}"
        await proxy.barrier()  # started: the admin listener is up
        # No facade enabled, no snapshot: serving, not ready.
        health = await treq.get(base + "/healthz")
        assert health.code == 200 and json.loads(await health.content()) == {"status": "ok"}
        unready = await treq.get(base + "/readyz")
        assert unready.code == 503
        assert json.loads(await unready.content())["waitingFor"] == [
            "control state not received yet"
        ]
        port = await enabled_proxy_for(proxy, "llamacpp", [node("a", a.url, "tiny")])
        ready = await treq.get(base + "/readyz")
        assert ready.code == 200
        assert json.loads(await ready.content()) == {
            "ready": True,
            "waitingFor": [],
            "enginesWithoutNodes": [],
        }
        status = json.loads(await (await treq.get(base + "/status")).content())
        assert status["mode"] == "broker"
        assert status["facades"] == {"llamacpp": {"port": port, "aliases": [], "tls": False}}
        assert status["inFlight"] == 0
        assert status["reservations"] == {}
        assert status["pin"] == {"llamacpp": None}
        assert status["nodes"]["llamacpp"] == [
            {
                "id": "a",
                "local": False,
                "url": a.url,
                "models": ["tiny"],
                "listed": True,
                "pending": 0,
                "gpuPressure": 0,
                "reservations": 0,
                "inFlight": 0,
            }
        ]
        metrics = (await (await treq.get(base + "/metrics")).content()).decode()
        assert f'nvpair_facade_port{{engine="llamacpp"}} {port}' in metrics
        assert 'nvpair_discovery_nodes{engine="llamacpp"} 1' in metrics
