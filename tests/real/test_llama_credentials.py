"""Node credentials against a real ``llama-server --api-key`` (issue 22 item 2;
docs/fleet-scheduling.md#node-credentials).

Without its key every route but ``/health`` answers 401, so the node's poll fails and it is
down. With ``[nodes.credentials] llamacpp = "env:NAME"`` and the key in the proxy's
environment, its polls (model list, load routes) and every request through the proxy carry it:
the openai SDK, holding a key of its own that the engine would refuse, is answered, streams
included. A SIGHUP naming a variable the process does not have keeps the running fleet, and
the key never reaches the log.
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
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from tests.integration.conftest import running_proxy
from tests.integration.harness import free_port, log_problems
from tests.real.servers import (
    fleet_proxy,
    llama_server_binary,
    running_llama_server,
    sleep,
)
from tests.real.tiny_gguf import write_tiny_gguf

#: The engine's key: in the proxy's environment only, never in its fleet file.
KEY = "sk-node-7f3a9c2e41b0d5"

#: The variable the fleet file names.
VARIABLE = "GPU1_LLAMA_KEY"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = llama_server_binary()
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(binary, model, "--api-key", KEY) as url:
        yield url


async def admin_get(admin: int, path: str) -> Any:
    response = await treq.get(f"http://127.0.0.1:{admin}{path}", timeout=10)
    return json.loads(await response.content())


async def node_report(admin: int) -> dict[str, Any]:
    (report,) = (await admin_get(admin, "/status"))["nodes"]["llamacpp"]
    assert isinstance(report, dict)
    return report


@pytest_twisted.ensureDeferred
async def test_without_its_key_the_node_is_down(tmp_path: Path, keyed_server: str) -> None:
    """The engine refuses the poll with 401: the node is down, and says why."""
    port, admin = free_port(), free_port()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f'inventory-interval = "100ms"\n[facades.llamacpp]\nport = {port}\n'
        f'[[nodes]]\nid = "keyed"\n[nodes.engines]\nllamacpp = "{keyed_server}"\n'
    )
    async with running_proxy(tmp_path, "--fleet", str(fleet), "--admin-port", str(admin)) as proxy:
        await proxy.wait_for_log(lambda r: "does not answer its poll" in str(r.get("msg")))
        report = await node_report(admin)
        assert (report["state"], report["lastError"]) == ("down", "status 401")
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers=Headers({"Authorization": [f"Bearer {KEY}"]}),
            timeout=10,
        )
        # Not even a caller holding the key reaches a node that is not in discovery.
        assert response.code == 502
        assert response.headers.getRawHeaders("x-nvpair-error") == ["no-owner"]
        await response.content()


@pytest_twisted.ensureDeferred
async def test_with_its_key_polls_and_requests_reach_it(tmp_path: Path, keyed_server: str) -> None:
    admin = free_port()
    async with fleet_proxy(
        tmp_path,
        {"keyed": keyed_server},
        "--admin-port",
        str(admin),
        credentials={"keyed": f"env:{VARIABLE}"},
        env={VARIABLE: KEY},
    ) as (proxy, port):
        report = await node_report(admin)
        assert report["state"] == "up" and report["models"]
        # The load routes answered too: /slots is behind the key, and was read.
        assert report["load"]["slots"] == 2

        def talk() -> tuple[str, int, list[str]]:
            # The caller's own key, which the engine would refuse, is replaced by the node's.
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="caller-key")
            models = [model.id for model in client.models.list()]
            completion = client.chat.completions.create(
                model=models[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            chunks = sum(
                1
                for _ in client.chat.completions.create(
                    model=models[0],
                    messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=8,
                    stream=True,
                )
            )
            return completion.object, chunks, models

        kind, chunks, models = await deferToThread(talk)
        assert kind == "chat.completion" and chunks > 1 and models == report["models"]
        # Other routes (forwarded once) carry it too.
        props = await treq.get(f"http://127.0.0.1:{port}/props", timeout=10)
        assert props.code == 200 and b"default_generation_settings" in await props.content()
        assert KEY not in proxy.raw_stderr.decode("utf-8", "replace")
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_a_reload_naming_a_missing_variable_keeps_the_running_fleet(
    tmp_path: Path, keyed_server: str
) -> None:
    """SIGHUP: the process's environment has no such variable; the error says which, and the
    node keeps being served with the key it has."""
    async with fleet_proxy(
        tmp_path,
        {"keyed": keyed_server},
        credentials={"keyed": f"env:{VARIABLE}"},
        env={VARIABLE: KEY},
    ) as (proxy, port):
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(fleet.read_text().replace(f"env:{VARIABLE}", "env:NOT_IN_ITS_ENV"))
        assert proxy.transport is not None
        proxy.transport.signalProcess("HUP")
        record = await proxy.wait_for_log(
            lambda r: "fleet file not reloaded" in str(r.get("msg")), timeout=10
        )
        assert str(record["msg"]).endswith(
            "nodes[0].credentials.llamacpp: environment variable NOT_IN_ITS_ENV is not set"
        )
        await sleep(0.5)  # polls go on with the key it has
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            timeout=30,
        )
        assert response.code == 200, await response.content()
        await response.content()
        assert KEY not in proxy.raw_stderr.decode("utf-8", "replace")
