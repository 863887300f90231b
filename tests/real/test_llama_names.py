"""One GGUF under three paths is one model (issue 22 item 3; docs/model-names.md#file-names):
three real ``llama-server`` processes started with ``-m`` on copies of the same file in three
directories, no ``--alias``, so each lists the path it was given as its model id. Through
``twistd -n nvpair-proxy --fleet`` the openai SDK lists the file name and the name without
``.gguf`` once, chats by either, and when the server first in order is gone, the request fails
over to another path of the same file.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread

from tests.integration.harness import free_port, log_problems
from tests.real.servers import (
    LlamaServer,
    fleet_proxy,
    llama_server_binary,
    llama_server_process,
)
from tests.real.tiny_gguf import write_tiny_gguf

FILE = "tiny-q4.gguf"


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LlamaServer]]:
    """Node id to its server: a goes first when all are equal (node-id order)."""
    binary = llama_server_binary()
    root = tmp_path_factory.mktemp("gguf")
    paths = [root / "one" / FILE, root / "two" / "deeper" / FILE, root / "three" / FILE]
    for path in paths:
        path.parent.mkdir(parents=True)
    write_tiny_gguf(paths[0])
    for path in paths[1:]:
        shutil.copyfile(paths[0], path)
    with contextlib.ExitStack() as stack:
        servers = {
            node: stack.enter_context(llama_server_process(binary, path, alias=None, slots=1))
            for node, path in zip("abc", paths, strict=True)
        }
        yield servers


def client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)


def chat(port: int, model: str, stream: bool) -> tuple[str, str | None, str]:
    """The text, the answering node and the model the answer names."""
    messages: Any = [{"role": "user", "content": "hello"}]
    if not stream:
        raw = client(port).chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=4
        )
        completion = raw.parse()
        text = completion.choices[0].message.content or ""
        return text, raw.headers.get("x-nvpair-node"), completion.model
    with client(port).chat.completions.with_streaming_response.create(
        model=model, messages=messages, max_tokens=4, stream=True
    ) as response:
        text, named = "", ""
        for chunk in response.parse():
            named = chunk.model or named
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        return text, response.headers.get("x-nvpair-node"), named


@pytest_twisted.ensureDeferred
async def test_one_gguf_under_three_paths_is_one_model_with_failover(
    tmp_path: Path, three: dict[str, LlamaServer]
) -> None:
    servers = three
    nodes = {node: server.url for node, server in servers.items()}
    admin = free_port()
    # Polled once, at start: the server stopped below stays in discovery, so a request goes
    # to it and must fail over.
    async with fleet_proxy(tmp_path, nodes, "--admin-port", str(admin), interval="10m") as (
        proxy,
        port,
    ):
        ids = await deferToThread(lambda: [m.id for m in client(port).models.list()])
        paths = [server.alias for server in servers.values()]
        assert ids == [paths[0], FILE, "tiny-q4", paths[1], paths[2]]

        answered = []
        for model, stream in (("tiny-q4", False), (FILE, True), ("tiny-q4", True)):
            text, node, named = await deferToThread(chat, port, model, stream)
            assert text, (model, stream)
            # The answer names the model as the node that answered does.
            assert named == servers[str(node)].alias
            answered.append(node)
        # The tiny-q4 conversation stays on a (affinity); the file name is another name to the
        # prefix table, so its first request goes by the plain order, to the node dispatched to
        # least recently (docs/fleet-scheduling.md#ties-spread).
        assert answered == ["a", "b", "a"], answered

        servers["a"].process.terminate()
        servers["a"].process.wait(timeout=10)
        text, node, named = await deferToThread(chat, port, "tiny-q4", False)
        assert text and node in ("b", "c")
        assert named == servers[str(node)].alias

        response = await treq.get(f"http://127.0.0.1:{admin}/status", timeout=10)
        (latest, *_) = json.loads(await response.content())["recent"]
        assert latest["model"] == "tiny-q4"
        assert [(a["node"], a["result"]) for a in latest["attempts"]] == [
            ("a", "transport"),
            (node, "served"),
        ]
        assert log_problems(proxy) == []
