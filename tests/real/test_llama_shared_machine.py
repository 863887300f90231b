"""A real ``llama-server --api-key`` behind the llama.cpp facade on a machine shared by several
users (issue 32 items 2 and 3; docs/lan.md#a-shared-machine, docs/model-names.md#pattern-aliases).

The engine's key is the node's credential, so the proxy reaches it whoever calls. With
``[access] loopback-keys = true`` a loopback caller must present a key of the key file too:
none or a wrong one is 401 (and counted by the failed-key throttle), a valid one is served,
its key's model patterns applied; without it a keyless loopback caller is served as before.
And the names clients hard-code: an Anthropic-style ``/v1/messages`` with ``"model":"test"``,
answered by llama-server itself through ``"*" = ["tiny"]``, and 502 ``no-owner`` without it;
and an Anthropic client's key in ``X-Api-Key`` (docs/lan.md#x-api-key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from tests.integration.harness import log_problems
from tests.real.servers import fleet_proxy, llama_server_binary, running_llama_server
from tests.real.tiny_gguf import write_tiny_gguf

#: The engine's key: the node's credential, in the proxy's environment only.
NODE_KEY = "sk-node-shared-5e1d"
#: A local user's key, in the key file by its digest; and one allowed another model only.
ALICE = "nvp_alice_0123456789abcdef0123456789abcdef"
BOB = "nvp_bob_0123456789abcdef0123456789abcdef01"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(binary, model, "--api-key", NODE_KEY) as url:
        yield url


def access(tmp_path: Path, loopback_keys: bool) -> str:
    """``[access]`` with a key file of alice (every model) and bob (``qwen*`` only)."""
    lines = []
    for name, secret, models in (("alice", ALICE, ""), ("bob", BOB, 'models = ["qwen*"]\n')):
        digest = hashlib.sha256(secret.encode()).hexdigest()
        lines.append(f'[[keys]]\nname = "{name}"\nsha256 = "{digest}"\n{models}')
    (tmp_path / "keys.toml").write_text("".join(lines))
    flag = "true" if loopback_keys else "false"
    return f'[access]\nkeys = "keys.toml"\nloopback-keys = {flag}\n'


async def chat(
    port: int,
    key: str | None,
    path: str = "/v1/chat/completions",
    x_api_key: str | None = None,
) -> tuple[int, Any]:
    """A loopback chat (or ``/v1/messages``) naming ``tiny`` (``test``), with ``key`` if any,
    as Bearer, and ``x_api_key`` if any with ``anthropic-version``, as Anthropic clients send
    theirs."""
    headers = Headers({"content-type": ["application/json"]})
    if key is not None:
        headers.addRawHeader("authorization", f"Bearer {key}")
    if x_api_key is not None:
        headers.addRawHeader("x-api-key", x_api_key)
        headers.addRawHeader("anthropic-version", "2023-06-01")
    messages = [{"role": "user", "content": "hi"}]
    model = "tiny" if path == "/v1/chat/completions" else "test"
    body = {"model": model, "messages": messages, "max_tokens": 4}
    response = await treq.post(
        f"http://127.0.0.1:{port}{path}", json=body, headers=headers, timeout=30
    )
    return response.code, (response.headers, await response.content())


def credentials() -> dict[str, Any]:
    return {"credentials": {"a": "env:SHARED_NODE_KEY"}, "env": {"SHARED_NODE_KEY": NODE_KEY}}


@pytest_twisted.ensureDeferred
async def test_loopback_keys_ask_a_loopback_caller_for_a_key(
    tmp_path: Path, keyed_server: str
) -> None:
    extra = access(tmp_path, loopback_keys=True)
    async with fleet_proxy(tmp_path, {"a": keyed_server}, extra=extra, **credentials()) as (
        proxy,
        port,
    ):
        for key in (None, "nvp_wrong", NODE_KEY):
            status, (headers, _) = await chat(port, key)
            assert status == 401, key
            assert headers.getRawHeaders("www-authenticate") == ['Bearer realm="nvpair"']
            assert headers.getRawHeaders("x-nvpair-error") == ["unauthorized"]
        status, (_, body) = await chat(port, ALICE)
        assert status == 200, body

        def sdk() -> tuple[str, int | None]:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=ALICE)
            completion = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            try:
                openai.OpenAI(
                    base_url=f"http://127.0.0.1:{port}/v1", api_key=BOB, max_retries=0
                ).chat.completions.create(model="tiny", messages=[], max_tokens=4)
            except openai.APIStatusError as error:
                return completion.object, error.status_code
            return completion.object, None

        # The key applies in full to a loopback caller: bob may use qwen* only.
        assert await deferToThread(sdk) == ("chat.completion", 403)
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_without_loopback_keys_a_keyless_loopback_caller_is_served(
    tmp_path: Path, keyed_server: str
) -> None:
    """The default: the node's credential replaces whatever a loopback caller sent."""
    extra = access(tmp_path, loopback_keys=False)
    async with fleet_proxy(tmp_path, {"a": keyed_server}, extra=extra, **credentials()) as (
        proxy,
        port,
    ):
        for key in (None, "nvp_wrong"):
            status, (_, body) = await chat(port, key)
            assert status == 200, (key, body)
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_an_anthropic_request_for_test_is_served_through_a_pattern(
    tmp_path: Path, keyed_server: str
) -> None:
    """``/v1/messages`` with ``"model":"test"``: 502 ``no-owner`` with no pattern, answered by
    llama-server itself through ``"*" = ["tiny"]``."""
    async with fleet_proxy(tmp_path, {"a": keyed_server}, **credentials()) as (_, port):
        status, (headers, _) = await chat(port, None, "/v1/messages")
        assert status == 502
        assert headers.getRawHeaders("x-nvpair-error") == ["no-owner"]
    (tmp_path / "second").mkdir()
    extra = '[models]\n"*" = ["tiny"]\n'
    async with fleet_proxy(
        tmp_path / "second", {"a": keyed_server}, extra=extra, **credentials()
    ) as (proxy, port):
        status, (headers, body) = await chat(port, None, "/v1/messages")
        assert status == 200, body
        assert headers.getRawHeaders("x-nvpair-node") == ["a"]
        assert b'"type":"message"' in body.replace(b" ", b"")
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_an_anthropic_clients_x_api_key_is_a_key_under_loopback_keys(
    tmp_path: Path, keyed_server: str
) -> None:
    """Anthropic's ``/v1/messages`` with the key as ``X-Api-Key`` (no ``Authorization``), as
    the anthropic SDK and Claude Code send it: a key of the key file is served by llama-server
    (which gets the node's credential); a wrong one, or a wrong ``Authorization`` beside a
    right ``X-Api-Key``, is the proxy's 401, as llama-server reads the two."""
    extra = access(tmp_path, loopback_keys=True) + '[models]\n"*" = ["tiny"]\n'
    async with fleet_proxy(tmp_path, {"a": keyed_server}, extra=extra, **credentials()) as (
        proxy,
        port,
    ):
        status, (headers, body) = await chat(port, None, "/v1/messages", x_api_key=ALICE)
        assert status == 200, body
        assert headers.getRawHeaders("x-nvpair-node") == ["a"]
        assert b'"type":"message"' in body.replace(b" ", b"")
        for key, x_api_key in ((None, "nvp_wrong"), (None, NODE_KEY), ("nvp_wrong", ALICE)):
            status, (headers, _) = await chat(port, key, "/v1/messages", x_api_key=x_api_key)
            assert status == 401, (key, x_api_key)
            assert headers.getRawHeaders("www-authenticate") == ['Bearer realm="nvpair"']
        assert log_problems(proxy) == []
