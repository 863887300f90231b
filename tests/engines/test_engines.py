"""The engine registry: route classes, error envelopes, inventories
(docs/README.md#adding-an-engine)."""

from __future__ import annotations

import json

import pytest

from nvpair.common.reasons import Reason
from nvpair.engines.table import (
    ENGINES,
    FACADES,
    LLAMACPP,
    LMSTUDIO,
    OLLAMA,
    OPENAI,
    RouteClass,
    served_engines,
)


@pytest.mark.parametrize(
    ("engine", "method", "path", "expected"),
    [
        (OLLAMA, b"POST", "/api/chat", RouteClass.INFERENCE),
        (OLLAMA, b"POST", "/api/generate", RouteClass.INFERENCE),
        (OLLAMA, b"POST", "/v1/chat/completions", RouteClass.INFERENCE),
        (OLLAMA, b"POST", "/v1/messages", RouteClass.INFERENCE),
        (OLLAMA, b"GET", "/api/chat", RouteClass.OTHER),
        (OLLAMA, b"POST", "/api/chat/", RouteClass.OTHER),
        (OLLAMA, b"GET", "/api/tags", RouteClass.INVENTORY),
        (OLLAMA, b"HEAD", "/api/tags", RouteClass.INVENTORY),
        (OLLAMA, b"GET", "/api/ps", RouteClass.INVENTORY),
        (OLLAMA, b"GET", "/v1/models", RouteClass.INVENTORY),
        (OLLAMA, b"POST", "/api/pull", RouteClass.OTHER),
        (OLLAMA, b"DELETE", "/api/delete", RouteClass.OTHER),
        (LMSTUDIO, b"POST", "/api/v1/chat", RouteClass.INFERENCE),
        (LMSTUDIO, b"POST", "/api/v0/completions", RouteClass.INFERENCE),
        (LMSTUDIO, b"GET", "/api/v1/models", RouteClass.INVENTORY),
        (LMSTUDIO, b"HEAD", "/v1/models", RouteClass.OTHER),
        (LMSTUDIO, b"POST", "/api/generate", RouteClass.OTHER),
        (LLAMACPP, b"POST", "/completion", RouteClass.INFERENCE),
        (LLAMACPP, b"POST", "/v1/rerank", RouteClass.INFERENCE),
        (LLAMACPP, b"POST", "/infill", RouteClass.INFERENCE),
        (LLAMACPP, b"GET", "/models", RouteClass.INVENTORY),
        (LLAMACPP, b"GET", "/health", RouteClass.OTHER),
        (LLAMACPP, b"POST", "/tokenize", RouteClass.OTHER),
        (OPENAI, b"POST", "/v1/chat/completions", RouteClass.INFERENCE),
        (OPENAI, b"POST", "/v1/completions", RouteClass.INFERENCE),
        (OPENAI, b"POST", "/v1/embeddings", RouteClass.INFERENCE),
        (OPENAI, b"POST", "/v1/responses", RouteClass.INFERENCE),
        (OPENAI, b"GET", "/v1/models", RouteClass.INVENTORY),
        (OPENAI, b"HEAD", "/v1/models", RouteClass.OTHER),
        (OPENAI, b"POST", "/v1/messages", RouteClass.OTHER),
        (OPENAI, b"POST", "/chat/completions", RouteClass.OTHER),
        (OPENAI, b"GET", "/api/tags", RouteClass.OTHER),
    ],
)
def test_route_classes(engine: object, method: bytes, path: str, expected: RouteClass) -> None:
    """Exact paths, methods as listed; everything else is "other"."""
    assert engine.classify(method, path) is expected  # type: ignore[attr-defined]


def test_ports_and_port_files() -> None:
    """The ports table (docs/ports.md#per-engine-ports)."""
    table = {
        e.id: (e.own_port, e.relocated_port, e.standalone_port, e.port_file)
        for e in ENGINES.values()
    }
    assert table == {
        "ollama": (11434, 11435, 11435, "proxy-port.json"),
        "lmstudio": (1234, 1235, 1234, "lmstudio-proxy-port.json"),
        "llamacpp": (8080, 8081, 8080, "llamacpp-proxy-port.json"),
    }


def test_error_body_dialects() -> None:
    """Ollama native routes say {"error": msg}; everything else OpenAI's envelope."""
    assert json.loads(OLLAMA.error_body("/api/chat", "m", Reason.NO_OWNER)) == {"error": "m"}
    openai = {"error": {"message": "m", "type": "nvpair_proxy", "code": "no-owner"}}
    assert json.loads(OLLAMA.error_body("/v1/chat/completions", "m", Reason.NO_OWNER)) == openai
    assert json.loads(LMSTUDIO.error_body("/api/v0/models", "m", Reason.NO_OWNER)) == openai
    assert json.loads(LLAMACPP.error_body("/completion", "m", Reason.NO_OWNER)) == openai


def test_ollama_model_keys_normalize_and_others_match_exactly() -> None:
    assert OLLAMA.model_key("Llama3") == OLLAMA.model_key("library/llama3:latest")
    assert OLLAMA.model_display("llama3") == "llama3:latest"
    assert LMSTUDIO.model_key("Qwen") != LMSTUDIO.model_key("qwen")
    assert LLAMACPP.model_key("tiny:latest") != LLAMACPP.model_key("tiny")


def test_inventory_models_from_each_poll_envelope() -> None:
    assert OLLAMA.inventory_models({"models": [{"name": "llama3:latest"}]}) == ["llama3:latest"]
    assert OLLAMA.inventory_models({"models": []}) == []
    assert LMSTUDIO.inventory_models({"object": "list", "data": [{"id": "q"}]}) == ["q"]
    assert LLAMACPP.inventory_models({"models": [], "data": [{"id": "tiny"}]}) == ["tiny"]
    assert LLAMACPP.inventory_models({"object": "list", "data": None}) == []
    assert OLLAMA.inventory_models(["not", "an", "envelope"]) is None
    assert OLLAMA.inventory_models({"models": [{"model": "no name"}]}) is None
    assert LMSTUDIO.inventory_models({"data": "x"}) is None


def test_the_openai_facade_is_a_dialect_of_its_own_over_every_engine() -> None:
    """docs/openai-facade.md: OpenAI's envelope on every route, every engine's nodes, nothing
    forwarded outside its routes, port 4000; no engine of its own (never polled, never named
    in a broker's ``facade/enable``)."""
    assert FACADES == {**ENGINES, "openai": OPENAI} and "openai" not in ENGINES
    assert (OPENAI.standalone_port, OPENAI.port_file) == (4000, "openai-proxy-port.json")
    assert OPENAI.serves == ("ollama", "lmstudio", "llamacpp") and OPENAI.spans_engines
    assert not OPENAI.forwards_other and not OPENAI.host_guard and OPENAI.model_required
    assert all(e.serves == (e.id,) and not e.spans_engines for e in ENGINES.values())
    openai = {"error": {"message": "m", "type": "nvpair_proxy", "code": "not-found"}}
    assert json.loads(OPENAI.error_body("/api/tags", "m", Reason.NOT_FOUND)) == openai
    # Names compare exactly at the facade: each engine keys them its own way for its nodes.
    assert OPENAI.model_key("Llama3") == "Llama3"


@pytest.mark.parametrize(
    ("facades", "engines"),
    [
        (["llamacpp", "ollama"], ("ollama", "llamacpp")),
        (["openai"], ("ollama", "lmstudio", "llamacpp")),
        (["lmstudio", "openai"], ("ollama", "lmstudio", "llamacpp")),
        ([], ()),
    ],
)
def test_the_engines_a_set_of_facades_reaches(facades: list[str], engines: tuple[str]) -> None:
    assert served_engines(facades) == engines
