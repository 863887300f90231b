"""The ``openai`` facade through the whole process, in memory: one OpenAI endpoint in front of
a simulated Ollama, LM Studio and llama.cpp (docs/openai-facade.md).

Every request goes through the real facade, request path and upstream client to the simulated
engines' real resources; only the network is in memory, and time is the reactor's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher

from nvpair.fleet.file import FacadeSpec, Fleet, FleetNode
from nvpair.sim import SimEngine
from tests.inmemory import InMemoryProcess

OPENAI, ADMIN, ENGINE = 14000, 14001, 14010

#: (node, engine, models): "shared" is served by a llama.cpp and an Ollama node.
NODES: tuple[tuple[str, str, list[str]], ...] = (
    ("lc", "llamacpp", ["shared"]),
    ("lm", "lmstudio", ["qwen2.5-7b-instruct"]),
    ("ol", "ollama", ["llama3:latest", "shared:latest"]),
    ("om", "ollama", []),
)


class Fleetwide(InMemoryProcess):
    """Only ``[facades.openai]``, and one node per :data:`NODES` entry, each its own sim."""

    def __init__(self, tmp_path: Path, studio_cors: bool = False) -> None:
        """:param studio_cors: LM Studio's "Enable CORS" setting (off by default, as LM
        Studio's is)."""
        reactor = MemoryReactorClock()
        sims: dict[str, SimEngine] = {}
        for index, (node, engine, models) in enumerate(NODES):
            cors = studio_cors if engine == "lmstudio" else None
            sims[node] = SimEngine(reactor, engine, models=models, node=node, cors=cors)
            sims[node].listen(ENGINE + index)
        self.by_node = sims
        fleet = Fleet(
            60.0,
            {"openai": FacadeSpec(OPENAI, ())},
            tuple(
                FleetNode(node, {engine: f"http://127.0.0.1:{ENGINE + index}"})
                for index, (node, engine, _) in enumerate(NODES)
            ),
        )
        super().__init__(
            tmp_path, reactor, fleet, list(sims.values()), admin_port=ADMIN, access_log=True
        )
        self.service.startService()
        self.run()  # every node's first poll

    def ask(
        self, method: str, path: str, body: object = None, headers: str = ""
    ) -> tuple[int, dict[str, str], Any]:
        """One request to the openai facade: its status, headers (lower-case) and JSON body.

        :param headers: more header lines, each ending in CRLF.
        """
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}"
        head += f"Content-Length: {len(payload)}"
        client = self.client(head.encode() + b"\r\n\r\n" + payload)
        raw_head, _, raw_body = client.data.partition(b"\r\n\r\n")
        status_line, *lines = raw_head.decode().split("\r\n")
        answered = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines)}
        if answered.get("transfer-encoding") == "chunked":
            raw_body = _unchunked(raw_body)
        return int(status_line.split()[1]), answered, json.loads(raw_body) if raw_body else None

    def status(self) -> Any:
        client = self.client(b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n", port=ADMIN)
        return json.loads(_unchunked(client.data.partition(b"\r\n\r\n")[2]))


def _unchunked(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        length = int(size, 16)
        if not length:
            break
        out, body = out + rest[:length], rest[length + 2 :]
    return out


def chat(model: str | None) -> dict[str, object]:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    return body


@pytest.fixture
def fleet(tmp_path: Path) -> Fleetwide:
    return Fleetwide(tmp_path)


def test_only_the_openai_facade_listens_and_every_engine_is_polled(fleet: Fleetwide) -> None:
    """``[facades.openai]`` alone: one listener, and every node of every engine in discovery
    (docs/openai-facade.md#the-fleet-file)."""
    assert set(fleet.service.facades.facades) == {"openai"}
    nodes = fleet.status()["nodes"]
    assert {
        engine: [(n["id"], n["state"]) for n in listed] for engine, listed in nodes.items()
    } == {
        "llamacpp": [("lc", "up")],
        "lmstudio": [("lm", "up")],
        "ollama": [("ol", "up"), ("om", "up")],
    }


@pytest.mark.parametrize(
    ("model", "node"),
    [("qwen2.5-7b-instruct", "lm"), ("llama3:latest", "ol"), ("llama3", "ol"), ("shared", "lc")],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_model_goes_to_its_owner_on_the_same_path(
    fleet: Fleetwide, model: str, node: str, path: str
) -> None:
    """Owners are the nodes of any engine that list the model, compared as that engine compares
    names (Ollama's ``llama3`` is ``llama3:latest``); the request goes to the same path on the
    owner's engine, its body unchanged (docs/openai-facade.md#owners)."""
    body = chat(model) if path == "/v1/chat/completions" else {"model": model, "prompt": "hi"}
    status, headers, answer = fleet.ask("POST", path, body)
    assert (status, headers["x-nvpair-node"]) == (200, node)
    received = fleet.by_node[node].requests[-1]
    assert (received.path, received.json()) == (path, body)
    assert "Hello from " + node in json.dumps(answer)


def test_embeddings_go_to_the_owner_too(fleet: Fleetwide) -> None:
    status, headers, answer = fleet.ask(
        "POST", "/v1/embeddings", {"model": "qwen2.5-7b-instruct", "input": "hi"}
    )
    assert (status, headers["x-nvpair-node"], answer["object"]) == (200, "lm", "list")


def test_a_model_two_engines_serve_fails_over_from_one_engine_to_the_other(
    fleet: Fleetwide,
) -> None:
    """``shared`` is llama.cpp's ``lc`` (first: node id) and Ollama's ``ol``: a 503 from ``lc``
    moves the request to ``ol`` (docs/openai-facade.md#failover), and the workload's engine
    is that of the node that served it; the facade is ``openai`` in ``/status``."""
    fleet.by_node["lc"].faults.status = 503
    globalLogPublisher.addObserver(fleet.service.observer)
    try:
        status, headers, answer = fleet.ask("POST", "/v1/chat/completions", chat("shared"))
    finally:
        globalLogPublisher.removeObserver(fleet.service.observer)
    assert (status, headers["x-nvpair-node"]) == (200, "ol")
    assert answer["choices"][0]["message"]["content"] == "Hello from ol."
    assert [r.path for r in fleet.by_node["lc"].requests if r.method == "POST"] == [
        "/v1/chat/completions"
    ]
    document = fleet.status()
    assert document["facades"] == {"openai": {"port": OPENAI, "aliases": [], "tls": False}}
    [recent] = document["recent"]
    assert (recent["engine"], recent["model"], recent["state"]) == ("ollama", "shared", "completed")
    assert [(a["node"], a["result"], a["status"]) for a in recent["attempts"]] == [
        ("lc", "status", 503),
        ("ol", "served", 200),
    ]
    # The access log names the facade, and the node whose answer the client got with its
    # engine (docs/openai-facade.md#what-an-operator-sees).
    [line] = [r for r in fleet.log_lines() if r["msg"] == "POST /v1/chat/completions 200"]
    assert (line["facade"], line["engine"], line["node"], line["attempts"]) == (
        "openai",
        "ollama",
        "ol",
        2,
    )


def test_the_model_list_merges_every_engine_in_candidate_order(fleet: Fleetwide) -> None:
    """``GET /v1/models``: each node's OpenAI list, merged ``data`` by ``id`` in node order
    (``lc``, ``lm``, ``ol``, ``om``); the empty Ollama node's ``"data": null`` is an empty list
    (docs/openai-facade.md#models)."""
    status, headers, answer = fleet.ask("GET", "/v1/models")
    assert status == 200 and "x-nvpair-error" not in headers
    assert answer["object"] == "list"
    assert [entry["id"] for entry in answer["data"]] == [
        "shared",
        "qwen2.5-7b-instruct",
        "llama3:latest",
        "shared:latest",
    ]
    assert {node: [r.path for r in sim.requests][-1] for node, sim in fleet.by_node.items()} == {
        node: "/v1/models" for node in fleet.by_node
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/tags"),
        ("POST", "/api/chat"),
        ("POST", "/completion"),
        ("GET", "/v1/models/shared"),
        ("POST", "/v1/messages"),
        ("GET", "/v1/chat/completions"),
        ("GET", "/"),
    ],
)
def test_anything_else_is_404_not_found_in_openai_s_envelope(
    fleet: Fleetwide, method: str, path: str
) -> None:
    """docs/openai-facade.md#routes: nothing is forwarded, no node asked."""
    before = {node: len(sim.requests) for node, sim in fleet.by_node.items()}
    status, headers, answer = fleet.ask(method, path, chat("shared") if method == "POST" else None)
    assert (status, headers["x-nvpair-error"]) == (404, "not-found")
    assert answer == {
        "error": {
            "message": "this endpoint serves no such route",
            "type": "nvpair_proxy",
            "code": "not-found",
        }
    }
    assert {node: len(sim.requests) for node, sim in fleet.by_node.items()} == before


def test_a_body_without_a_model_is_model_missing(fleet: Fleetwide) -> None:
    """Every engine's node is asked for the model by name: none named, none asked."""
    status, headers, _ = fleet.ask("POST", "/v1/chat/completions", chat(None))
    assert (status, headers["x-nvpair-error"]) == (400, "model-missing")


def test_a_model_nobody_lists_is_no_owner(fleet: Fleetwide) -> None:
    status, headers, answer = fleet.ask("POST", "/v1/chat/completions", chat("mistral"))
    assert (status, headers["x-nvpair-error"]) == (502, "no-owner")
    assert answer["error"]["message"] == 'no node advertises model "mistral"'


def test_metrics_name_the_facade_openai_and_each_node_by_its_engine(fleet: Fleetwide) -> None:
    """Requests are counted under the facade (``openai``), attempts and nodes under the
    engine of the node (docs/openai-facade.md#what-an-operator-sees)."""
    fleet.by_node["lc"].faults.status = 503
    assert fleet.ask("POST", "/v1/chat/completions", chat("shared"))[0] == 200
    client = fleet.client(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n", port=ADMIN)
    lines = set(client.data.decode().splitlines())
    assert {
        'nvpair_requests_total{engine="openai",outcome="served",route="inference"} 1.0',
        'nvpair_attempts_total{engine="llamacpp",node="lc",result="status"} 1.0',
        'nvpair_attempts_total{engine="ollama",node="ol",result="served"} 1.0',
        'nvpair_failovers_total{engine="openai"} 1.0',
        'nvpair_facade_up{engine="openai"} 1.0',
        f'nvpair_facade_port{{engine="openai"}} {OPENAI}.0',
        'nvpair_discovery_nodes{engine="ollama"} 2.0',
        'nvpair_discovery_nodes{engine="lmstudio"} 1.0',
        'nvpair_discovery_nodes{engine="llamacpp"} 1.0',
    } <= lines
    assert not any('nvpair_discovery_nodes{engine="openai"}' in line for line in lines)


PREFLIGHT = "Origin: http://localhost:5173\r\nAccess-Control-Request-Method: POST\r\n"


@pytest.mark.parametrize(
    ("studio_cors", "status", "allowed"),
    [(True, 204, "http://localhost:5173"), (False, 200, None)],
)
def test_a_preflight_is_what_every_engine_s_nodes_grant(
    tmp_path: Path, studio_cors: bool, status: int, allowed: str | None
) -> None:
    """CORS as the llama.cpp facade's, over every engine's nodes (docs/openai-facade.md#browsers):
    Ollama allows a localhost origin, llama.cpp reflects any; LM Studio with CORS on allows
    it too, and the preflight is granted; with CORS off (its default) LM Studio's bare 200 is
    the answer, a denial."""
    fleet = Fleetwide(tmp_path, studio_cors=studio_cors)
    answer, headers, _ = fleet.ask("OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
    assert (answer, headers.get("access-control-allow-origin")) == (status, allowed)
    assert "x-nvpair-error" not in headers
    assert {node: sim.requests[-1].method for node, sim in fleet.by_node.items()} == {
        node: "OPTIONS" for node in fleet.by_node
    }
