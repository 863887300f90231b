"""``twistd -r uvloop -n nvpair-proxy``: the same process on Twisted's asyncio reactor over uvloop.

The whole integration suite runs on it with ``NVPAIR_TEST_REACTOR=uvloop``; this test keeps one
streaming exchange and a failover on it in every ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims


@pytest_twisted.ensureDeferred
async def test_the_proxy_streams_and_fails_over_on_the_uvloop_reactor(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "node-a"), ("llamacpp", ["tiny"], "node-b")) as (a, b),
        running_proxy(tmp_path, twistd_reactor="uvloop") as proxy,
    ):
        a.faults.status = 503
        port = await enabled_proxy_for(
            proxy,
            "llamacpp",
            [
                {"id": "a", "url": a.url, "models": ["tiny"]},
                {"id": "b", "url": b.url, "models": ["tiny"]},
            ],
        )

        def chat() -> str:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            return "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )

        assert await deferToThread(chat) == "Hello from node-b."
        assert any(line.get("loop") == "asyncio on uvloop" for line in proxy.logs)
