"""Fleet inventories and browser policy through the real process (issue 5, docs/inventories.md,
docs/browser-policy.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.web.http_headers import Headers

from nvpair.sim import SimEngine
from tests.integration.conftest import enabled_proxy_for, running_proxy, sims


def nodes_for(*engines: SimEngine) -> list[dict[str, object]]:
    return [{"id": e.node, "url": e.url, "models": list(e.models)} for e in engines]


def cors_headers(response: Any) -> dict[bytes, list[bytes]]:
    return {
        name.lower(): values
        for name, values in response.headers.getAllRawHeaders()
        if name.lower().startswith(b"access-control-")
    }


async def get(port: int, path: str, method: str = "GET", **headers: str) -> tuple[Any, bytes]:
    raw = Headers({k.replace("_", "-").encode(): [v.encode()] for k, v in headers.items()})
    response = await treq.request(method, f"http://127.0.0.1:{port}{path}", headers=raw)
    return response, await response.content()


@pytest_twisted.ensureDeferred
async def test_ollama_tags_merge_across_nodes(tmp_path: Path) -> None:
    """Node order, first occurrence wins (by normalized name), newest first, HEAD bodiless."""
    async with (
        sims(
            ("ollama", ["llama3:latest", "qwen2:7b"], "a"), ("ollama", ["Llama3", "phi3"], "b")
        ) as (a, b),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", nodes_for(a, b))
        response, body = await get(port, "/api/tags")
        assert response.code == 200, body
        names = sorted(m["name"] for m in json.loads(body)["models"])
        assert names == ["llama3:latest", "phi3:latest", "qwen2:7b"]
        direct_a = json.loads(await (await treq.get(a.url + "/api/tags")).content())
        merged = {m["name"]: m for m in json.loads(body)["models"]}
        # Entries pass through untouched: llama3 is node a's own entry.
        assert merged["llama3:latest"] == next(
            m for m in direct_a["models"] if m["name"] == "llama3:latest"
        )
        head, head_body = await get(port, "/api/tags", method="HEAD")
        assert head.code == 200 and head_body == b""
        assert {r.path for r in a.requests} >= {"/api/tags"}


@pytest_twisted.ensureDeferred
async def test_empty_envelopes_and_llamacpp_aliases(tmp_path: Path) -> None:
    async with (
        sims(("ollama", [], "a"), ("llamacpp", ["tiny"], "c"), ("llamacpp", ["tiny"], "d")) as (
            a,
            c,
            d,
        ),
        running_proxy(tmp_path) as proxy,
    ):
        ollama = await enabled_proxy_for(proxy, "ollama", nodes_for(a))
        _, body = await get(ollama, "/v1/models")
        assert json.loads(body) == {"object": "list", "data": None}
        _, body = await get(ollama, "/api/ps")
        assert json.loads(body) == {"models": []}
        proxy.answer_subscribes()
        llamacpp = await enabled_proxy_for(proxy, "llamacpp", nodes_for(c, d))
        for path in ("/models", "/v1/models"):
            response, body = await get(llamacpp, path)
            document = json.loads(body)
            assert response.code == 200 and document["object"] == "list"
            assert [m["id"] for m in document["data"]] == ["tiny"]
        # Both aliases ask each node's GET /models.
        assert [r.path for r in c.requests if r.method == "GET"] == ["/models", "/models"]


@pytest_twisted.ensureDeferred
async def test_unavailable_invalid_and_no_responders(tmp_path: Path) -> None:
    async with (
        sims(("lmstudio", ["q1"], "a"), ("lmstudio", ["q2"], "b")) as (a, b),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "lmstudio", nodes_for(a, b))
        _, body = await get(port, "/v1/models")
        assert [m["id"] for m in json.loads(body)["data"]] == ["q1", "q2"]
        await b.refuse()  # unavailable: skipped
        _, body = await get(port, "/v1/models")
        assert [m["id"] for m in json.loads(body)["data"]] == ["q1"]
        b.resume()
        b.faults.inventory_invalid = True  # one invalid responder: no partial list
        response, body = await get(port, "/v1/models")
        assert response.code == 502
        assert response.headers.getRawHeaders(b"x-nvpair-error") == [b"inventory-invalid"]
        b.faults.inventory_invalid = False
        b.faults.inventory_status = 500
        response, _ = await get(port, "/api/v1/models")
        assert response.code == 502
        await a.refuse()
        await b.refuse()
        response, body = await get(port, "/v1/models")
        assert response.code == 502
        assert json.loads(body)["error"]["code"] == "no-responders"


@pytest_twisted.ensureDeferred
async def test_inventory_with_origin_needs_every_grant(tmp_path: Path) -> None:
    origin = "http://127.0.0.2:8000"
    async with (
        sims(("ollama", ["llama3:latest"], "a"), ("ollama", ["phi3:latest"], "b")) as (a, b),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", nodes_for(a, b))
        response, body = await get(port, "/api/tags", Origin=origin)
        assert response.code == 403 and cors_headers(response) == {}
        assert json.loads(body) == {"error": "an engine denies this origin"}
        local = "http://localhost:3000"  # Ollama always allows its local origins
        response, body = await get(port, "/api/tags", Origin=local)
        assert response.code == 200 and len(json.loads(body)["models"]) == 2
        assert cors_headers(response)[b"access-control-allow-origin"] == [local.encode()]
        assert response.headers.getRawHeaders(b"vary") == [b"Origin"]
        b.faults.inventory_invalid = True
        response, _ = await get(port, "/api/tags", Origin=local)
        assert response.code == 502
        assert cors_headers(response)[b"access-control-allow-origin"] == [local.encode()]
        # Both nodes deny this origin: a denial, not an invalid list (only granting
        # responders are judged for validity).
        response, _ = await get(port, "/api/tags", Origin=origin)
        assert response.code == 403 and cors_headers(response) == {}
        assert response.headers.getRawHeaders(b"x-nvpair-error") == [b"cors-denied"]


@pytest_twisted.ensureDeferred
async def test_preflight_intersects_and_strips_credentials(tmp_path: Path) -> None:
    origin = "http://127.0.0.2:8000"
    async with (
        sims(("llamacpp", ["tiny"], "a"), ("llamacpp", ["tiny"], "b")) as (a, b),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a, b))
        response, body = await get(
            port,
            "/v1/chat/completions",
            method="OPTIONS",
            Origin=origin,
            Access_Control_Request_Method="POST",
            Authorization="Bearer secret",
            Cookie="c=1",
            X_Api_Key="k",
        )
        assert response.code == 204 and body == b""
        granted = cors_headers(response)
        assert granted[b"access-control-allow-origin"] == [origin.encode()]
        assert response.headers.getRawHeaders(b"x-nvpair-error") is None
        for sim in (a, b):
            seen = [r for r in sim.requests if r.method == "OPTIONS"]
            assert len(seen) == 1
            assert not {"authorization", "cookie", "x-api-key"} & set(seen[0].headers)
        assert a.requests[-1].method == "OPTIONS" and not a.in_flight


@pytest_twisted.ensureDeferred
async def test_preflight_denial_passes_through_as_a_denial(tmp_path: Path) -> None:
    origin = "http://127.0.0.2:8000"
    async with (
        sims(("ollama", ["llama3:latest"], "a"), ("ollama", ["llama3:latest"], "b")) as (a, b),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", nodes_for(a, b))
        response, body = await get(
            port,
            "/api/chat",
            method="OPTIONS",
            Origin=origin,
            Access_Control_Request_Method="POST",
        )
        assert response.code == 403 and body == b"" and cors_headers(response) == {}
        assert response.headers.getRawHeaders(b"x-nvpair-error") is None
        await a.refuse()
        await b.refuse()
        response, _ = await get(
            port,
            "/api/chat",
            method="OPTIONS",
            Origin=origin,
            Access_Control_Request_Method="POST",
        )
        assert response.code == 502 and cors_headers(response) == {}


@pytest_twisted.ensureDeferred
async def test_single_target_routes_pass_engine_cors_through(tmp_path: Path) -> None:
    origin = "http://127.0.0.2:8000"
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "llamacpp", nodes_for(a))
        response = await treq.post(
            f"http://127.0.0.1:{port}/completion",
            b'{"prompt":"x"}',
            headers=Headers({b"Origin": [origin.encode()]}),
        )
        await response.content()
        assert cors_headers(response)[b"access-control-allow-origin"] == [origin.encode()]
        error = await treq.post(
            f"http://127.0.0.1:{port}/completion",
            b"[not an object]",
            headers=Headers({b"Origin": [origin.encode()]}),
        )
        await error.content()
        assert error.code == 400 and cors_headers(error) == {}
