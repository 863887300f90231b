"""The names people use, through the real process (issue 22 item 3; docs/model-names.md):
GGUF file names and ``[models]`` aliases find their owners, each node is sent its own name
with every other byte of the body as the client sent it, model lists show each name once, and
``[models]`` is re-read at SIGHUP. Simulated engines, real clients (treq, the openai and
ollama SDKs)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from nvpair.sim import SimEngine
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems, run_twistd
from tests.integration.test_fleet import eventually

LLAMA_PATH = "/models/meta/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
LLAMA3 = '[models]\n"llama3" = ["llama3.1:8b", "Meta-Llama-3.1-8B-Instruct-Q4_K_M"]\n'


def fleet_text(
    ports: Mapping[str, int], nodes: Sequence[tuple[str, str, str]], models: str = ""
) -> str:
    """A fleet file: a facade per engine of ``ports``; ``nodes`` as (id, engine, URL)."""
    text = 'inventory-interval = "100ms"\n'
    for engine, port in ports.items():
        text += f"[facades.{engine}]\nport = {port}\n"
    for node, engine, url in nodes:
        text += f'[[nodes]]\nid = "{node}"\n[nodes.engines]\n{engine} = "{url}"\n'
    return text + models


@asynccontextmanager
async def fleet(
    tmp_path: Path,
    sims: Sequence[SimEngine],
    models: str = "",
    expected_error: str = "",
    *,
    openai_facade: bool = False,
) -> AsyncIterator[tuple[ProxyProcess, dict[str, int], Path]]:
    """The sims listening, and the proxy in fleet mode in front of them once every node has
    joined: yields the proxy, each engine's facade port (and the ``openai`` facade's, with
    ``openai_facade``) and the fleet file. Afterwards its log must show no problem but
    ``expected_error``'s."""
    for sim in sims:
        sim.listen()
    ports = {sim.dialect: free_port() for sim in sims}
    if openai_facade:
        ports["openai"] = free_port()
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_text(ports, [(s.node, s.dialect, s.url) for s in sims], models))
    try:
        async with running_proxy(tmp_path, "--fleet", str(path)) as proxy:
            for sim in sims:
                await proxy.wait_for_log(joined(f"{sim.node} joined {sim.dialect} discovery"))
            yield proxy, ports, path
            problems = [
                p for p in log_problems(proxy) if not expected_error or expected_error not in p
            ]
            assert problems == [], proxy.raw_stderr.decode()[-3000:]
    finally:
        for sim in sims:
            await sim.stop()


def joined(message: str) -> Callable[[dict[str, Any]], bool]:
    return lambda record: message in str(record.get("msg"))


def inference_bodies(sim: SimEngine) -> list[bytes]:
    return [r.body for r in sim.requests if r.method == "POST"]


async def post(port: int, path: str, body: bytes) -> tuple[int, bytes, str | None]:
    response = await treq.post(
        f"http://127.0.0.1:{port}{path}",
        body,
        headers=Headers({"content-type": ["application/json"]}),
    )
    node = response.headers.getRawHeaders(b"x-nvpair-node", [None])[0]
    return response.code, await response.content(), None if node is None else node.decode()


#: A body as odd as a client may send it: whitespace, escapes, key order, a duplicate key (the
#: last is the one read), a nested "model" that is content.
ODD = (
    b' {\r\n\t"messages" : [ {"role":"user","content":"caf\\u00e9 \\/ \\"hi\\"","model":"x"} ],'
    b'\n  "temperature" :0.50e0 , "\\u006dodel"  :\t"%s" ,"stream":false}\n'
)


@pytest_twisted.ensureDeferred
async def test_a_file_name_reaches_the_node_as_its_own_path_every_other_byte_as_sent(
    tmp_path: Path,
) -> None:
    """The byte-for-byte rule (docs/model-names.md#the-node-gets-its-own-name), with and
    without .gguf; a request naming the node's own path is not touched at all."""
    sim = SimEngine(reactor, "llamacpp", models=[LLAMA_PATH], node="a")
    async with fleet(tmp_path, [sim]) as (_, ports, _path):
        port = ports["llamacpp"]
        for name in ("Meta-Llama-3.1-8B-Instruct-Q4_K_M", "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"):
            status, answer, node = await post(port, "/v1/chat/completions", ODD % name.encode())
            assert (status, node) == (200, "a"), answer
            assert inference_bodies(sim)[-1] == ODD % json.dumps(LLAMA_PATH).encode()[1:-1]
        status, _, _ = await post(port, "/v1/chat/completions", ODD % LLAMA_PATH.encode())
        assert status == 200
        assert inference_bodies(sim)[-1] == ODD % LLAMA_PATH.encode()
        # A name no node has is still no model.
        status, answer, _ = await post(port, "/v1/chat/completions", ODD % b"Meta-Llama")
        assert status == 502 and b"no-owner" in answer
        # A body that names its model twice (here once escaped) would be read two ways: 400
        # (docs/lan.md#what-a-key-can-and-cannot-do).
        twice = ODD.replace(b'"temperature"', b'"model":"first",  "temperature"')
        status, answer, _ = await post(port, "/v1/chat/completions", twice % LLAMA_PATH.encode())
        assert status == 400 and b"bad-json" in answer


@pytest_twisted.ensureDeferred
async def test_each_attempt_sends_its_own_nodes_name_and_fails_over_between_paths(
    tmp_path: Path,
) -> None:
    """One GGUF under two LM Studio paths is one model: node a (first in order) answers 503,
    node b serves, and each was sent its own id. LM Studio answers 404 for an id it does not
    have, so b serving shows the rename."""
    a = SimEngine(reactor, "lmstudio", models=["pub/qwen-GGUF/qwen-7b-q4.gguf"], node="a")
    b = SimEngine(reactor, "lmstudio", models=["other/qwen-7b-q4.gguf"], node="b")
    a.faults.status = 503
    async with fleet(tmp_path, [a, b]) as (_, ports, _path):

        def chat() -> tuple[str, str | None]:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{ports['lmstudio']}/v1", api_key="x", max_retries=0
            )
            raw = client.chat.completions.with_raw_response.create(
                model="qwen-7b-q4", messages=[{"role": "user", "content": "hi"}]
            )
            text = raw.parse().choices[0].message.content or ""
            return text, raw.headers.get("x-nvpair-node")

        text, node = await deferToThread(chat)
        assert (text, node) == ("".join(b.tokens), "b")
        (sent_a,) = [json.loads(body)["model"] for body in inference_bodies(a)]
        (sent_b,) = [json.loads(body)["model"] for body in inference_bodies(b)]
        assert (sent_a, sent_b) == ("pub/qwen-GGUF/qwen-7b-q4.gguf", "other/qwen-7b-q4.gguf")


@pytest_twisted.ensureDeferred
async def test_an_alias_across_engines_through_the_ollama_and_openai_sdks(tmp_path: Path) -> None:
    """docs/model-names.md#aliases: ``llama3`` is llama3.1:8b on Ollama and the
    Meta-Llama GGUF on llama.cpp; each SDK chats with it and lists it once, shaped as the
    engine's own entries."""
    ollama_sim = SimEngine(reactor, "ollama", models=["llama3.1:8b", "phi3:latest"], node="o")
    llama_sim = SimEngine(reactor, "llamacpp", models=[LLAMA_PATH], node="l")
    async with fleet(tmp_path, [ollama_sim, llama_sim], LLAMA3) as (_, ports, _path):

        def through_ollama() -> tuple[str, list[Any]]:
            client = ollama.Client(host=f"http://127.0.0.1:{ports['ollama']}")
            reply = client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
            return reply["message"]["content"], list(client.list().models)

        text, listed = await deferToThread(through_ollama)
        assert text == "".join(ollama_sim.tokens)
        assert json.loads(inference_bodies(ollama_sim)[-1])["model"] == "llama3.1:8b"
        by_name = {m.model: m for m in listed}
        assert sorted(by_name) == ["llama3.1:8b", "llama3:latest", "phi3:latest"]
        assert len(listed) == 3
        assert by_name["llama3:latest"].digest == by_name["llama3.1:8b"].digest

        def through_openai() -> tuple[list[str], list[str]]:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{ports['llamacpp']}/v1", api_key="x", max_retries=0
            )
            texts = [
                client.chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "hi"}]
                )
                .choices[0]
                .message.content
                or ""
                for name in ("llama3", "Meta-Llama-3.1-8B-Instruct-Q4_K_M")
            ]
            return texts, [m.id for m in client.models.list()]

        texts, ids = await deferToThread(through_openai)
        assert texts == ["".join(llama_sim.tokens)] * 2
        assert ids == [
            LLAMA_PATH,
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M",
            "llama3",
        ]
        assert [json.loads(b)["model"] for b in inference_bodies(llama_sim)] == [LLAMA_PATH] * 2


STUDIO_PATH = "lmstudio-community/Meta-Llama-3.1-8B-Instruct-GGUF/" + LLAMA_PATH.rsplit("/")[-1]


@pytest_twisted.ensureDeferred
async def test_the_openai_facade_finds_a_names_owners_on_every_engine_each_sent_its_own(
    tmp_path: Path,
) -> None:
    """docs/openai-facade.md#names: on the ``openai`` facade an alias has owners on every
    engine and a GGUF file name on every engine with that file, each node sent its own name
    for it (Ollama's tag, llama.cpp's path, LM Studio's id); the merged list shows each name
    once, an alias only one engine's model answers to included."""
    ollama_sim = SimEngine(reactor, "ollama", models=["llama3.1:8b"], node="o")
    llama_sim = SimEngine(reactor, "llamacpp", models=[LLAMA_PATH], node="l")
    studio_sim = SimEngine(reactor, "lmstudio", models=[STUDIO_PATH], node="s")
    sims = [ollama_sim, llama_sim, studio_sim]
    own = {ollama_sim: "llama3.1:8b", llama_sim: LLAMA_PATH, studio_sim: STUDIO_PATH}
    # "chat" is an alias only Ollama's model answers to.
    models = LLAMA3 + '"chat" = ["llama3.1:8b"]\n'
    async with fleet(tmp_path, sims, models, openai_facade=True) as (_, ports, _path):
        port = ports["openai"]
        file_name = "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
        # Every owner failing: each is tried in turn, which shows who the owners are and what
        # each was sent.
        for sim in sims:
            sim.faults.status = 503
        for name, owners in (("llama3", sims), (file_name, [llama_sim, studio_sim])):
            before = {sim: len(inference_bodies(sim)) for sim in sims}
            body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}]})
            status, _, _ = await post(port, "/v1/chat/completions", body.encode())
            assert status == 503
            for sim in sims:
                sent = [json.loads(b)["model"] for b in inference_bodies(sim)[before[sim] :]]
                assert sent == ([own[sim]] * len(sent) if sim in owners else []), sim.node
                assert (len(sent) > 0) == (sim in owners), (name, sim.node)
        for sim in sims:
            sim.faults.status = None

        def through_openai() -> tuple[list[tuple[str, str | None]], list[str]]:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
            )
            served = []
            for name in ("llama3", file_name, "Meta-Llama-3.1-8B-Instruct-Q4_K_M"):
                raw = client.chat.completions.with_raw_response.create(
                    model=name, messages=[{"role": "user", "content": "hi"}]
                )
                served.append(
                    (raw.parse().choices[0].message.content or "", raw.headers.get("x-nvpair-node"))
                )
            return served, [m.id for m in client.models.list()]

        served, ids = await deferToThread(through_openai)
        by_node = {sim.node: sim for sim in sims}
        for text, node in served:
            assert node is not None and text == "".join(by_node[node].tokens)
            assert json.loads(inference_bodies(by_node[node])[-1])["model"] == own[by_node[node]]
        assert sorted(ids) == sorted(
            [
                LLAMA_PATH,
                STUDIO_PATH,
                "llama3.1:8b",
                file_name,
                "Meta-Llama-3.1-8B-Instruct-Q4_K_M",
                "llama3",
                "chat",
            ]
        )


@pytest_twisted.ensureDeferred
async def test_models_is_reread_at_sighup_and_a_conflict_keeps_the_running_one(
    tmp_path: Path,
) -> None:
    """docs/model-names.md#reloading and #conflicts."""
    sim = SimEngine(reactor, "ollama", models=["llama3.1:8b"], node="a")
    body = json.dumps({"model": "chat", "prompt": "hi", "stream": False}).encode()
    async with fleet(tmp_path, [sim], expected_error="not reloaded") as (proxy, ports, path):
        port = ports["ollama"]
        assert (await post(port, "/api/generate", body))[0] == 502
        path.write_text(path.read_text() + '[models]\n"chat" = ["llama3.1:8b"]\n')
        proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]

        async def served() -> bool:
            return (await post(port, "/api/generate", body))[0] == 200

        await eventually(served, "the alias after SIGHUP")
        path.write_text(path.read_text() + '"llama3.1" = ["chat"]\n')
        proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]
        refused = await proxy.wait_for_log(lambda r: "not reloaded" in str(r.get("msg")))
        assert refused["level"] == "error"
        assert "models.\"chat\": 'chat' is also a model name the table lists" in refused["msg"]
        assert (await post(port, "/api/generate", body))[0] == 200


def test_a_conflict_in_the_file_is_a_usage_error_at_start(tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_text({"ollama": free_port()}, []) + '[models]\n"a" = ["a"]\n')
    result = run_twistd(tmp_path, "--fleet", str(fleet_file))
    assert result.returncode != 0
    line = f"{fleet_file}: models.\"a\": 'a' is also a model name the table lists"
    assert line in result.stderr + result.stdout


CATCH = '[models]\n"gpt-*" = ["qwen"]\n"*" = ["tiny"]\n'


def sdk_chat(port: int, model: str) -> tuple[str, str | None]:
    """The openai SDK's chat as clients hard-code it: the text and the answering node."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return raw.parse().choices[0].message.content or "", raw.headers.get("x-nvpair-node")


@pytest_twisted.ensureDeferred
async def test_pattern_aliases_serve_the_names_clients_hard_code(tmp_path: Path) -> None:
    """Issue 32 item 2 (docs/model-names.md#pattern-aliases): the openai SDK's
    ``gpt-3.5-turbo`` and ``davinci-002`` through the llama.cpp facade and the ``openai``
    facade, each node sent its own name and every other byte as sent; the model lists do not
    show the patterns."""
    qwen = SimEngine(reactor, "llamacpp", models=["/m/qwen.gguf"], node="a")
    tiny = SimEngine(reactor, "llamacpp", models=["/m/tiny.gguf"], node="b")
    async with fleet(tmp_path, [qwen, tiny], CATCH, openai_facade=True) as (_, ports, _path):
        for port in (ports["llamacpp"], ports["openai"]):
            text, node = await deferToThread(sdk_chat, port, "gpt-3.5-turbo")
            assert (text, node) == ("".join(qwen.tokens), "a")
            text, node = await deferToThread(sdk_chat, port, "davinci-002")
            assert (text, node) == ("".join(tiny.tokens), "b")
            status, answer, node = await post(port, "/v1/chat/completions", ODD % b"test")
            assert (status, node) == (200, "b"), answer
            assert inference_bodies(tiny)[-1] == ODD % b"/m/tiny.gguf"
            listed = await treq.get(f"http://127.0.0.1:{port}/v1/models")
            ids = [entry["id"] for entry in json.loads(await listed.content())["data"]]
            assert "*" not in ids and "gpt-*" not in ids and "qwen" in ids
        assert json.loads(inference_bodies(qwen)[-1])["model"] == "/m/qwen.gguf"


@pytest_twisted.ensureDeferred
async def test_without_a_pattern_a_hard_coded_name_is_no_owner_until_sighup_adds_one(
    tmp_path: Path,
) -> None:
    """No pattern: 502 ``no-owner`` as before; ``[models]`` patterns re-read at SIGHUP. The
    longest pattern decides: ``gpt-*`` names a model no node has, so ``gpt-3.5-turbo`` stays
    502 rather than falling through to ``*``."""
    sim = SimEngine(reactor, "llamacpp", models=["/m/tiny.gguf"], node="b")
    body = json.dumps({"model": "davinci-002", "messages": []}).encode()
    async with fleet(tmp_path, [sim]) as (proxy, ports, path):
        port = ports["llamacpp"]

        def refused() -> tuple[int | None, object]:
            try:
                sdk_chat(port, "gpt-3.5-turbo")
            except openai.APIStatusError as error:
                return error.status_code, error.body
            return None, None

        status, error = await deferToThread(refused)
        assert status == 502 and isinstance(error, dict) and error["code"] == "no-owner"
        path.write_text(path.read_text() + CATCH)
        proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]

        async def served() -> bool:
            return (await post(port, "/v1/chat/completions", body))[0] == 200

        await eventually(served, "the pattern after SIGHUP")
        assert json.loads(inference_bodies(sim)[-1])["model"] == "/m/tiny.gguf"
        assert await deferToThread(refused) == (status, error)
