"""The load poll leaves a sleeping ``llama-server`` asleep (issue 32 item 1;
docs/fleet-scheduling.md#sleeping-servers).

A server started with ``--sleep-idle-seconds 1`` frees its model after a second idle, and one
``GET /slots`` wakes it. Through ``twistd -n nvpair-proxy --fleet`` polling it every 200 ms, it
stays asleep poll after poll (its own ``/props`` says so, and ``/props`` does not wake it),
``/status`` shows it sleeping, and a chat through the facade still works, waking it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from tests.integration.harness import free_port
from tests.real.servers import (
    fleet_proxy,
    llama_server_binary,
    post_chat,
    running_llama_server,
    sleep,
)
from tests.real.tiny_gguf import write_tiny_gguf

#: Bound on each wait below: only the failure guard, never what is asserted.
PATIENCE = 20.0


@pytest.fixture
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(llama_server_binary(), model, "--sleep-idle-seconds", "1") as url:
        yield url


async def get_json(url: str) -> Any:
    response = await treq.get(url, timeout=10)
    assert response.code == 200, url
    return json.loads(await response.content())


async def is_sleeping(url: str) -> bool:
    """The server's own word, from a route that answers while it sleeps without waking it."""
    props = await get_json(url + "/props")
    return props["is_sleeping"] is True


async def until(check: Any, what: str) -> None:
    for _ in range(int(PATIENCE / 0.1)):
        if await check():
            return
        await sleep(0.1)
    raise AssertionError(f"{what} within {PATIENCE:g} s")


@pytest_twisted.ensureDeferred
async def test_polls_leave_a_sleeping_server_asleep(tmp_path: Path, sleepy: str) -> None:
    await until(lambda: is_sleeping(sleepy), "the server did not fall asleep")
    admin = free_port()
    async with fleet_proxy(
        tmp_path, {"n": sleepy}, "--admin-port", str(admin), interval="200ms"
    ) as (_, port):

        async def shown_sleeping() -> bool:
            status = await get_json(f"http://127.0.0.1:{admin}/status")
            (node,) = status["nodes"]["llamacpp"]
            load = node["load"] or {}
            return load.get("sleeping") is True and load.get("inMemory") == []

        await until(shown_sleeping, "/status did not show the node sleeping")
        # Several more polls (200 ms apart); each would have woken it with a /slots.
        await sleep(1.5)
        assert await is_sleeping(sleepy)
        assert await shown_sleeping()
        # A request still works, and wakes it.
        response, body = await post_chat(port)
        assert response.code == 200, body
        assert json.loads(body)["choices"]
        assert not await is_sleeping(sleepy)


@pytest.fixture
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    binary = llama_server_binary()
    with running_llama_server(binary, model, "--metrics", "--sleep-idle-seconds", "1") as url:
        yield url


@pytest_twisted.ensureDeferred
async def test_an_awake_server_polled_faster_than_its_idle_time_falls_asleep(
    tmp_path: Path, metered: str
) -> None:
    """Started with ``--metrics``: its busy slots are read at ``/metrics``, which leaves its idle
    timer alone, so polls every 200 ms no longer keep it awake (each ``/slots`` did); it falls
    asleep by its own word and ``/status`` shows it, and a generation running shows as a busy
    slot."""
    admin = free_port()
    async with fleet_proxy(
        tmp_path, {"n": metered}, "--admin-port", str(admin), interval="200ms", settle=0
    ) as (_, port):

        async def load() -> Any:
            status = await get_json(f"http://127.0.0.1:{admin}/status")
            (node,) = status["nodes"]["llamacpp"]
            return node["load"] or {}

        # A long generation straight to the server (not through the proxy, whose own requests
        # are taken off the engine's count) wakes it if it slept while the proxy started, and
        # shows as one busy slot of two: busy slots are still read. The tiny model generates
        # fast, and a poll may land only after it ended on a busy machine: generations follow
        # one another until a poll has seen one.
        body = json.dumps({"prompt": "hi", "n_predict": 2000, "ignore_eos": True}).encode()

        async def one_busy() -> bool:
            # At least one: a generation cancelled a moment ago may still run on a busy
            # machine beside the next (the server notices the closed connection late).
            now = await load()
            return bool(now.get("slots") == 2 and (now.get("busySlots") or 0) >= 1)

        async def seen_generating() -> bool:
            generating = treq.post(metered + "/completion", body, timeout=60)
            generating.addErrback(lambda _: None)
            try:
                while not generating.called:
                    if await one_busy():
                        return True
                    await sleep(0.05)
                return False
            finally:
                generating.cancel()

        await until(seen_generating, "/status did not show the generation's busy slot")
        # Awake now, and polled every 200 ms: it falls asleep all the same.
        await until(lambda: is_sleeping(metered), "the polled server did not fall asleep")

        async def shown_sleeping() -> bool:
            return (await load()).get("sleeping") is True

        await until(shown_sleeping, "/status did not show the node sleeping")
        assert await is_sleeping(metered)
        response, _ = await post_chat(port)
        assert response.code == 200
