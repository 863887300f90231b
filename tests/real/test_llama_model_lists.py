"""llama-server's own ``models`` list survives the facade's merge (issue 32 item 6;
docs/inventories.md#llamacpps-two-lists).

A real ``llama-server`` (``--alias tiny``) and a simulated llama.cpp node serving ``other``,
through ``twistd -n nvpair-proxy --fleet`` with a ``[models]`` alias and a key file applied to
loopback callers: ``GET /v1/models`` and ``GET /models`` answer llama-server's Ollama-style
``models`` beside ``data``, merged as ``data`` is — the real server's entry as it wrote it,
the alias as a renamed copy, the other node's entry — and a key allowed ``other`` only sees
``other`` in both lists.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.web.http_headers import Headers

from nvpair.sim import SimEngine
from tests.real.servers import fleet_proxy, llama_server_binary, running_llama_server
from tests.real.tiny_gguf import write_tiny_gguf

ALICE = "nvp_alice_0123456789abcdef0123456789abcdef"
BOB = "nvp_bob_0123456789abcdef0123456789abcdef01"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")
    with running_llama_server(llama_server_binary(), model) as url:
        yield url


def fleet_extra(tmp_path: Path) -> str:
    """``[models]`` naming ``tiny`` ``chat`` too; alice may list everything, bob ``other``."""
    lines = []
    for name, secret, models in (("alice", ALICE, ""), ("bob", BOB, 'models = ["other"]\n')):
        digest = hashlib.sha256(secret.encode()).hexdigest()
        lines.append(f'[[keys]]\nname = "{name}"\nsha256 = "{digest}"\n{models}')
    (tmp_path / "keys.toml").write_text("".join(lines))
    return '[models]\n"chat" = ["tiny"]\n[access]\nkeys = "keys.toml"\nloopback-keys = true\n'


async def listed(base: str, path: str, key: str | None = None) -> Any:
    headers = Headers({"authorization": [f"Bearer {key}"]} if key else {})
    response = await treq.get(base + path, headers=headers, timeout=10)
    body = await response.content()
    assert response.code == 200, body
    return json.loads(body)


@pytest_twisted.ensureDeferred
async def test_models_is_merged_beside_data(tmp_path: Path, real: str) -> None:
    own = (await listed(real, "/models"))["models"]
    assert [entry["name"] for entry in own] == ["tiny"]
    engine = SimEngine(reactor, "llamacpp", models=["other"], node="b")
    engine.listen()
    try:
        nodes = {"a": real, "b": engine.url}
        async with fleet_proxy(tmp_path, nodes, extra=fleet_extra(tmp_path)) as (_, port):
            base = f"http://127.0.0.1:{port}"
            for path in ("/v1/models", "/models"):
                document = await listed(base, path, ALICE)
                assert list(document) == ["models", "object", "data"]
                models = document["models"]
                assert [(m["name"], m["model"]) for m in models] == [
                    ("tiny", "tiny"),
                    ("chat", "chat"),
                    ("other", "other"),
                ]
                # The real server's entry passes through as it wrote it; the alias is its copy.
                assert models[0] == own[0]
                assert {**models[1], "name": "tiny", "model": "tiny"} == own[0]
                assert [m["id"] for m in document["data"]] == ["tiny", "chat", "other"]
                # A key allowed "other" only sees it in both lists.
                limited = await listed(base, path, BOB)
                assert [m["name"] for m in limited["models"]] == ["other"]
                assert [m["id"] for m in limited["data"]] == ["other"]
    finally:
        await engine.stop()
