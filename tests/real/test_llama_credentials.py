"""Node credentials against a real ``llama-server --api-key`` (issue 22 item 2;
docs/fleet-scheduling.md#node-credentials).

Without its key every route but ``/health`` answers 401, so the node's poll fails and it is
down. With ``[nodes.credentials] llamacpp = "env:NAME"`` and the key in the proxy's
environment, its polls (model list, load routes) and every request through the proxy carry it:
the openai SDK, holding a key of its own that the engine would refuse, is answered, streams
included. A SIGHUP naming a variable the process does not have keeps the running fleet, and
the key never reaches the log. A ``file:`` key is read again at SIGHUP (issue 31 item 1), and
the proxy run as the systemd unit runs it — an unprivileged user, its TLS key and the node's
key handed over in ``$CREDENTIALS_DIRECTORY`` (docs/lan.md#as-a-service) — serves TLS and
reaches the keyed engine.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from tests.certs import issue, make_ca
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

#: A command run as the unprivileged user the service's stand-in runs as.
AS_NOBODY = ("/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")


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


def chat_body(text: str) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 2}


@pytest_twisted.ensureDeferred
async def test_a_rotated_key_file_is_read_again_at_sighup(
    tmp_path: Path, keyed_server: str
) -> None:
    """``file:`` beside the fleet file: a stale key leaves the node down; the right one written
    over it and a SIGHUP bring it up, with no restart."""
    port, admin = free_port(), free_port()
    (tmp_path / "node.key").write_text("sk-stale-key\n")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f'inventory-interval = "100ms"\n[facades.llamacpp]\nport = {port}\n'
        f'[[nodes]]\nid = "keyed"\n[nodes.engines]\nllamacpp = "{keyed_server}"\n'
        '[nodes.credentials]\nllamacpp = "file:node.key"\n'
    )
    async with running_proxy(tmp_path, "--fleet", str(fleet), "--admin-port", str(admin)) as proxy:
        await proxy.wait_for_log(lambda r: "does not answer its poll" in str(r.get("msg")))
        assert (await node_report(admin))["lastError"] == "status 401"
        (tmp_path / "node.key").write_text(KEY + "\n")
        assert proxy.transport is not None
        proxy.transport.signalProcess("HUP")
        await proxy.wait_for_log(lambda r: "fleet file reloaded" in str(r.get("msg")), timeout=10)
        for _ in range(50):
            if (await node_report(admin))["state"] == "up":
                break
            await sleep(0.1)
        assert (await node_report(admin))["state"] == "up"
        response = await treq.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=chat_body("hi"), timeout=30
        )
        assert response.code == 200, await response.content()
        await response.content()
        assert KEY not in proxy.raw_stderr.decode("utf-8", "replace")
        assert log_problems(proxy) == []


@pytest.fixture
def service_dir() -> Iterator[Path]:
    """A directory the unprivileged user owns (pytest's own are root's, 0700): its state
    directory, its fleet file and its credentials."""
    if os.geteuid() != 0:
        pytest.skip("running the proxy as another user needs root")
    made = Path(tempfile.mkdtemp(prefix="nvpair-service-"))
    shutil.chown(made, "nobody", "nogroup")
    try:
        yield made
    finally:
        shutil.rmtree(made)


@pytest_twisted.ensureDeferred
async def test_the_service_as_its_dynamic_user_serves_tls_and_reaches_the_keyed_node(
    tmp_path: Path, service_dir: Path, keyed_server: str
) -> None:
    """The unit's situation (issue 31 item 1): ``lan.key`` 0600 root as ``openssl`` writes it,
    the node's key in no variable; systemd's copies in ``$CREDENTIALS_DIRECTORY``, readable by
    the service's user alone; the installed console script as that user."""
    ca = make_ca()
    server = issue(ca, ["localhost"], ["127.0.0.1"])
    originals = {"lan.crt": server.cert_pem, "lan.key": server.key_pem, "gpu1-llama.key": KEY}
    for name, content in originals.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode() + b"\n")  # type: ignore[attr-defined]
        path.chmod(0o600)
    unreadable = subprocess.run(
        [*AS_NOBODY, "cat", str(tmp_path / "lan.key")],
        capture_output=True,
        check=False,
    )
    assert unreadable.returncode != 0 and unreadable.stdout == b""
    # As systemd lays them out: a directory and files only the service's user reads.
    credentials = service_dir / "credentials"
    credentials.mkdir()
    for name in originals:
        shutil.copyfile(tmp_path / name, credentials / name)
        shutil.chown(credentials / name, "nobody", "nogroup")
        (credentials / name).chmod(0o400)
    shutil.chown(credentials, "nobody", "nogroup")
    credentials.chmod(0o500)
    port, admin = free_port(), free_port()
    fleet = service_dir / "fleet.toml"
    fleet.write_text(
        f'inventory-interval = "100ms"\n[facades.llamacpp]\nport = {port}\n'
        '[access]\nnetworks = ["192.0.2.0/24"]\n'
        'tls-cert = "credential:lan.crt"\ntls-key = "credential:lan.key"\n'
        f'[[nodes]]\nid = "keyed"\n[nodes.engines]\nllamacpp = "{keyed_server}"\n'
        '[nodes.credentials]\nllamacpp = "credential:gpu1-llama.key"\n'
    )
    fleet.chmod(0o644)
    state = service_dir / "state"
    state.mkdir()
    shutil.chown(state, "nobody", "nogroup")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    async with running_proxy(
        state,
        "--fleet",
        str(fleet),
        "--admin-port",
        str(admin),
        env={"CREDENTIALS_DIRECTORY": str(credentials)},
        console_script=True,
        run_as=("nobody", "nogroup"),
    ) as proxy:
        await proxy.wait_for_log(
            lambda r: "keyed joined llamacpp discovery" in str(r.get("msg")), timeout=20
        )
        assert proxy.transport is not None
        status = Path(f"/proc/{proxy.transport.pid}/status").read_text()
        (uid_line,) = [line for line in status.splitlines() if line.startswith("Uid:")]
        assert set(uid_line.split()[1:]) == {str(pwd.getpwnam("nobody").pw_uid)}

        def over_tls() -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [
                    *("curl", "-sS", "--max-time", "30", "--cacert", str(tmp_path / "ca.crt")),
                    *("-H", "Content-Type: application/json", "-w", "\n%{http_code}"),
                    *("-d", json.dumps(chat_body("hello"))),
                    f"https://localhost:{port}/v1/chat/completions",
                ],
                capture_output=True,
                check=False,
                timeout=40,
            )

        result = await deferToThread(over_tls)
        assert result.returncode == 0, result.stderr
        body, _, code = result.stdout.rpartition(b"\n")
        assert code == b"200", body
        assert json.loads(body)["object"] == "chat.completion"
        assert KEY not in proxy.raw_stderr.decode("utf-8", "replace")
        assert log_problems(proxy) == []
