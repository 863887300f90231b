"""llama.cpp's ``/health`` before the fleet's first poll (issue 32 item 6;
docs/fleet-scheduling.md#before-the-first-poll).

Over loopback, through ``twistd -n nvpair-proxy --fleet``: with its only llama.cpp node still to
answer its first poll, or saying it is loading its model, the facade's ``GET /health`` answers
as llama-server does while it loads — 503 and llama-server's own body; with no llama.cpp node
at all, or only one whose polls fail, it stays 502 ``no-owner``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor as _reactor
from twisted.internet import task
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site
from twisted.web.server import Request as WebRequest

from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, write_fleet

reactor: Any = _reactor

#: llama-server's answer on every route until its model is loaded
#: (tools/server/server-http.cpp, middleware_server_state).
LOADING = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'


class Node(Resource):
    """A llama.cpp node on loopback: ``silent`` never answers (its first poll stays pending),
    ``loading`` answers every route as llama-server does while it loads, ``gone`` drops every
    connection it is asked on."""

    isLeaf = True

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def render(self, request: WebRequest) -> bytes | int:
        if self.mode == "silent":
            return NOT_DONE_YET
        if self.mode == "gone":
            request.loseConnection()
            return NOT_DONE_YET
        request.setResponseCode(503)
        request.setHeader(b"content-type", b"application/json; charset=utf-8")
        return LOADING


@asynccontextmanager
async def node(mode: str) -> AsyncIterator[tuple[str, Node]]:
    """The node's URL and the node (whose mode the test may change)."""
    resource = Node(mode)
    listening = reactor.listenTCP(0, Site(resource), interface="127.0.0.1")
    try:
        yield f"http://127.0.0.1:{listening.getHost().port}", resource
    finally:
        await listening.stopListening()


@asynccontextmanager
async def proxy(tmp_path: Path, nodes: dict[str, str]) -> AsyncIterator[tuple[ProxyProcess, int]]:
    port = free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, nodes, engine="llamacpp")
    async with running_proxy(tmp_path, "--fleet", str(fleet)) as process:
        yield process, port


async def health(port: int) -> Any:
    """``GET /health`` on the facade, once it listens."""
    for _ in range(100):
        try:
            return await treq.get(f"http://127.0.0.1:{port}/health", timeout=5)
        except Exception:
            await task.deferLater(reactor, 0.1, lambda: None)
    raise AssertionError("the facade never listened")


async def assert_loading(port: int) -> None:
    response = await health(port)
    assert response.code == 503
    assert await response.content() == LOADING
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json; charset=utf-8"]
    assert response.headers.getRawHeaders(b"x-nvpair-error") == [b"starting"]


async def assert_no_owner(port: int) -> None:
    response = await health(port)
    body = json.loads(await response.content())
    assert (response.code, body["error"]["code"]) == (502, "no-owner")


@pytest_twisted.ensureDeferred
async def test_health_is_loading_while_the_first_poll_is_out(tmp_path: Path) -> None:
    async with node("silent") as (url, _), proxy(tmp_path, {"n": url}) as (_process, port):
        await assert_loading(port)
        # Any other route still has nowhere to go.
        props = await treq.get(f"http://127.0.0.1:{port}/props", timeout=5)
        await props.content()
        assert props.code == 502


@pytest_twisted.ensureDeferred
async def test_health_is_loading_while_the_node_loads_then_no_owner_once_it_is_gone(
    tmp_path: Path,
) -> None:
    async with node("loading") as (url, engine), proxy(tmp_path, {"n": url}) as (process, port):
        await process.wait_for_log(lambda r: "is loading a model" in str(r.get("msg")))
        await assert_loading(port)
        engine.mode = "gone"
        await process.wait_for_log(lambda r: "left llamacpp discovery" in str(r.get("msg")))
        await assert_no_owner(port)


@pytest_twisted.ensureDeferred
async def test_a_fleet_without_a_llamacpp_node_answers_no_owner(tmp_path: Path) -> None:
    async with proxy(tmp_path, {}) as (_, port):
        await assert_no_owner(port)
