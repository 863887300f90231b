"""An Anthropic client's key, sent as ``X-Api-Key`` with ``anthropic-version``, through a real
proxy process to a simulated llama.cpp engine that records what it is sent (issue 32;
docs/lan.md#x-api-key): under ``loopback-keys`` a valid key is served and a wrong one is 401; the
engine never sees the caller's key, nor beside a node's credential."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.web.http_headers import Headers

from nvpair.fleet.lanconfig import new_key
from nvpair.sim.engine import SimEngine
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port
from tests.integration.test_lan import eventually, keys_file

#: The node's credential, from the proxy's environment.
NODE_KEY = "sk-node-7c3e"


def fleet(directory: Path, sim: SimEngine, port: int, extra: str) -> Path:
    path = directory / "fleet.toml"
    path.write_text(
        f'inventory-interval = "100ms"\n[facades.llamacpp]\nport = {port}\n'
        f'[[nodes]]\nid = "a"\n[nodes.engines]\nllamacpp = "{sim.url}"\n{extra}'
    )
    return path


async def anthropic(port: int, key: str, path: str = "/v1/chat/completions") -> tuple[int, Any]:
    """What the anthropic SDK sends: its key as ``x-api-key``, never ``Authorization``."""
    headers = Headers({"x-api-key": [key], "anthropic-version": ["2023-06-01"]})
    body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    response = await treq.post(
        f"http://127.0.0.1:{port}{path}", json=body, headers=headers, timeout=10
    )
    return response.code, (response.headers, await response.content())


async def listed(port: int, key: str) -> None:
    """Wait until the facade lists the sim's model to a caller with ``key`` in x-api-key."""

    async def check() -> bool:
        response = await treq.get(
            f"http://127.0.0.1:{port}/v1/models", headers=Headers({"x-api-key": [key]}), timeout=5
        )
        return "tiny" in [entry["id"] for entry in json.loads(await response.content())["data"]]

    await eventually(check, f"tiny listed on {port}")


def sent_keys(sim: SimEngine) -> list[tuple[str, list[str] | None, list[str] | None]]:
    """Every request the engine received, with its Authorization and X-Api-Key fields."""
    return [
        (r.path, r.headers.get("authorization"), r.headers.get("x-api-key")) for r in sim.requests
    ]


@pytest_twisted.ensureDeferred
async def test_loopback_keys_take_an_x_api_key_which_never_reaches_the_engine(
    tmp_path: Path,
) -> None:
    alice, _ = new_key("alice")
    keys_file(tmp_path / "keys.toml", ("alice", alice, ()))
    port = free_port()
    async with sims(("llamacpp", ["tiny"], "a")) as (sim,):
        extra = '[access]\nkeys = "keys.toml"\nloopback-keys = true\n'
        path = fleet(tmp_path, sim, port, extra)
        async with running_proxy(tmp_path / "state", "--fleet", str(path)):
            await listed(port, alice)
            status, (_, body) = await anthropic(port, alice)
            assert status == 200, body
            assert json.loads(body)["choices"][0]["message"]["content"] == "".join(sim.tokens)
            status, (headers, body) = await anthropic(port, "nvp_wrong")
            assert status == 401, body
            assert headers.getRawHeaders("www-authenticate") == ['Bearer realm="nvpair"']
            assert headers.getRawHeaders("x-nvpair-error") == ["unauthorized"]
            status, _ = await anthropic(port, "nvp_wrong", "/v1/messages")
            assert status == 401
    received = sent_keys(sim)
    assert ("/v1/chat/completions", None, None) in received
    # Model lists, the inference, the polls: no caller's key in any field.
    assert all(
        authorization is None and x_api_key is None for _, authorization, x_api_key in received
    )


@pytest_twisted.ensureDeferred
async def test_a_nodes_credential_is_the_only_key_the_engine_sees(tmp_path: Path) -> None:
    """Without [access] the proxy judges no key; the node's credential replaces the caller's
    Authorization and leaves out its X-Api-Key (docs/fleet-scheduling.md#node-credentials)."""
    port = free_port()
    async with sims(("llamacpp", ["tiny"], "a")) as (sim,):
        extra = '[nodes.credentials]\nllamacpp = "env:XKEY_NODE_KEY"\n'
        path = fleet(tmp_path, sim, port, extra)
        env = {"XKEY_NODE_KEY": NODE_KEY}
        async with running_proxy(tmp_path / "state", "--fleet", str(path), env=env):
            await listed(port, "sk-callers-own")
            status, (_, body) = await anthropic(port, "sk-callers-own")
            assert status == 200, body
    received = sent_keys(sim)
    assert ("/v1/chat/completions", [f"Bearer {NODE_KEY}"], None) in received
    assert all(
        authorization == [f"Bearer {NODE_KEY}"] and x_api_key is None
        for _, authorization, x_api_key in received
    )
