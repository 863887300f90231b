"""The ``openai`` facade with the openai SDK, through ``twistd -n nvpair-proxy --fleet``, in front
of a simulated Ollama, a simulated LM Studio and a real ``llama-server`` (issue 22 item 4;
docs/openai-facade.md).

One base URL reaches every engine's models, streamed and not; a model that all three serve
(``tiny``: the Ollama node's ``tiny:latest``, LM Studio's and llama-server's ``tiny``) fails
over from one engine to another when a node answers 503 or dies, and is served by the real
engine; ``/v1/models`` is every engine's list merged; anything else is 404 ``not-found``.
Each test runs a proxy of its own (passive health must not carry over), the llama-server is
the module's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import openai
import pytest
import pytest_twisted
import treq
from openai.types.chat import ChatCompletionMessageParam
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from nvpair.sim import SimEngine
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems
from tests.real.servers import llama_server_binary, running_llama_server, sleep
from tests.real.tiny_gguf import write_tiny_gguf

T = TypeVar("T")

#: Each request's conversation is its own, so the fleet order places it, not affinity
#: (docs/fleet-scheduling.md#affinity-order).
CONVERSATIONS = itertools.count()


#: llama.cpp's ``ignore_eos``: generate ``max_tokens`` whatever is sampled.
UNTIL_MAX = {"ignore_eos": True}


def new_chat() -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"hello there {next(CONVERSATIONS)}"}]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(binary, model, alias="tiny") as url:
        yield url


class Fleet(NamedTuple):
    """The proxy, its ports and the simulated nodes (ids sort them before ``c-llama``)."""

    proxy: ProxyProcess
    port: int
    admin: int
    ollama: SimEngine
    studio: SimEngine

    def client(self) -> openai.OpenAI:
        # The SDK's own retries would hide the proxy's failover.
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0
        )

    async def status(self) -> Any:
        response = await treq.get(f"http://127.0.0.1:{self.admin}/status", timeout=10)
        return json.loads(await response.content())

    async def metrics(self) -> set[str]:
        response = await treq.get(f"http://127.0.0.1:{self.admin}/metrics", timeout=10)
        return set((await response.text()).splitlines())


@contextlib.asynccontextmanager
async def openai_fleet(tmp_path: Path, llama: str, *, sims_warm: bool) -> AsyncIterator[Fleet]:
    """``[facades.openai]`` alone over ``a-ollama``, ``b-studio`` and ``c-llama``, once each
    has joined its engine's discovery and its load state has been read.

    :param sims_warm: whether the simulated engines hold their models in memory: when they do
        not, the warm llama-server goes first for ``tiny`` whatever its id.
    """
    warm = None if sims_warm else ()
    ollama = SimEngine(
        reactor, "ollama", models=["llama3:latest", "tiny:latest"], node="a-ollama", warm=warm
    )
    studio = SimEngine(
        reactor, "lmstudio", models=["qwen2.5-7b-instruct", "tiny"], node="b-studio", warm=warm
    )
    ollama.listen()
    studio.listen()
    port, admin = free_port(), free_port()
    nodes = {
        "a-ollama": ("ollama", ollama.url),
        "b-studio": ("lmstudio", studio.url),
        "c-llama": ("llamacpp", llama),
    }
    text = f'inventory-interval = "100ms"\n[facades.openai]\nport = {port}\n'
    for node, (engine, url) in nodes.items():
        text += f'[[nodes]]\nid = "{node}"\n[nodes.engines]\n{engine} = "{url}"\n'
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(text)
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(fleet), "--admin-port", str(admin)
        ) as proxy:
            for node, (engine, _) in nodes.items():
                await proxy.wait_for_log(joined(f"{node} joined {engine} discovery"), timeout=20)
            await sleep(1.0)  # a few polls: every load state read
            yield Fleet(proxy, port, admin, ollama, studio)
            assert log_problems(proxy) == []
    finally:
        await ollama.stop()
        await studio.stop()


def joined(message: str) -> Callable[[dict[str, Any]], bool]:
    return lambda record: message in str(record.get("msg"))


async def in_thread(call: Callable[[], T]) -> T:
    """A blocking SDK call, off the reactor the simulated engines and the checks run on."""
    return await deferToThread(call)


def chat(client: openai.OpenAI, model: str) -> tuple[str, str, int | None]:
    """A whole chat completion: the node that answered, its text, its completion tokens."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=new_chat(), max_tokens=8
    )
    completion = raw.parse()
    usage = completion.usage.completion_tokens if completion.usage else None
    return raw.headers["x-nvpair-node"], completion.choices[0].message.content or "", usage


def streamed(client: openai.OpenAI, model: str) -> tuple[str, str, int | None]:
    """A streamed chat completion: the node that answered, the text, its completion tokens."""
    with client.chat.completions.with_streaming_response.create(
        model=model,
        messages=new_chat(),
        max_tokens=8,
        extra_body=UNTIL_MAX,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        node, text, usage = response.headers["x-nvpair-node"], "", None
        for chunk in response.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
    return node, text, usage


@pytest_twisted.ensureDeferred
async def test_one_base_url_reaches_every_engine_s_models(tmp_path: Path, llama: str) -> None:
    """Each model goes to the engine that has it, on the same OpenAI route, streamed or not:
    Ollama's ``llama3`` by the name Ollama resolves, LM Studio's ``qwen2.5-7b-instruct``, and
    ``tiny`` to the real llama-server, the one owner with it in memory."""
    async with openai_fleet(tmp_path, llama, sims_warm=False) as fleet:
        client = fleet.client()
        hello = "".join(fleet.ollama.tokens)
        assert await in_thread(lambda: chat(client, "llama3")) == ("a-ollama", hello, 4)
        # Its last POST: a load poll may have come since.
        posted = [r.path for r in fleet.ollama.requests if r.method == "POST"]
        assert posted[-1] == "/v1/chat/completions"
        studio = "".join(fleet.studio.tokens)
        assert await in_thread(lambda: streamed(client, "qwen2.5-7b-instruct")) == (
            "b-studio",
            studio,
            len(fleet.studio.tokens),
        )
        node, text, usage = await in_thread(lambda: chat(client, "tiny"))
        assert (node, usage) == ("c-llama", 8) and text
        node, text, usage = await in_thread(lambda: streamed(client, "tiny"))
        assert (node, usage) == ("c-llama", 8) and text

        def responses() -> tuple[str, str, str]:
            raw = client.responses.with_raw_response.create(
                model="tiny", input="hi", max_output_tokens=8
            )
            answer = raw.parse()
            return raw.headers["x-nvpair-node"], answer.object, answer.status or ""

        assert await in_thread(responses) == ("c-llama", "response", "completed")

        def completion() -> tuple[str, str]:
            raw = client.completions.with_raw_response.create(
                model="tiny", prompt="hi", max_tokens=4
            )
            return raw.headers["x-nvpair-node"], raw.parse().object

        assert await in_thread(completion) == ("c-llama", "text_completion")

        def embedding() -> tuple[str, int]:
            raw = client.embeddings.with_raw_response.create(
                model="qwen2.5-7b-instruct", input="hi"
            )
            return raw.headers["x-nvpair-node"], len(raw.parse().data)

        assert await in_thread(embedding) == ("b-studio", 1)
        # Only the owner of each model was asked anything but its polls.
        assert [r.path for r in fleet.ollama.requests if r.method == "POST"] == [
            "/v1/chat/completions"
        ]


@pytest_twisted.ensureDeferred
async def test_a_503_moves_the_request_from_engine_to_engine(tmp_path: Path, llama: str) -> None:
    """``tiny`` is tried on ``a-ollama``, then ``b-studio`` (node ids, all warm): both answer
    503, and the real llama-server serves it, streamed and not. ``/status`` names the facade
    ``openai`` and the workload by the engine that served it; ``/metrics`` counts the request
    under the facade and each attempt under its node's engine."""
    async with openai_fleet(tmp_path, llama, sims_warm=True) as fleet:
        fleet.ollama.faults.status = 503
        fleet.studio.faults.status = 503
        client = fleet.client()
        node, text, usage = await in_thread(lambda: chat(client, "tiny"))
        assert (node, usage) == ("c-llama", 8) and text
        node, text, usage = await in_thread(lambda: streamed(client, "tiny"))
        assert (node, usage) == ("c-llama", 8) and text
        status = await fleet.status()
        assert status["facades"] == {"openai": {"port": fleet.port, "aliases": [], "tls": False}}
        streamed_one, whole_one = status["recent"]
        for recent in (streamed_one, whole_one):
            assert (recent["engine"], recent["model"]) == ("llamacpp", "tiny")
            assert [(a["node"], a["result"], a["status"]) for a in recent["attempts"]] == [
                ("a-ollama", "status", 503),
                ("b-studio", "status", 503),
                ("c-llama", "served", 200),
            ]
        assert whole_one["state"] == "completed"
        # The SDK closes a stream once it has read [DONE]; now and then that close reaches the
        # proxy before the body's last chunk does, and the workload ends as the client leaving
        # (a known race, left for a later look).
        assert streamed_one["state"] in ("completed", "cancelled")
        assert {
            'nvpair_requests_total{engine="openai",outcome="served",route="inference"} 2.0',
            'nvpair_failovers_total{engine="openai"} 4.0',
            'nvpair_attempts_total{engine="ollama",node="a-ollama",result="status"} 2.0',
            'nvpair_attempts_total{engine="lmstudio",node="b-studio",result="status"} 2.0',
            'nvpair_attempts_total{engine="llamacpp",node="c-llama",result="served"} 2.0',
            'nvpair_facade_up{engine="openai"} 1.0',
        } <= await fleet.metrics()


@pytest_twisted.ensureDeferred
async def test_a_node_that_dies_fails_over_to_another_engine(tmp_path: Path, llama: str) -> None:
    """``a-ollama`` resets the connection on the request, ``b-studio`` dies right after its
    stream's headers (before any byte of the answer): neither relayed anything, so the
    request moves on, and the real llama-server streams the answer."""
    async with openai_fleet(tmp_path, llama, sims_warm=True) as fleet:
        fleet.ollama.faults.reset_before_headers = True
        fleet.studio.faults.die_after_chunks = 0
        node, text, usage = await in_thread(lambda: streamed(fleet.client(), "tiny"))
        assert (node, usage) == ("c-llama", 8) and text
        [recent] = (await fleet.status())["recent"]
        assert [(a["node"], a["result"]) for a in recent["attempts"]] == [
            ("a-ollama", "transport"),
            ("b-studio", "transport"),
            ("c-llama", "served"),
        ]


@pytest_twisted.ensureDeferred
async def test_the_model_list_is_every_engine_s_and_other_routes_are_404(
    tmp_path: Path, llama: str
) -> None:
    """``client.models.list()`` is every node's OpenAI list merged by id, in node order; a route
    the facade does not serve (the SDK's ``models.retrieve``, Ollama's ``/api/tags``) is 404
    with OpenAI's error body, code ``not-found``."""
    async with openai_fleet(tmp_path, llama, sims_warm=True) as fleet:
        client = fleet.client()
        ids = await in_thread(lambda: [model.id for model in client.models.list()])
        assert ids == ["llama3:latest", "tiny:latest", "qwen2.5-7b-instruct", "tiny"]

        def refused(call: Callable[[], object]) -> tuple[int, object]:
            try:
                call()
            except openai.NotFoundError as error:
                return error.status_code, error.body
            raise AssertionError("no error raised")

        body = {
            "message": "this endpoint serves no such route",
            "type": "nvpair_proxy",
            "code": "not-found",
        }
        assert await in_thread(lambda: refused(lambda: client.models.retrieve("tiny"))) == (
            404,
            body,
        )
        tags = await in_thread(lambda: refused(lambda: client.get("/api/tags", cast_to=object)))
        assert tags == (404, body)
