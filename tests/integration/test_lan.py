"""Fleet mode serving the LAN (``[access]``, docs/lan.md), driven from a second network
namespace with real clients: the openai SDK with ``api_key``, the ollama SDK with an
``Authorization`` header, curl over TLS with a self-made CA."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor, task
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from nvpair.fleet.lanconfig import new_key
from tests.certs import issue, make_ca
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import ProxyProcess, free_port
from tests.integration.netns import Namespace, lan_namespace


def keys_file(path: Path, *keys: tuple[str, str, Sequence[str]]) -> Path:
    """A key file of ``(name, secret, patterns)``, written as --new-key's blocks are."""
    text = ""
    for name, secret, patterns in keys:
        digest = __import__("hashlib").sha256(secret.encode()).hexdigest()
        text += f'[[keys]]\nname = "{name}"\nsha256 = "{digest}"\n'
        if patterns:
            text += f"models = {json.dumps(list(patterns))}\n"
    path.write_text(text)
    return path


def tls_access(directory: Path, lan: Namespace, network: str) -> str:
    """An ``[access]`` table for ``network`` with ``keys.toml``, serving TLS: its certificate
    (for ``gpu.lan`` and the proxy's address on ``lan``) and key written in ``directory``, with
    ``ca.crt``, the fresh authority that issued it, for the clients."""
    ca = make_ca()
    server = issue(ca, ["gpu.lan"], [lan.host_ip])
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / "lan.crt").write_bytes(server.cert_pem)
    (directory / "lan.key").write_bytes(server.key_pem)
    return (
        f'[access]\nnetworks = ["{network}"]\nkeys = "keys.toml"\n'
        'tls-cert = "lan.crt"\ntls-key = "lan.key"\n'
    )


def fleet_file(
    path: Path,
    engine: str,
    port: int,
    nodes: dict[str, str],
    access: str,
) -> Path:
    text = f'inventory-interval = "100ms"\n[facades.{engine}]\nport = {port}\n'
    for node, url in nodes.items():
        text += f'[[nodes]]\nid = "{node}"\n[nodes.engines]\n{engine} = "{url}"\n'
    path.write_text(text + access)
    return path


async def in_namespace(lan: Namespace, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end inside the namespace (off the reactor: the sims answer)."""
    return await deferToThread(
        subprocess.run,
        lan.command(*argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_PROXY": "*"},
    )


async def python_in(lan: Namespace, script: str, *args: str) -> Any:
    """A Python script run inside the namespace; what it printed, as JSON."""
    done = await in_namespace(lan, [sys.executable, "-c", script, *args])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def curl(lan: Namespace, *args: str) -> tuple[int, dict[str, str], str]:
    """curl inside the namespace: the status, the headers (lower-cased) and the body."""
    done = await in_namespace(lan, ["curl", "-s", "-i", "--max-time", "10", *args])
    assert done.returncode == 0, (done.returncode, done.stderr)
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    status_line, *fields = head.split("\n")
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


async def eventually(check: Any, what: str, timeout: float = 15.0) -> None:
    for _ in range(int(timeout / 0.1)):
        try:
            if await check():
                return
        except Exception:
            pass
        await task.deferLater(reactor, 0.1, lambda: None)
    raise AssertionError(f"never: {what}")


async def listed(port: int, path: str, field: str, key: str, model: str) -> None:
    """Wait until the facade on loopback lists ``model`` (its node was polled)."""

    async def check() -> bool:
        response = await treq.get(f"http://127.0.0.1:{port}{path}", timeout=5)
        document = json.loads(await response.content())
        return model in [entry[key] for entry in document[field] or []]

    await eventually(check, f"{model} listed on {port}")


async def status(admin: int) -> Any:
    response = await treq.get(f"http://127.0.0.1:{admin}/status", timeout=5)
    return json.loads(await response.content())


async def metrics(admin: int) -> str:
    response = await treq.get(f"http://127.0.0.1:{admin}/metrics", timeout=5)
    return str((await response.content()).decode())


_OPENAI = """
import json, sys, httpx, openai
base, key = sys.argv[1], sys.argv[2]
out = {}
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
stream = client.chat.completions.create(
    model="qwen2.5-7b-instruct", messages=[{"role": "user", "content": "hi"}], stream=True
)
out["text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
out["models"] = [m.id for m in client.models.list()]
try:
    openai.OpenAI(base_url=base, api_key="nvp_wrong", max_retries=0).models.list()
except openai.APIStatusError as error:
    out["wrong"] = [error.status_code, error.response.headers.get("www-authenticate"), error.body]
no_key = httpx.get(base + "/models")
out["no key"] = [no_key.status_code, no_key.headers.get("www-authenticate"), no_key.json()["error"]]
print(json.dumps(out))
"""


@pytest_twisted.ensureDeferred
async def test_the_openai_sdk_on_the_lan_with_its_api_key(tmp_path: Path) -> None:
    """A listed LAN caller with a valid key is served; a wrong key is 401 with
    WWW-Authenticate; the key reaches no engine; its name is in /status, the access log, the
    debug workload record and nvpair_key_requests_total."""
    laptop, _ = new_key("laptop")
    keys_file(tmp_path / "keys.toml", ("laptop", laptop, ()))
    port, admin = free_port(), free_port()
    with lan_namespace() as lan:
        async with sims(("lmstudio", ["qwen2.5-7b-instruct"], "node-a")) as (sim,):
            fleet = fleet_file(
                tmp_path / "fleet.toml",
                "lmstudio",
                port,
                {"node-a": sim.url},
                f'[access]\nnetworks = ["{lan.network}"]\nkeys = "keys.toml"\n',
            )
            args = ("--fleet", str(fleet), "--admin-port", str(admin), "--access-log")
            async with running_proxy(tmp_path / "state", *args, "--log-level", "debug") as proxy:
                await listed(port, "/v1/models", "data", "id", "qwen2.5-7b-instruct")
                out = await python_in(lan, _OPENAI, f"http://{lan.host_ip}:{port}/v1", laptop)
                assert out["text"] == "".join(sim.tokens)
                assert out["models"] == ["qwen2.5-7b-instruct"]
                unauthorized = {
                    "message": "a valid key is required: Authorization: Bearer <key>",
                    "type": "nvpair_proxy",
                    "code": "unauthorized",
                }
                assert out["wrong"] == [401, 'Bearer realm="nvpair"', unauthorized]
                assert out["no key"] == [401, 'Bearer realm="nvpair"', unauthorized]
                # The key is the proxy's: no engine ever sees it.
                assert sim.requests and all("authorization" not in r.headers for r in sim.requests)
                recent = (await status(admin))["recent"]
                assert [(w["key"], w["state"]) for w in recent] == [("laptop", "completed")]
                assert (
                    'nvpair_key_requests_total{engine="lmstudio",key="laptop",outcome="served"} 2.0'
                    in await metrics(admin)
                )
                lines = [
                    r
                    for r in proxy.logs
                    if r.get("namespace", "").startswith("nvpair.facades.access")
                ]
                assert {(r.get("path"), r.get("status"), r.get("key")) for r in lines} >= {
                    ("/v1/chat/completions", 200, "laptop"),
                    ("/v1/models", 200, "laptop"),
                    ("/v1/models", 401, None),
                }
                # Who knocked, and through which facade, on every line, refusals included
                # (the loopback one is the test's own wait for the model list).
                assert {(r["client"], r["facade"]) for r in lines} == {
                    (lan.ns_ip, "lmstudio"),
                    ("127.0.0.1", "lmstudio"),
                }
                # Refused at the head, and counted all the same.
                assert (
                    'nvpair_requests_total{engine="lmstudio",outcome="unauthorized",'
                    'route="inventory"} 2.0' in await metrics(admin)
                )
                completed = [r for r in proxy.logs if r.get("method") == "workload:completed"]
                assert [r["key"] for r in completed] == ["laptop"]
                # The admin listener stays on loopback: from the LAN it is not even there.
                done = await in_namespace(
                    lan, ["curl", "-s", "--max-time", "5", f"http://{lan.host_ip}:{admin}/status"]
                )
                assert done.returncode == 7  # couldn't connect


_OLLAMA = """
import json, sys, ollama
base, key = sys.argv[1], sys.argv[2]
out = {}
client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})
out["listed"] = [m.model for m in client.list().models]
hi = [{"role": "user", "content": "hi"}]
out["chat"] = client.chat(model="llama3", messages=hi).message.content
try:
    client.chat(model="mistral", messages=[{"role": "user", "content": "hi"}])
except ollama.ResponseError as error:
    out["refused"] = [error.status_code, error.error]
try:
    ollama.Client(host=base).list()
except ollama.ResponseError as error:
    out["no key"] = [error.status_code, error.error]
print(json.dumps(out))
"""


@pytest_twisted.ensureDeferred
async def test_the_ollama_sdk_with_a_key_limited_to_some_models(tmp_path: Path) -> None:
    """A key's model patterns: its model list shows only what it may use, another model is
    403 forbidden-model; a loopback caller needs no key and sees everything."""
    phone, _ = new_key("phone")
    keys_file(tmp_path / "keys.toml", ("phone", phone, ["llama3*"]))
    port, admin = free_port(), free_port()
    with lan_namespace() as lan:
        async with sims(("ollama", ["llama3:latest", "mistral:latest"], "node-a")) as (sim,):
            fleet = fleet_file(
                tmp_path / "fleet.toml",
                "ollama",
                port,
                {"node-a": sim.url},
                f'[access]\nnetworks = ["{lan.ns_ip}/32"]\nkeys = "keys.toml"\n',
            )
            args = ("--fleet", str(fleet), "--admin-port", str(admin))
            async with running_proxy(tmp_path / "state", *args):
                await listed(port, "/api/tags", "models", "name", "mistral:latest")
                out = await python_in(lan, _OLLAMA, f"http://{lan.host_ip}:{port}", phone)
                assert out == {
                    "listed": ["llama3:latest"],
                    "chat": "".join(sim.tokens),
                    "refused": [403, 'this key may not use model "mistral"'],
                    "no key": [401, "a valid key is required: Authorization: Bearer <key>"],
                }
                assert [r.path for r in sim.requests if r.path == "/api/chat"] == ["/api/chat"]
                text = await metrics(admin)
                assert (
                    'nvpair_key_requests_total{engine="ollama",key="phone",'
                    'outcome="forbidden-model"} 1.0' in text
                )
                # On the proxy's own machine no key is needed, and every model is listed.
                tags = await treq.get(f"http://127.0.0.1:{port}/api/tags")
                names = [m["name"] for m in json.loads(await tags.content())["models"]]
                assert sorted(names) == ["llama3:latest", "mistral:latest"]


def _hup(proxy: ProxyProcess) -> None:
    os.kill(proxy.pid, signal.SIGHUP)


@pytest_twisted.ensureDeferred
async def test_curl_over_tls_the_throttle_and_a_reload(tmp_path: Path) -> None:
    """TLS with a self-made CA on the facade's own port, by name and by address; plaintext
    from the LAN then 403 tls-required, loopback unaffected; Ollama's
    Host guard for loopback callers only; ten failed keys close the address (429, with
    Retry-After); SIGHUP applies a new key file and networks, and keeps the running ones
    when the new file is broken; ``require-tls = false`` serves LAN plaintext again."""
    key, other = new_key("laptop")[0], new_key("tv")[0]
    keys = keys_file(tmp_path / "keys.toml", ("laptop", key, ()))
    port, admin = free_port(), free_port()
    with lan_namespace() as lan:
        access = tls_access(tmp_path, lan, lan.network)
        async with sims(("ollama", ["llama3:latest"], "node-a")) as (sim,):
            fleet = fleet_file(tmp_path / "fleet.toml", "ollama", port, {"node-a": sim.url}, access)
            args = ("--fleet", str(fleet), "--admin-port", str(admin))
            async with running_proxy(tmp_path / "state", *args) as proxy:
                await listed(port, "/api/tags", "models", "name", "llama3:latest")
                bearer = f"Authorization: Bearer {key}"
                ca_file = str(tmp_path / "ca.crt")
                by_name = ["--cacert", ca_file, "--resolve", f"gpu.lan:{port}:{lan.host_ip}"]
                tags = f"https://gpu.lan:{port}/api/tags"
                code, _, body = await curl(lan, *by_name, "-H", bearer, tags)
                assert code == 200 and "llama3:latest" in body
                code, _, _ = await curl(
                    lan, "--cacert", ca_file, "-H", bearer, f"https://{lan.host_ip}:{port}/api/tags"
                )
                assert code == 200
                code, headers, _ = await curl(lan, *by_name, tags)
                assert code == 401 and headers["x-nvpair-error"] == "unauthorized"
                # A LAN caller names this machine as it likes; a loopback one is guarded.
                rebound = ["-H", "Host: rebind.example.com"]
                by_address = f"https://{lan.host_ip}:{port}/api/tags"
                code, _, _ = await curl(
                    lan, "--cacert", ca_file, *rebound, "-H", bearer, by_address
                )
                assert code == 200
                # TLS served is TLS required: the key sent in clear is not even judged.
                plaintext = f"http://{lan.host_ip}:{port}/api/tags"
                code, headers, body = await curl(lan, "-H", bearer, plaintext)
                assert code == 403 and headers["x-nvpair-error"] == "tls-required"
                assert "must use TLS (https://)" in body
                code, headers, _ = await curl(lan, "-H", "Authorization: Bearer x", plaintext)
                assert code == 403 and headers["x-nvpair-error"] == "tls-required"
                # Loopback callers never need it.
                local = await treq.get(f"http://127.0.0.1:{port}/api/tags")
                await local.content()
                assert local.code == 200
                local = await treq.get(
                    f"http://127.0.0.1:{port}/api/tags",
                    headers=Headers({b"Host": [b"rebind.example.com"]}),
                )
                await local.content()
                assert local.code == 403
                assert local.headers.getRawHeaders(b"x-nvpair-error") == [b"forbidden-host"]

                # SIGHUP: a broken key file keeps the running keys ...
                keys.write_text('[[keys]]\nname = "laptop"\nsha256 = "nope"\n')
                _hup(proxy)
                await proxy.wait_for_log(lambda r: "not reloaded" in r.get("msg", ""))
                code, _, _ = await curl(lan, *by_name, "-H", bearer, tags)
                assert code == 200
                # ... a good one replaces them; and plaintext is served beside TLS once
                # require-tls = false.
                keys_file(keys, ("tv", other, ()))
                fleet_file(
                    fleet, "ollama", port, {"node-a": sim.url}, access + "require-tls = false\n"
                )
                mark = len(proxy.logs)
                _hup(proxy)
                await proxy.wait_for_log(
                    lambda r: (
                        r.get("msg", "").startswith("fleet file reloaded")
                        and proxy.logs.index(r) >= mark
                    )
                )
                code, _, _ = await curl(lan, *by_name, "-H", bearer, tags)
                assert code == 401
                code, _, _ = await curl(lan, *by_name, "-H", f"Authorization: Bearer {other}", tags)
                assert code == 200
                code, _, _ = await curl(lan, "-H", f"Authorization: Bearer {other}", plaintext)
                assert code == 200

                # Ten failed keys within a minute: refused, valid key or not.
                for _ in range(9):  # one failed above already
                    code, _, _ = await curl(lan, *by_name, "-H", "Authorization: Bearer x", tags)
                    assert code == 401
                code, headers, body = await curl(
                    lan, *by_name, "-H", f"Authorization: Bearer {other}", tags
                )
                assert code == 429 and headers["x-nvpair-error"] == "too-many-auth-failures"
                assert 50 <= int(headers["retry-after"]) <= 60
                assert "too many failed keys" in body
                # Every refusal at the head is counted under its reason.
                counted = await metrics(admin)
                for outcome, count in (
                    ("tls-required", 2),
                    ("unauthorized", 11),
                    ("forbidden-host", 1),
                    ("too-many-auth-failures", 1),
                ):
                    assert (
                        f'nvpair_requests_total{{engine="ollama",outcome="{outcome}",'
                        f'route="inventory"}} {count}.0'
                    ) in counted, (outcome, counted)

                # A network no longer listed: 403, as without [access].
                fleet_file(fleet, "ollama", port, {"node-a": sim.url}, "")
                mark = len(proxy.logs)
                _hup(proxy)
                await proxy.wait_for_log(
                    lambda r: (
                        "LAN callers: none" in r.get("msg", "") and proxy.logs.index(r) >= mark
                    )
                )
                code, headers, _ = await curl(
                    lan, "-H", f"Authorization: Bearer {other}", f"http://{lan.host_ip}:{port}/"
                )
                assert code == 403 and headers["x-nvpair-error"] == "forbidden"
                # Without [access] TLS from a non-member is closed, as before.
                done = await in_namespace(lan, ["curl", "-s", "--max-time", "5", *by_name, tags])
                assert done.returncode != 0


_NAMES = """
import json, sys, openai
base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
out = {"listed": [m.id for m in client.models.list()]}
reply = client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "hi"}])
out["chat"] = reply.choices[0].message.content
try:
    client.chat.completions.create(
        model="llama3", messages=[{"role": "user", "content": "hi"}]
    )
except openai.APIStatusError as error:
    out["refused"] = error.status_code
print(json.dumps(out))
"""


@pytest_twisted.ensureDeferred
async def test_a_keys_patterns_judge_file_names_and_aliases_by_their_own_name(
    tmp_path: Path,
) -> None:
    """The names the fleet knows models by besides the node's (a GGUF file name, a
    ``[models]`` alias, docs/model-names.md) are listed to a key and served to it by their own
    name: the key sees, and may use, exactly the names its patterns match. A loopback caller
    that presents a key is held to it, so the openai SDK on this machine shows it."""
    qwen_path, llama_path = "/models/qwen2.5-7b-q4.gguf", "/models/Llama-3.1-8B-Q4.gguf"
    phone, _ = new_key("phone")
    keys_file(tmp_path / "keys.toml", ("phone", phone, ["qwen*"]))
    port = free_port()
    async with sims(("llamacpp", [qwen_path, llama_path], "node-a")) as (sim,):
        access = (
            '[models]\n"qwen" = ["qwen2.5-7b-q4"]\n"llama3" = ["Llama-3.1-8B-Q4"]\n'
            '[access]\nnetworks = ["192.0.2.0/24"]\nkeys = "keys.toml"\n'
        )
        fleet = fleet_file(tmp_path / "fleet.toml", "llamacpp", port, {"node-a": sim.url}, access)
        async with running_proxy(tmp_path / "state", "--fleet", str(fleet)):
            await listed(port, "/v1/models", "data", "id", "llama3")
            done = await deferToThread(
                subprocess.run,
                [sys.executable, "-c", _NAMES, f"http://127.0.0.1:{port}/v1", phone],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            out = json.loads(done.stdout)
            # The model the patterns allow, under every name the fleet knows it by.
            assert sorted(out["listed"]) == [
                qwen_path,
                "qwen",
                "qwen2.5-7b-q4",
                "qwen2.5-7b-q4.gguf",
            ]
            assert out["chat"] and out["refused"] == 403
            # The node was sent its own name for the model the alias stands for.
            bodies = [json.loads(r.body) for r in sim.requests if r.method == "POST"]
            assert [b["model"] for b in bodies] == [qwen_path]
