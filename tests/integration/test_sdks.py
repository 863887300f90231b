"""Real client SDKs through the real proxy process: nothing about a client changes."""

from __future__ import annotations

from pathlib import Path

import ollama
import openai
import pytest_twisted
from twisted.internet.threads import deferToThread

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims


@pytest_twisted.ensureDeferred
async def test_openai_sdk_streams_through_the_lmstudio_facade(tmp_path: Path) -> None:
    async with (
        sims(("lmstudio", ["qwen2.5-7b-instruct"], "node-a")) as (sim,),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(
            proxy,
            "lmstudio",
            [{"id": "a", "url": sim.url, "models": ["qwen2.5-7b-instruct"]}],
        )

        def chat() -> tuple[str, int | None]:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            stream = client.chat.completions.create(
                model="qwen2.5-7b-instruct",
                messages=[{"role": "user", "content": "hello there"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text, completion = "", None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage is not None:
                    completion = chunk.usage.completion_tokens
            return text, completion

        text, completion = await deferToThread(chat)
        assert text == "".join(sim.tokens)
        assert completion == len(sim.tokens)


@pytest_twisted.ensureDeferred
async def test_openai_sdk_sees_the_proxy_error_as_an_api_error(tmp_path: Path) -> None:
    """A 502 no-owner in OpenAI's envelope is raised by the SDK with our reason code."""
    async with running_proxy(tmp_path) as proxy:
        port = await enabled_proxy_for(proxy, "llamacpp", [])

        def chat() -> openai.APIStatusError:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
            )
            try:
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "x"}]
                )
            except openai.APIStatusError as error:
                return error
            raise AssertionError("no error raised")

        error = await deferToThread(chat)
        assert error.status_code == 502
        assert error.body == {
            "message": 'no node advertises model "tiny"',
            "type": "nvpair_proxy",
            "code": "no-owner",
        }


@pytest_twisted.ensureDeferred
async def test_ollama_sdk_chat_and_generate(tmp_path: Path) -> None:
    async with (
        sims(("ollama", ["llama3:latest"], "node-a")) as (sim,),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(
            proxy, "ollama", [{"id": "a", "url": sim.url, "models": ["llama3:latest"]}]
        )

        def talk() -> tuple[str, int, str]:
            client = ollama.Client(host=f"http://127.0.0.1:{port}")
            streamed = "".join(
                part["message"]["content"]
                for part in client.chat(
                    model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            )
            whole = client.generate(model="llama3", prompt="hi")
            try:
                client.generate(model="mistral", prompt="hi")
            except ollama.ResponseError as error:
                return streamed, int(whole["eval_count"]), f"{error.status_code} {error.error}"
            raise AssertionError("no error raised")

        streamed, eval_count, error = await deferToThread(talk)
        assert streamed == "".join(sim.tokens)
        assert eval_count == len(sim.tokens)
        assert error == '502 no node advertises model "mistral"'
