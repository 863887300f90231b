"""A key holds on the LAN whatever its holder writes (issue 29 items 1-3;
docs/lan.md#what-a-key-can-and-cannot-do): from a second network namespace, the ollama SDK,
the openai SDK and httpx try every spelling and body that once reached a model the key may not
use, through the Ollama facade's ``/api/*`` and ``/v1/*`` routes and the ``openai`` facade, and
the simulated engine shows that nothing reached it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest_twisted

from nvpair.fleet.lanconfig import new_key
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port
from tests.integration.netns import lan_namespace
from tests.integration.test_lan import keys_file, listed, python_in

_PROBE = """
import json, sys, httpx, ollama, openai
ollama_base, openai_base, phone, admin = sys.argv[1:5]
out = {}
SCHEME = "llama3://registry.ollama.ai/library/secret"
hi = [{"role": "user", "content": "hi"}]
client = ollama.Client(host=ollama_base, headers={"Authorization": f"Bearer {phone}"})
out["allowed"] = client.chat(model="llama3", messages=hi).message.content
try:
    client.chat(model=SCHEME, messages=hi)
except ollama.ResponseError as error:
    out["ollama scheme"] = [error.status_code, error.error]
for base, name in ((ollama_base + "/v1", "ollama v1"), (openai_base + "/v1", "openai facade")):
    sdk = openai.OpenAI(base_url=base, api_key=phone, max_retries=0)
    try:
        sdk.chat.completions.create(model=SCHEME, messages=hi)
    except openai.APIStatusError as error:
        out[name] = [error.status_code, error.body["code"]]
    out[name + " listed"] = sorted(m.id for m in sdk.models.list())

def raw(key, method, path, body, base=ollama_base):
    answer = httpx.request(
        method, base + path, content=body, headers={"Authorization": f"Bearer {key}"}
    )
    return [answer.status_code, answer.headers.get("x-nvpair-error")]

out["twice"] = raw(phone, "POST", "/api/chat", b'{"model":"llama3","Model":"secret","messages":[]}')
out["twice exact"] = raw(phone, "POST", "/api/chat", b'{"model":"llama3","model":"secret"}')
out["show Model"] = raw(phone, "POST", "/api/show", b'{"Model":"secret"}')
out["show name"] = raw(phone, "POST", "/api/show", b'{"model":"llama3","name":"secret"}')
out["show allowed"] = raw(phone, "POST", "/api/show", b'{"model":"llama3"}')
COPY = b'{"source":"llama3","destination":"llama3-b"}'
out["copy unmanaged"] = raw(phone, "POST", "/api/copy", COPY)
out["delete unmanaged"] = raw(phone, "DELETE", "/api/delete", b'{"model":"llama3"}')
out["pull unmanaged"] = raw(phone, "POST", "/api/pull", b'{"model":"llama3"}')
FROM_SECRET = b'{"source":"secret","destination":"llama3-x"}'
TO_SECRET = b'{"source":"llama3","destination":"secret"}'
out["copy secret"] = raw(admin, "POST", "/api/copy", FROM_SECRET)
out["copy to secret"] = raw(admin, "POST", "/api/copy", TO_SECRET)
out["copy managed"] = raw(admin, "POST", "/api/copy", COPY)
# What the engine decodes, the proxy judges decoded.
out["pull encoded"] = raw(phone, "POST", "/api/p%75ll", b'{"model":"llama3"}')
UNREADABLE = b'{"model":"secret","x":"' + bytes([255]) + b'"}'
out["show unreadable"] = raw(phone, "POST", "/api/show", UNREADABLE)
out["show trailing"] = raw(phone, "POST", "/api/show", b'{"model":"secret"} x')
out["show by path"] = raw(phone, "GET", "/v1/models/secret", None)
out["wide escape"] = raw(phone, "GET", "/api/t%u0061gs", None)
AUTH = {"Authorization": f"Bearer {phone}"}
tags = httpx.get(ollama_base + "/api/t%61gs", headers=AUTH)
out["tags encoded"] = [m["name"] for m in tags.json()["models"]]
print(json.dumps(out))
"""


@pytest_twisted.ensureDeferred
async def test_a_key_reaches_only_its_models_however_it_spells_them(tmp_path: Path) -> None:
    phone, _ = new_key("phone")
    admin, _ = new_key("admin")
    keys = keys_file(tmp_path / "keys.toml", ("phone", phone, ["llama3*"]))
    digest = __import__("hashlib").sha256(admin.encode()).hexdigest()
    keys.write_text(
        keys.read_text()
        + f'[[keys]]\nname = "admin"\nsha256 = "{digest}"\nmodels = ["llama3*"]\nmanage = true\n'
    )
    port, openai_port = free_port(), free_port()
    with lan_namespace() as lan:
        async with sims(("ollama", ["llama3:latest", "secret:latest"], "node-a")) as (sim,):
            fleet = tmp_path / "fleet.toml"
            fleet.write_text(
                f'inventory-interval = "100ms"\n[facades.ollama]\nport = {port}\n'
                f"[facades.openai]\nport = {openai_port}\n"
                f'[[nodes]]\nid = "node-a"\n[nodes.engines]\nollama = "{sim.url}"\n'
                f'[access]\nnetworks = ["{lan.network}"]\nkeys = "keys.toml"\n'
            )
            async with running_proxy(tmp_path / "state", "--fleet", str(fleet)):
                await listed(port, "/api/tags", "models", "name", "secret:latest")
                out = await python_in(
                    lan,
                    _PROBE,
                    f"http://{lan.host_ip}:{port}",
                    f"http://{lan.host_ip}:{openai_port}",
                    phone,
                    admin,
                )
    forbidden_model = [403, "forbidden-model"]
    assert out == {
        "allowed": "".join(sim.tokens),
        "ollama scheme": [403, f'this key may not use model "{_scheme()}"'],
        "ollama v1": forbidden_model,
        "ollama v1 listed": ["llama3:latest"],
        "openai facade": forbidden_model,
        "openai facade listed": ["llama3:latest"],
        "twice": [400, "bad-json"],
        "twice exact": [400, "bad-json"],
        "show Model": forbidden_model,
        "show name": forbidden_model,
        "show allowed": [200, None],
        "copy unmanaged": [403, "forbidden-route"],
        "delete unmanaged": [403, "forbidden-route"],
        "pull unmanaged": [403, "forbidden-route"],
        "copy secret": forbidden_model,
        "copy to secret": forbidden_model,
        "copy managed": [200, None],
        "pull encoded": [403, "forbidden-route"],
        "show unreadable": forbidden_model,
        "show trailing": forbidden_model,
        "show by path": forbidden_model,
        "wide escape": [400, "bad-request"],
        "tags encoded": ["llama3-b:latest", "llama3:latest"],  # the copy made above
    }
    # Nothing about the secret model ever reached the engine.
    reached = [json.loads(r.body) for r in sim.requests if r.method in ("POST", "DELETE")]
    assert all("secret" not in json.dumps(body).lower() for body in reached), reached
    assert [r.path for r in sim.requests if r.method in ("POST", "DELETE")] == [
        "/api/chat",
        "/api/show",
        "/api/copy",
    ]


def _scheme() -> str:
    return "llama3://registry.ollama.ai/library/secret"
