"""Conversations go where their cache is, against real ``llama-server`` processes (issue 23
item 1; docs/fleet-scheduling.md#conversations-go-where-their-cache-is).

Through ``twistd -n nvpair-proxy --fleet`` and the openai SDK: a conversation whose first turn
went to a node that the plain order would not pick now (it was busy then) has its next turn sent
back there, and the engine's own report says it found the history in its cache; a SIGHUP with
``affinity = false`` sends it by the plain order again. A node started with its prompt cache off
(``--cache-ram 0``, one slot) that is sent two conversations in turn finds almost nothing in
cache: after 20 such answers ``/status`` shows its affinity suspended, and its cache share.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from nvpair.control.affinity import ROUTED_WINDOW
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems
from tests.integration.test_fleet_operator import admin_get
from tests.integration.test_metrics_endpoint import labels, scrape
from tests.real.servers import llama_server_binary, running_llama_server, sleep
from tests.real.test_llama_fleet import generating, until_busy
from tests.real.tiny_gguf import write_tiny_gguf

#: Words the tiny model's vocabulary holds whole: a message of them is about a token a word.
WORDS = ("the", "a", "hi", "hello", "there")


def message(seed: int, words: int = 4) -> str:
    return " ".join(WORDS[(seed * 7 + n * n) % len(WORDS)] for n in range(words))


class Servers(NamedTuple):
    a: str
    b: str
    c: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with (
        running_llama_server(binary, model, "--context-shift") as a,
        running_llama_server(binary, model) as b,
        running_llama_server(binary, model, "--cache-ram", "0", slots=1) as c,
    ):
        yield Servers(a, b, c)


def fleet_text(port: int, nodes: Mapping[str, str], affinity: bool) -> str:
    lines = [
        'inventory-interval = "100ms"',
        "[scheduling]",
        f"affinity = {str(affinity).lower()}",
        "[facades.llamacpp]",
        f"port = {port}",
    ]
    for node, url in nodes.items():
        lines += ["[[nodes]]", f'id = "{node}"', "[nodes.engines]", f'llamacpp = "{url}"']
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def proxy_over(
    tmp_path: Path, nodes: Mapping[str, str]
) -> AsyncIterator[tuple[ProxyProcess, int, int, Path]]:
    """The proxy over ``nodes`` with an admin listener, once each has joined and its slots were
    read; yields it, its llama.cpp port, its admin port and its fleet file."""
    port, admin = free_port(), free_port()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(fleet_text(port, nodes, affinity=True))
    args = ("--fleet", str(fleet), "--admin-port", str(admin))
    async with running_proxy(tmp_path, *args) as proxy:
        for node in nodes:

            def joined(record: dict[str, Any], node: str = node) -> bool:
                return f"{node} joined llamacpp discovery" in str(record.get("msg"))

            await proxy.wait_for_log(joined, timeout=20)
        await sleep(1.0)
        yield proxy, port, admin, fleet
        assert log_problems(proxy) == []


class Turn(NamedTuple):
    node: str
    reply: str
    prompt_tokens: int
    cached_tokens: int


def ask(port: int, history: list[dict[str, str]]) -> Turn:
    """One turn through the proxy with the openai SDK (blocking: run in a thread)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=history,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
    )
    completion = raw.parse()
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return Turn(
        raw.headers["x-nvpair-node"],
        completion.choices[0].message.content or "",
        usage.prompt_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
    )


async def turn(port: int, history: list[dict[str, str]], text: str) -> Turn:
    """The user says ``text``; the answer joins ``history``."""
    history.append({"role": "user", "content": text})
    answer: Turn = await deferToThread(ask, port, list(history))
    history.append({"role": "assistant", "content": answer.reply})
    return answer


@pytest_twisted.ensureDeferred
async def test_the_next_turn_goes_back_to_the_node_that_holds_the_conversation(
    servers: Servers, tmp_path: Path
) -> None:
    nodes = {"a-node": servers.a, "b-node": servers.b}
    async with proxy_over(tmp_path, nodes) as (proxy, port, admin, fleet):
        first: list[dict[str, str]] = []
        assert (await turn(port, first, message(1))).node == "a-node"
        # a-node busy with another client's work: the second conversation starts on b-node.
        second: list[dict[str, str]] = []
        with generating(servers.a, 1):
            await until_busy(servers.a, 1)
            await sleep(1.0)
            started = await turn(port, second, message(2))
        assert started.node == "b-node"
        await until_busy(servers.a, 0)
        await sleep(1.0)
        # Both idle now: the plain order says a-node; the conversation's node is b-node, and
        # its engine says it read the history from its cache.
        again = await turn(port, second, message(3))
        assert again.node == "b-node"
        assert again.cached_tokens >= started.prompt_tokens - 2 > 0, (again, started)
        back = await turn(port, first, message(4))
        assert back.node == "a-node" and back.cached_tokens > 0
        _, status = await admin_get(admin, "/status")
        assert status["affinity"]["enabled"] is True and status["affinity"]["entries"] >= 6
        cache = {node["id"]: node["cache"] for node in status["nodes"]["llamacpp"]}
        assert cache["b-node"]["answers"] == 2 and cache["b-node"]["share"] > 0.3
        assert cache["b-node"]["suspendedUntil"] is None
        # Affinity off by SIGHUP: the first conversation goes by the plain order — both idle,
        # to b-node, dispatched to least recently (docs/fleet-scheduling.md#ties-spread) — and
        # reads its whole history there.
        fleet.write_text(fleet_text(port, nodes, affinity=False))
        os.kill(proxy.pid, signal.SIGHUP)
        await proxy.wait_for_log(lambda r: "fleet file reloaded" in str(r.get("msg")))
        plain = await turn(port, first, message(5))
        assert plain.node == "b-node"
        assert plain.cached_tokens < plain.prompt_tokens // 2
        _, status = await admin_get(admin, "/status")
        assert status["affinity"] == {
            "enabled": False,
            "slack": 2,
            "entries": 0,
            "bound": 100_000,
        }


@pytest_twisted.ensureDeferred
async def test_a_node_whose_cache_keeps_nothing_has_its_affinity_suspended(
    servers: Servers, tmp_path: Path
) -> None:
    async with proxy_over(tmp_path, {"c-node": servers.c}) as (_, port, admin, _fleet):
        found = prompt = 0
        # Two conversations in turn on one slot with no RAM cache: each evicts the other, so
        # each answer finds only the chat template's opening in cache. Each conversation's
        # first answer was not routed by affinity (nothing was known of it): 20 more are.
        for n in range(ROUTED_WINDOW + 2):
            history = [{"role": "user", "content": message(n % 2, words=40)}]
            answer: Turn = await deferToThread(ask, port, history)
            assert answer.node == "c-node"
            if n:
                found, prompt = found + answer.cached_tokens, prompt + answer.prompt_tokens
        assert found < prompt / 4, (found, prompt)
        _, status = await admin_get(admin, "/status")
        (cache,) = [node["cache"] for node in status["nodes"]["llamacpp"]]
        assert cache["answers"] == ROUTED_WINDOW + 2
        assert cache["share"] < 0.25
        assert cache["suspendedUntil"] is not None, cache
        _, samples = await scrape(admin)
        counted = samples["nvpair_tokens_total"]
        assert counted[labels(engine="llamacpp", kind="cached")] == cache["cachedTokens"]
