# -*- test-case-name: tests.sim.test_sim -*-
"""The simulated engines (``nvpair.sim``) over real loopback sockets: each dialect's answers as
the engines give them, CORS, every fault knob, the real client SDKs, and the runner.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from typing import Protocol as TypingProtocol

import attrs
import ollama
import openai
import pytest
import pytest_twisted
import treq
from treq.testing import RequestTraversalAgent
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.interfaces import IConsumer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseFailed
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IBodyProducer, IResponse
from twisted.web.resource import IResource
from zope.interface import implementer

from nvpair.sim import Faults, SimEngine

Start = Callable[..., SimEngine]
REPO = Path(__file__).resolve().parents[2]

# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture
def start() -> Iterator[Start]:
    """Make listening engines; every one is stopped (connections aborted) after the test."""
    engines: list[SimEngine] = []

    def make(dialect: str, models: Sequence[str] = ("m1",), **kwargs: Any) -> SimEngine:
        engine = SimEngine(reactor, dialect, models=models, **kwargs)
        engine.listen()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        pytest_twisted.blockon(engine.stop())


@attrs.frozen
class Got:
    """A whole HTTP response (``length``: the announced Content-Length, ``None`` when chunked;
    Twisted keeps that header out of ``headers``)."""

    status: int
    headers: dict[str, list[str]]
    body: bytes
    length: int | None

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)

    def lines(self) -> list[Any]:
        """The NDJSON records."""
        return [json.loads(line) for line in self.body.splitlines() if line]

    def events(self) -> list[tuple[str | None, str]]:
        """The SSE events as (event name, data)."""
        found: list[tuple[str | None, str]] = []
        for block in self.body.decode().split("\n\n"):
            if not block:
                continue
            name, data = None, ""
            for line in block.split("\n"):
                field, _, value = line.partition(": ")
                if field == "event":
                    name = value
                elif field == "data":
                    data = value
            found.append((name, data))
        return found

    def data(self) -> list[Any]:
        """The JSON of each SSE ``data:`` except ``[DONE]``."""
        return [json.loads(data) for _, data in self.events() if data != "[DONE]"]


def _client() -> treq.client.HTTPClient:
    # A fresh non-persistent pool: no connection outlives its request, whatever a test aborts.
    return treq.client.HTTPClient(
        Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))
    )


def _headers(response: IResponse) -> dict[str, list[str]]:
    return {
        name.decode().lower(): [v.decode() for v in values]
        for name, values in response.headers.getAllRawHeaders()
    }


async def send(
    method: str,
    url: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> IResponse:
    """Send a request; fires with the response once its headers are in."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    sent = Headers({k: [v] for k, v in (headers or {}).items()})
    response: IResponse = await _client().request(method, url, data=data, headers=sent)
    return response


async def fetch(
    method: str,
    url: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Got:
    """Send a request and read the whole response."""
    response = await send(method, url, body, raw=raw, headers=headers)
    content: bytes = await treq.content(response)
    length = None if response.length is UNKNOWN_LENGTH else int(response.length)
    return Got(response.code, _headers(response), content, length)


async def pieces(response: IResponse) -> list[tuple[float, bytes]]:
    """Read a body, noting when each piece arrived."""
    got: list[tuple[float, bytes]] = []
    await treq.collect(response, lambda data: got.append((reactor.seconds(), data)))
    return got


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    """Wait until ``check()`` holds (polling), failing after ``timeout`` seconds."""
    deadline = reactor.seconds() + timeout
    while not check():
        assert reactor.seconds() < deadline, "condition not reached in time"
        await sleep(0.01)


class RawClient(Protocol):
    """A bare TCP client: sends one request, keeps whatever comes back, notes how it ended."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.received = b""
        self.reason: Failure | None = None
        self.ended: Deferred[None] = Deferred()

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.reason = reason
        self.ended.callback(None)


async def raw_connect(engine: SimEngine, path: str, body: object) -> RawClient:
    data = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{engine.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    client = RawClient(request)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", engine.port), client)
    return client


CHAT = {"role": "user", "content": "why is the sky blue"}  # 5 prompt tokens

# -- Ollama ---------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_ollama_generate_streams_ndjson_with_exact_metrics(start: Start) -> None:
    """/api/generate streams by default: one NDJSON line per token, then a done line whose
    durations are fixed nanosecond figures derived from the token counts."""
    engine = start("ollama", ["llama3:latest"], node="node-a")
    got = await fetch("POST", engine.url + "/api/generate", {"model": "llama3", "prompt": "a b c"})
    assert got.status == 200
    assert got.header("content-type") == "application/x-ndjson"
    assert got.length is None
    lines = got.lines()
    assert [line["response"] for line in lines] == ["Hello", " from", " node-a", ".", ""]
    assert all(line["model"] == "llama3" and not line["done"] for line in lines[:-1])
    final = lines[-1]
    assert final["done"] is True
    assert final["done_reason"] == "stop"
    assert final["prompt_eval_count"] == 3
    assert final["eval_count"] == 4
    assert final["eval_duration"] == 4 * 20_000_000
    assert final["prompt_eval_duration"] == 3 * 1_000_000
    assert final["load_duration"] == 1_000_000
    assert final["total_duration"] == 1_000_000 + 3_000_000 + 80_000_000
    assert final["context"] == list(range(1, 8))


@pytest_twisted.ensureDeferred
async def test_ollama_chat_non_stream_and_load(start: Start) -> None:
    """/api/chat with stream:false is one object with the whole message; no messages only loads
    the model (done_reason load, or unload with keep_alive 0)."""
    engine = start("ollama", ["llama3:latest"], node="n1")
    body = {"model": "llama3", "messages": [CHAT], "stream": False}
    got = await fetch("POST", engine.url + "/api/chat", body)
    answer = got.json()
    assert got.header("content-type") == "application/json; charset=utf-8"
    assert answer["message"] == {"role": "assistant", "content": "Hello from n1."}
    assert (answer["done"], answer["done_reason"]) == (True, "stop")
    assert (answer["prompt_eval_count"], answer["eval_count"]) == (5, 4)

    load = await fetch("POST", engine.url + "/api/chat", {"model": "llama3", "messages": []})
    assert load.json()["done_reason"] == "load"
    unload = {"model": "llama3", "messages": [], "keep_alive": 0}
    assert (await fetch("POST", engine.url + "/api/chat", unload)).json()["done_reason"] == "unload"


@pytest_twisted.ensureDeferred
async def test_ollama_token_limit_truncates(start: Start) -> None:
    """options.num_predict cuts the completion short: done_reason length, eval_count = limit."""
    engine = start("ollama", ["llama3"])
    body = {"model": "llama3", "prompt": "x", "stream": False, "options": {"num_predict": 2}}
    answer = (await fetch("POST", engine.url + "/api/generate", body)).json()
    assert (answer["response"], answer["done_reason"], answer["eval_count"]) == (
        "Hello from",
        "length",
        2,
    )


@pytest_twisted.ensureDeferred
async def test_ollama_model_names_fold_case_and_default_latest(start: Start) -> None:
    """Names match case-insensitively with the library namespace and :latest tag defaulted; the
    answer echoes the name as sent; an unknown name is a 404 naming it exactly."""
    engine = start("ollama", ["llama3:latest"])
    for name in ("LLAMA3", "library/llama3:latest", "registry.ollama.ai/library/Llama3"):
        got = await fetch("POST", engine.url + "/api/generate", {"model": name, "prompt": "x"})
        assert got.status == 200
        assert got.lines()[0]["model"] == name
    missing = await fetch("POST", engine.url + "/api/chat", {"model": "llama3:8b", "messages": []})
    assert (missing.status, missing.json()) == (404, {"error": "model 'llama3:8b' not found"})
    bad = await fetch("POST", engine.url + "/api/chat", {"model": "m@d", "messages": []})
    assert (bad.status, bad.json()) == (400, {"error": "invalid model name"})
    none = await fetch("POST", engine.url + "/api/chat", {"messages": []})
    assert (none.status, none.json()) == (400, {"error": "model is required"})


@pytest_twisted.ensureDeferred
async def test_ollama_lists_and_empty_envelopes(start: Start) -> None:
    """/api/tags lists newest first with display names; /v1/models is the OpenAI list; emptied,
    they are {"models":[]} and {"object":"list","data":null}; changes show immediately."""
    engine = start("ollama", ["llama3", "user/qwen2:7b"])
    tags = (await fetch("GET", engine.url + "/api/tags")).json()
    names = [m["name"] for m in tags["models"]]
    assert names == ["llama3:latest", "user/qwen2:7b"]
    stamps = [m["modified_at"] for m in tags["models"]]
    assert stamps == sorted(stamps, reverse=True)
    first = tags["models"][0]
    assert set(first) == {"name", "model", "modified_at", "size", "digest", "details"}
    assert first["details"]["format"] == "gguf"
    v1 = (await fetch("GET", engine.url + "/v1/models")).json()
    assert v1["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in v1["data"]] == [
        ("llama3:latest", "model", "library"),
        ("user/qwen2:7b", "model", "user"),
    ]
    ps = (await fetch("GET", engine.url + "/api/ps")).json()
    assert [m["name"] for m in ps["models"]] == names

    engine.models.clear()
    assert (await fetch("GET", engine.url + "/api/tags")).json() == {"models": []}
    assert (await fetch("GET", engine.url + "/api/ps")).json() == {"models": []}
    assert (await fetch("GET", engine.url + "/v1/models")).body == b'{"object":"list","data":null}'
    engine.models.append("phi3")
    tags = (await fetch("GET", engine.url + "/api/tags")).json()
    assert [m["name"] for m in tags["models"]] == ["phi3:latest"]


@pytest_twisted.ensureDeferred
async def test_ollama_head_tags_has_no_body(start: Start) -> None:
    """HEAD /api/tags answers like GET without a body."""
    engine = start("ollama", ["llama3"])
    got = await fetch("HEAD", engine.url + "/api/tags")
    assert got.status == 200
    assert got.body == b""


@pytest_twisted.ensureDeferred
async def test_ollama_v1_chat_stream_with_usage(start: Start) -> None:
    """/v1/chat/completions streams OpenAI SSE: role on the first chunk, a finish chunk, the
    usage chunk (choices []) only with include_usage, then [DONE]."""
    engine = start("ollama", ["llama3"], node="n2")
    body = {
        "model": "llama3",
        "messages": [CHAT],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = await fetch("POST", engine.url + "/v1/chat/completions", body)
    assert got.header("content-type") == "text/event-stream"
    assert got.events()[-1] == (None, "[DONE]")
    chunks = got.data()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hello"}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] == [" from", " n2", "."]
    assert chunks[4]["choices"][0]["finish_reason"] == "stop"
    assert chunks[5]["choices"] == []
    assert chunks[5]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert {c["system_fingerprint"] for c in chunks} == {"fp_ollama"}
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["object"] == "chat.completion.chunk"

    del body["stream_options"]
    plain = (await fetch("POST", engine.url + "/v1/chat/completions", body)).data()
    assert all("usage" not in c for c in plain)
    assert len(plain) == 5


@pytest_twisted.ensureDeferred
async def test_ollama_v1_completions_zero_usage_quirk(start: Start) -> None:
    """Ollama's /v1/completions with include_usage puts an all-zero usage on every chunk, then
    the real usage chunk."""
    engine = start("ollama", ["llama3"])
    body = {
        "model": "llama3",
        "prompt": "one two",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = (await fetch("POST", engine.url + "/v1/completions", body)).data()
    zero = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert all(c["usage"] == zero for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert chunks[0]["id"].startswith("cmpl-")


@pytest_twisted.ensureDeferred
async def test_ollama_v1_non_stream_body(start: Start) -> None:
    """/v1/chat/completions defaults to one chat.completion body with exact usage."""
    engine = start("ollama", ["llama3"], node="n3")
    body = {"model": "llama3", "messages": [CHAT]}
    answer = (await fetch("POST", engine.url + "/v1/chat/completions", body)).json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "llama3"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello from n3."}
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}


@pytest_twisted.ensureDeferred
async def test_ollama_errors(start: Start) -> None:
    """Native errors are {"error": text}, /v1 errors OpenAI-shaped; unknown paths are gin's plain
    404, a wrong method on a known path 405."""
    engine = start("ollama", ["llama3"])
    bad = await fetch("POST", engine.url + "/api/chat", raw=b"nope")
    assert bad.status == 400
    assert bad.json() == {"error": "invalid character 'n' looking for beginning of value"}
    empty = await fetch("POST", engine.url + "/api/generate", raw=b"")
    assert (empty.status, empty.json()) == (400, {"error": "missing request body"})
    v1 = await fetch("POST", engine.url + "/v1/chat/completions", {"model": "nope", "messages": []})
    assert v1.status == 404
    assert v1.json() == {
        "error": {
            "message": "model 'nope' not found",
            "type": "not_found_error",
            "param": None,
            "code": None,
        }
    }
    unknown = await fetch("GET", engine.url + "/api/nothing")
    assert (unknown.status, unknown.body) == (404, b"404 page not found")
    assert unknown.header("content-type") == "text/plain; charset=utf-8"
    wrong = await fetch("GET", engine.url + "/api/chat")
    assert wrong.status == 405


@pytest_twisted.ensureDeferred
async def test_ollama_management_routes(start: Start) -> None:
    """/, /api/version, /api/show, /api/pull (NDJSON status lines, adds the model), DELETE
    /api/delete (200 empty body, removes it), /api/copy."""
    engine = start("ollama", ["llama3"])
    root = await fetch("GET", engine.url + "/")
    assert (root.status, root.body) == (200, b"Ollama is running")
    assert "version" in (await fetch("GET", engine.url + "/api/version")).json()
    show = await fetch("POST", engine.url + "/api/show", {"name": "llama3"})
    assert show.json()["details"]["family"] == "llama"

    pull = await fetch("POST", engine.url + "/api/pull", {"model": "qwen2:7b"})
    assert pull.header("content-type") == "application/x-ndjson"
    assert [line["status"] for line in pull.lines()][-1] == "success"
    assert engine.models == ["qwen2:7b", "llama3"]

    copy = await fetch("POST", engine.url + "/api/copy", {"source": "llama3", "destination": "l2"})
    assert (copy.status, engine.models[0]) == (200, "l2:latest")

    deleted = await fetch("DELETE", engine.url + "/api/delete", {"model": "LLAMA3:latest"})
    assert (deleted.status, deleted.body) == (200, b"")
    assert engine.models == ["l2:latest", "qwen2:7b"]
    again = await fetch("DELETE", engine.url + "/api/delete", {"model": "llama3"})
    assert (again.status, again.json()) == (404, {"error": "model 'llama3' not found"})


@pytest_twisted.ensureDeferred
async def test_ollama_embeddings(start: Start) -> None:
    """/api/embed, /api/embeddings and /v1/embeddings give one deterministic vector per input."""
    engine = start("ollama", ["nomic-embed-text"])
    body = {"model": "nomic-embed-text", "input": ["a b", "c"]}
    embed = (await fetch("POST", engine.url + "/api/embed", body)).json()
    assert len(embed["embeddings"]) == 2
    assert embed["prompt_eval_count"] == 3
    legacy = {"model": "nomic-embed-text", "prompt": "a b"}
    single = (await fetch("POST", engine.url + "/api/embeddings", legacy)).json()
    assert single["embedding"] == embed["embeddings"][0]
    v1 = (await fetch("POST", engine.url + "/v1/embeddings", body)).json()
    assert [d["embedding"] for d in v1["data"]] == embed["embeddings"]
    assert v1["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


# -- LM Studio ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_lmstudio_model_lists(start: Start) -> None:
    """/v1/models, /api/v0/models and /api/v1/models envelopes, and their empty forms."""
    engine = start("lmstudio", ["qwen/qwen3-8b", "meta-llama-3.1-8b-instruct"])
    v1 = (await fetch("GET", engine.url + "/v1/models")).json()
    assert v1 == {
        "data": [
            {"id": "qwen/qwen3-8b", "object": "model", "owned_by": "organization_owner"},
            {
                "id": "meta-llama-3.1-8b-instruct",
                "object": "model",
                "owned_by": "organization_owner",
            },
        ],
        "object": "list",
    }
    v0 = (await fetch("GET", engine.url + "/api/v0/models")).json()
    assert v0["object"] == "list"
    assert v0["data"][0]["publisher"] == "qwen"
    assert v0["data"][0]["state"] == "loaded"
    one = (await fetch("GET", engine.url + "/api/v0/models/qwen/qwen3-8b")).json()
    assert one["id"] == "qwen/qwen3-8b"
    rest = (await fetch("GET", engine.url + "/api/v1/models")).json()
    assert [m["key"] for m in rest["models"]] == engine.models
    assert rest["models"][0]["type"] == "llm"

    engine.models.clear()
    assert (await fetch("GET", engine.url + "/v1/models")).json() == {"data": [], "object": "list"}
    empty_v0 = (await fetch("GET", engine.url + "/api/v0/models")).json()
    assert empty_v0 == {"object": "list", "data": []}
    assert (await fetch("GET", engine.url + "/api/v1/models")).json() == {"models": []}


@pytest_twisted.ensureDeferred
async def test_lmstudio_chat_stream_and_body(start: Start) -> None:
    """OpenAI chat: a role chunk, one chunk per token, a finish chunk, the usage chunk with
    include_usage, [DONE]; non-streamed the body has exact usage and the real model id."""
    engine = start("lmstudio", ["qwen/qwen3-8b"], node="lm")
    body = {
        "model": "whatever",
        "messages": [CHAT],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = await fetch("POST", engine.url + "/v1/chat/completions", body)
    chunks = got.data()
    assert got.events()[-1] == (None, "[DONE]")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello from lm."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert {c["model"] for c in chunks} == {"qwen/qwen3-8b"}

    plain = {"model": "whatever", "messages": [CHAT]}
    answer = (await fetch("POST", engine.url + "/v1/chat/completions", plain)).json()
    assert answer["model"] == "qwen/qwen3-8b"
    assert answer["choices"][0]["message"]["content"] == "Hello from lm."
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert "stats" not in answer


@pytest_twisted.ensureDeferred
async def test_lmstudio_v0_adds_stats(start: Start) -> None:
    """/api/v0/chat/completions adds stats computed from the fixed simulated speeds."""
    engine = start("lmstudio", ["m"])
    body = {"model": "m", "messages": [CHAT]}
    answer = (await fetch("POST", engine.url + "/api/v0/chat/completions", body)).json()
    assert answer["stats"] == {
        "tokens_per_second": 50.0,
        "time_to_first_token": 0.005,
        "generation_time": 0.08,
        "stop_reason": "eosFound",
    }
    assert answer["usage"]["total_tokens"] == 9
    assert answer["model_info"]["format"] == "gguf"


@pytest_twisted.ensureDeferred
async def test_lmstudio_rest_v1_chat_events(start: Start) -> None:
    """/api/v1/chat streams named SSE events from chat.start to chat.end, whose result (like the
    non-streamed answer) carries the stats."""
    engine = start("lmstudio", ["m"], node="v1")
    body = {"model": "m", "input": "tell me a joke", "stream": True}
    got = await fetch("POST", engine.url + "/api/v1/chat", body)
    names = [name for name, _ in got.events()]
    assert names[0] == "chat.start"
    assert names[-1] == "chat.end"
    assert names.count("message.delta") == 4
    assert "[DONE]" not in got.body.decode()
    end = got.data()[-1]
    assert end["type"] == "chat.end"
    assert end["result"]["output"] == [{"type": "message", "content": "Hello from v1."}]
    stats = end["result"]["stats"]
    assert (stats["input_tokens"], stats["total_output_tokens"]) == (4, 4)

    del body["stream"]
    answer = (await fetch("POST", engine.url + "/api/v1/chat", body)).json()
    assert answer["output"] == end["result"]["output"]
    assert answer["response_id"].startswith("resp_")


@pytest_twisted.ensureDeferred
async def test_lmstudio_unexpected_endpoint_is_200(start: Start) -> None:
    """Unrouted paths and wrong methods get HTTP 200 with Express's "Unexpected endpoint"."""
    engine = start("lmstudio", ["m"])
    got = await fetch("POST", engine.url + "/chat/completions", {})
    assert got.status == 200
    assert got.json() == {"error": "Unexpected endpoint or method. (POST /chat/completions)"}
    wrong = await fetch("GET", engine.url + "/v1/chat/completions")
    assert wrong.status == 200
    assert wrong.json() == {"error": "Unexpected endpoint or method. (GET /v1/chat/completions)"}


@pytest_twisted.ensureDeferred
async def test_lmstudio_model_choice(start: Start) -> None:
    """With several models an unknown one is a 404 model_not_found; a known one answers; with a
    single model the requested name is ignored."""
    engine = start("lmstudio", ["a/one", "b/two"])
    chat = engine.url + "/v1/chat/completions"
    missing = await fetch("POST", chat, {"model": "x", "messages": []})
    assert missing.status == 404
    error = missing.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "model",
        "model_not_found",
    )
    assert error["message"].startswith('Model "x" not found.')
    known = await fetch("POST", chat, {"model": "b/two", "messages": []})
    assert known.json()["model"] == "b/two"

    engine.models[:] = ["solo"]
    solo = await fetch("POST", chat, {"model": "x", "messages": []})
    assert (solo.status, solo.json()["model"]) == (200, "solo")
    bad = await fetch("POST", chat, raw=b"{")
    assert bad.status == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


# -- llama.cpp ------------------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_llamacpp_health_models_props_slots(start: Start) -> None:
    """/health is ok; /models and /v1/models are the same combined object; /props and /slots."""
    engine = start("llamacpp", ["tiny"])
    assert (await fetch("GET", engine.url + "/health")).json() == {"status": "ok"}
    models = await fetch("GET", engine.url + "/models")
    v1 = await fetch("GET", engine.url + "/v1/models")
    assert models.body == v1.body
    listing = models.json()
    assert listing["object"] == "list"
    assert [m["name"] for m in listing["models"]] == ["tiny"]
    assert [(d["id"], d["owned_by"]) for d in listing["data"]] == [("tiny", "llamacpp")]
    props = (await fetch("GET", engine.url + "/props")).json()
    assert props["total_slots"] == 4  # -np auto
    slots = (await fetch("GET", engine.url + "/slots")).json()
    assert [slot["is_processing"] for slot in slots] == [False] * 4


@pytest_twisted.ensureDeferred
async def test_llamacpp_chat_stream_usage_and_timings(start: Start) -> None:
    """OpenAI chat stream: role chunk with content null, deltas, finish chunk; with include_usage
    a usage chunk carrying usage and timings; without, timings ride on the finish chunk."""
    engine = start("llamacpp", ["tiny"], node="cpp")
    body = {
        "model": "ignored",
        "messages": [CHAT],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    got = await fetch("POST", engine.url + "/v1/chat/completions", body)
    assert got.events()[-1] == (None, "[DONE]")
    chunks = got.data()
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:5]]
    assert deltas == ["Hello", " from", " cpp", "."]
    finish, usage = chunks[5], chunks[6]
    assert finish["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert "timings" not in finish
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert usage["timings"] == {
        "cache_n": 0,
        "prompt_n": 5,
        "prompt_ms": 5.0,
        "prompt_per_token_ms": 1.0,
        "prompt_per_second": 1000.0,
        "predicted_n": 4,
        "predicted_ms": 80.0,
        "predicted_per_token_ms": 20.0,
        "predicted_per_second": 50.0,
    }
    assert {c["model"] for c in chunks} == {"tiny"}

    del body["stream_options"]
    plain = (await fetch("POST", f"http://127.0.0.1:{engine.port}/chat/completions", body)).data()
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"
    assert plain[-1]["timings"]["predicted_n"] == 4
    assert all("usage" not in c for c in plain)


@pytest_twisted.ensureDeferred
async def test_llamacpp_non_stream_names_server_model(start: Start) -> None:
    """The request's model is ignored; the answer names the server's model, usage and timings."""
    engine = start("llamacpp", ["tiny"])
    body = {"model": "gpt-4", "messages": [CHAT], "max_tokens": 3}
    answer = (await fetch("POST", engine.url + "/v1/chat/completions", body)).json()
    assert answer["model"] == "tiny"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["timings"]["predicted_n"] == 3
    text = (await fetch("POST", engine.url + "/v1/completions", {"prompt": "a b"})).json()
    assert text["object"] == "text_completion"
    assert text["choices"][0]["text"] == "Hello from sim."
    assert text["usage"]["prompt_tokens"] == 2


@pytest_twisted.ensureDeferred
async def test_llamacpp_native_completion(start: Start) -> None:
    """Native /completion streams SSE without [DONE], ending with stop:true, stop_type and
    timings; non-streamed with n_predict it stops on the limit."""
    engine = start("llamacpp", ["tiny"])
    got = await fetch("POST", engine.url + "/completion", {"prompt": "a b c", "stream": True})
    assert got.header("content-type") == "text/event-stream"
    assert b"[DONE]" not in got.body
    chunks = got.data()
    assert [c["content"] for c in chunks] == ["Hello", " from", " sim", ".", ""]
    assert [c["stop"] for c in chunks] == [False] * 4 + [True]
    final = chunks[-1]
    assert final["stop_type"] == "eos"
    assert (final["tokens_predicted"], final["tokens_evaluated"]) == (4, 3)
    assert final["timings"]["prompt_n"] == 3

    limited = {"prompt": "a", "n_predict": 2}
    answer = (await fetch("POST", engine.url + "/completions", limited)).json()
    assert (answer["content"], answer["stop"], answer["stop_type"]) == ("Hello from", True, "limit")


@pytest_twisted.ensureDeferred
async def test_llamacpp_errors(start: Start) -> None:
    """Errors are {"error":{code,message,type}} with status = code: unknown path (or method) 404
    File Not Found, bad JSON 400, missing messages 400; with no model, 503 Loading model."""
    engine = start("llamacpp", ["tiny"])
    unknown = await fetch("GET", engine.url + "/api/tags")
    assert (unknown.status, unknown.json()) == (
        404,
        {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}},
    )
    assert (await fetch("GET", engine.url + "/completion")).status == 404
    bad = await fetch("POST", engine.url + "/v1/chat/completions", raw=b"nope")
    assert bad.status == 400
    assert bad.json()["error"]["message"].startswith("[json.exception.parse_error.101]")
    assert bad.json()["error"]["code"] == 400
    missing = await fetch("POST", engine.url + "/v1/chat/completions", {})
    assert missing.json()["error"]["message"] == "'messages' is required"
    engine.models.clear()
    loading = await fetch("POST", engine.url + "/v1/chat/completions", {"messages": []})
    assert (loading.status, loading.json()["error"]["type"]) == (503, "unavailable_error")


@pytest_twisted.ensureDeferred
async def test_llamacpp_embeddings_and_rerank(start: Start) -> None:
    """OpenAI and native embeddings agree; rerank orders documents by shared query words."""
    engine = start("llamacpp", ["emb"])
    v1 = (await fetch("POST", engine.url + "/v1/embeddings", {"input": "a b"})).json()
    native = (await fetch("POST", engine.url + "/embedding", {"content": "a b"})).json()
    assert native == [{"index": 0, "embedding": [v1["data"][0]["embedding"]]}]
    assert v1["model"] == "emb"
    body = {"query": "red apple", "documents": ["blue sky", "red apple pie", "apple"]}
    ranked = (await fetch("POST", engine.url + "/v1/rerank", body)).json()
    assert [r["index"] for r in ranked["results"]] == [1, 2, 0]


# -- CORS -----------------------------------------------------------------------------------------


def _cors(got: Got) -> dict[str, list[str]]:
    return {k: v for k, v in got.headers.items() if k.startswith("access-control-")}


@pytest_twisted.ensureDeferred
async def test_ollama_cors(start: Start) -> None:
    """Ollama: allowed preflight 204 with methods/headers; allowed requests get the origin
    echoed; a foreign origin is 403 with an empty body on any request; no Origin, no headers."""
    engine = start("ollama", ["llama3"])
    local = "http://localhost:5173"
    preflight_headers = {"Origin": local, "Access-Control-Request-Method": "POST"}
    preflight = await fetch("OPTIONS", engine.url + "/api/chat", headers=preflight_headers)
    assert preflight.status == 204
    assert preflight.header("access-control-allow-origin") == local
    assert "POST" in (preflight.header("access-control-allow-methods") or "").split(",")
    assert "Content-Type" in (preflight.header("access-control-allow-headers") or "").split(",")
    simple = await fetch("GET", engine.url + "/api/tags", headers={"Origin": local})
    assert simple.status == 200
    assert simple.header("access-control-allow-origin") == local
    assert "Origin" in simple.headers.get("vary", [])

    evil = {"Origin": "http://evil.example"}
    for method, path in (("GET", "/api/tags"), ("OPTIONS", "/api/chat"), ("POST", "/api/chat")):
        denied = await fetch(method, engine.url + path, {}, headers=evil)
        assert (denied.status, denied.body, _cors(denied)) == (403, b"", {})
    plain = await fetch("GET", engine.url + "/api/tags")
    assert _cors(plain) == {}
    same = await fetch("GET", engine.url + "/api/tags", headers={"Origin": engine.url})
    assert (same.status, _cors(same)) == (200, {})


@pytest_twisted.ensureDeferred
async def test_ollama_cors_extra_origins(start: Start) -> None:
    """OLLAMA_ORIGINS adds origins; with * every origin gets Access-Control-Allow-Origin: *."""
    listed = start("ollama", ["llama3"], cors=["http://app.example"])
    ok = await fetch("GET", listed.url + "/api/tags", headers={"Origin": "http://app.example"})
    assert ok.header("access-control-allow-origin") == "http://app.example"
    everyone = start("ollama", ["llama3"], cors="*")
    star = await fetch("GET", everyone.url + "/api/tags", headers={"Origin": "http://x.example"})
    assert star.header("access-control-allow-origin") == "*"


@pytest_twisted.ensureDeferred
async def test_lmstudio_cors(start: Start) -> None:
    """LM Studio: CORS off answers OPTIONS with the 200 "Unexpected endpoint" and no headers;
    with CORS on, preflight is 204 with *, methods and the requested headers, and requests get *."""
    off = start("lmstudio", ["m"])
    headers = {
        "Origin": "http://page.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization",
    }
    preflight = await fetch("OPTIONS", off.url + "/v1/chat/completions", headers=headers)
    assert preflight.status == 200
    assert preflight.json() == {
        "error": "Unexpected endpoint or method. (OPTIONS /v1/chat/completions)"
    }
    assert _cors(preflight) == {}
    simple = await fetch("GET", off.url + "/v1/models", headers={"Origin": "http://page.example"})
    assert _cors(simple) == {}

    on = start("lmstudio", ["m"], cors=True)
    preflight = await fetch("OPTIONS", on.url + "/v1/chat/completions", headers=headers)
    assert preflight.status == 204
    assert preflight.header("access-control-allow-origin") == "*"
    assert "POST" in (preflight.header("access-control-allow-methods") or "")
    assert preflight.header("access-control-allow-headers") == "content-type,authorization"
    simple = await fetch("GET", on.url + "/v1/models", headers={"Origin": "http://page.example"})
    assert simple.header("access-control-allow-origin") == "*"


@pytest_twisted.ensureDeferred
async def test_llamacpp_cors(start: Start) -> None:
    """llama.cpp reflects the Origin on every response by default; OPTIONS is a 200 empty
    text/html with credentials/methods/headers; a restricted list omits the header, never 403."""
    engine = start("llamacpp", ["tiny"])
    evil = {"Origin": "http://evil.example"}
    simple = await fetch("GET", engine.url + "/v1/models", headers=evil)
    assert simple.status == 200
    assert simple.header("access-control-allow-origin") == "http://evil.example"
    preflight = await fetch("OPTIONS", engine.url + "/v1/chat/completions", headers=evil)
    assert (preflight.status, preflight.body) == (200, b"")
    assert preflight.header("content-type") == "text/html"
    assert preflight.header("access-control-allow-origin") == "http://evil.example"
    assert preflight.header("access-control-allow-methods") == "GET, POST, DELETE, OPTIONS"
    assert preflight.header("access-control-allow-credentials") == "true"
    assert preflight.header("access-control-allow-headers") == "*"

    restricted = start("llamacpp", ["tiny"], cors=["http://ok.example"])
    other = await fetch("GET", restricted.url + "/v1/models", headers=evil)
    assert (other.status, other.header("access-control-allow-origin")) == (200, None)
    options = await fetch("OPTIONS", restricted.url + "/v1/models", headers=evil)
    assert (options.status, options.header("access-control-allow-origin")) == (200, None)
    ok = await fetch("GET", restricted.url + "/v1/models", headers={"Origin": "http://ok.example"})
    assert ok.header("access-control-allow-origin") == "http://ok.example"


# -- fault knobs ----------------------------------------------------------------------------------

INFERENCE: dict[str, tuple[str, dict[str, object]]] = {
    "ollama": ("/api/chat", {"model": "m1", "messages": [CHAT]}),
    "lmstudio": ("/v1/chat/completions", {"model": "m1", "messages": [CHAT], "stream": True}),
    "llamacpp": ("/v1/chat/completions", {"messages": [CHAT], "stream": True}),
}


@pytest.mark.parametrize(
    ("dialect", "path", "expected"),
    [
        ("ollama", "/api/chat", {"error": "simulated failure on f (HTTP 503)"}),
        (
            "ollama",
            "/v1/chat/completions",
            {
                "error": {
                    "message": "simulated failure on f (HTTP 503)",
                    "type": "api_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        (
            "lmstudio",
            "/v1/chat/completions",
            {
                "error": {
                    "message": "simulated failure on f (HTTP 503)",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        (
            "llamacpp",
            "/v1/chat/completions",
            {
                "error": {
                    "message": "simulated failure on f (HTTP 503)",
                    "type": "unavailable_error",
                    "code": 503,
                }
            },
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_status_fault_uses_dialect_error(
    start: Start, dialect: str, path: str, expected: object
) -> None:
    """Faults.status answers inference with that status and the route's error body, while
    other routes keep answering."""
    engine = start(dialect, node="f", faults=Faults(status=503))
    got = await fetch("POST", engine.url + path, {"model": "m1", "messages": [CHAT]})
    assert (got.status, got.json()) == (503, expected)
    listing = "/api/tags" if dialect == "ollama" else "/v1/models"
    assert (await fetch("GET", engine.url + listing)).status == 200


@pytest_twisted.ensureDeferred
async def test_header_delay(start: Start) -> None:
    """header_delay holds the response headers back; other routes are not delayed."""
    engine = start("ollama", faults=Faults(header_delay=0.15))
    path, body = INFERENCE["ollama"]
    began = reactor.seconds()
    response = await send("POST", engine.url + path, body)
    assert reactor.seconds() - began >= 0.15
    assert response.code == 200
    await treq.content(response)
    began = reactor.seconds()
    await fetch("GET", engine.url + "/api/tags")
    assert reactor.seconds() - began < 0.15


@pytest.mark.parametrize("stream", [True, False])
@pytest_twisted.ensureDeferred
async def test_first_byte_delay(start: Start, stream: bool) -> None:
    """first_byte_delay sends the headers at once and the first body byte after the delay,
    streamed or not."""
    engine = start("ollama", faults=Faults(first_byte_delay=0.2))
    began = reactor.seconds()
    body = {"model": "m1", "messages": [CHAT], "stream": stream}
    response = await send("POST", engine.url + "/api/chat", body)
    headers_at = reactor.seconds() - began
    got = await pieces(response)
    first_byte_at = got[0][0] - began
    assert first_byte_at >= 0.2
    assert headers_at < first_byte_at - 0.1
    assert (response.length is UNKNOWN_LENGTH) == stream


@pytest_twisted.ensureDeferred
async def test_stall_then_refuse_aborts_open_connection(start: Start) -> None:
    """stall sends 200 headers and then nothing; refuse() aborts that open connection."""
    engine = start("llamacpp", faults=Faults(stall=True))
    path, body = INFERENCE["llamacpp"]
    response = await send("POST", engine.url + path, body)
    assert response.code == 200
    got: list[bytes] = []
    reading = treq.collect(response, got.append)
    await sleep(0.2)
    assert got == []
    assert engine.in_flight == 1
    await engine.refuse()
    with pytest.raises(ResponseFailed):
        await reading
    assert engine.in_flight == 0


@pytest.mark.parametrize("after", [0, 2])
@pytest_twisted.ensureDeferred
async def test_die_after_chunks(start: Start, after: int) -> None:
    """die_after_chunks aborts the connection after N whole chunks of a stream."""
    engine = start("ollama", faults=Faults(die_after_chunks=after))
    path, body = INFERENCE["ollama"]
    response = await send("POST", engine.url + path, body)
    assert response.code == 200
    got: list[bytes] = []
    with pytest.raises(ResponseFailed):
        await treq.collect(response, got.append)
    lines = b"".join(got).split(b"\n")
    assert lines[-1] == b""
    assert len(lines) - 1 == after
    assert all(json.loads(line)["done"] is False for line in lines[:-1])
    # A whole (non-streamed) answer is not cut.
    whole = await fetch("POST", engine.url + path, {**body, "stream": False})
    assert whole.status == 200
    # It is an abort (RST), not a clean close.
    raw = await raw_connect(engine, path, body)
    await raw.ended
    assert raw.reason is not None
    assert raw.reason.check(ConnectionLost) is not None
    assert raw.received.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest_twisted.ensureDeferred
async def test_refuse_and_resume(start: Start) -> None:
    """refuse() makes new connections fail with connection refused; resume() listens again on
    the same port."""
    engine = start("lmstudio")
    port = engine.port
    await engine.refuse()
    with pytest.raises(ConnectionRefusedError):
        await send("GET", engine.url + "/v1/models")
    assert engine.resume() == port
    assert (await fetch("GET", engine.url + "/v1/models")).status == 200


@pytest.mark.parametrize("dialect", ["ollama", "lmstudio", "llamacpp"])
@pytest_twisted.ensureDeferred
async def test_reset_before_headers(start: Start, dialect: str) -> None:
    """reset_before_headers reads the request, then resets the connection without a byte,
    after header_delay; other routes keep answering."""
    engine = start(dialect, faults=Faults(reset_before_headers=True, header_delay=0.1))
    path, body = INFERENCE[dialect]
    began = reactor.seconds()
    raw = await raw_connect(engine, path, body)
    await raw.ended
    assert reactor.seconds() - began >= 0.1
    assert raw.received == b""
    assert raw.reason is not None and raw.reason.check(ConnectionLost) is not None
    assert len(engine.requests) == 1 and engine.requests[0].json() == body
    assert (engine.headers_sent, engine.in_flight) == (0, 0)
    listing = "/api/tags" if dialect == "ollama" else "/v1/models"
    assert (await fetch("GET", engine.url + listing)).status == 200


@pytest.mark.parametrize("after", [0, 7])
@pytest_twisted.ensureDeferred
async def test_die_after_bytes_cuts_a_whole_body(start: Start, after: int) -> None:
    """die_after_bytes sends the full Content-Length but only N bytes of a whole body, then
    resets; a streamed answer is not cut by it."""
    engine = start("llamacpp")
    path, body = INFERENCE["llamacpp"]
    whole_body = {**body, "stream": False}
    intact = await fetch("POST", engine.url + path, whole_body)
    engine.faults.die_after_bytes = after
    raw = await raw_connect(engine, path, whole_body)
    await raw.ended
    assert raw.reason is not None and raw.reason.check(ConnectionLost) is not None
    head, _, received = raw.received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f"content-length: {len(intact.body)}\r\n".encode() in head.lower() + b"\r\n"
    assert received == intact.body[:after]
    streamed = await fetch("POST", engine.url + path, body)
    assert streamed.status == 200 and b"[DONE]" in streamed.body


@pytest_twisted.ensureDeferred
async def test_headers_sent_counts_heads_written(start: Start) -> None:
    """headers_sent counts answers whose head went out: at once, after a delay, or before a
    stall -- not one still held by header_delay."""
    engine = start("ollama", faults=Faults(stall=True))
    path, body = INFERENCE["ollama"]
    response = await send("POST", engine.url + path, body)
    assert engine.headers_sent == 1 and engine.in_flight == 1
    engine.faults.clear()
    engine.faults.header_delay = 30.0
    await raw_connect(engine, path, body)
    await eventually(lambda: len(engine.requests) == 2)
    assert engine.headers_sent == 1
    await fetch("GET", engine.url + "/api/tags")
    assert engine.headers_sent == 2
    engine.drop_connections()
    with pytest.raises(ResponseFailed):
        await treq.content(response)


@pytest_twisted.ensureDeferred
async def test_drop_connections_keeps_listening(start: Start) -> None:
    """drop_connections aborts open connections (idle keep-alive ones and answers in progress)
    and the engine keeps accepting new ones."""
    engine = start("llamacpp", chunk_interval=30.0)
    path, body = INFERENCE["llamacpp"]
    client = await raw_connect(engine, path, body)
    await eventually(lambda: engine.in_flight == 1)
    engine.drop_connections()
    await client.ended
    assert client.reason is not None and client.reason.check(ConnectionLost) is not None
    assert engine.in_flight == 0
    engine.chunk_interval = 0.0
    assert (await fetch("POST", engine.url + path, body)).status == 200


@pytest.mark.parametrize(
    ("dialect", "path"),
    [
        ("ollama", "/api/tags"),
        ("ollama", "/v1/models"),
        ("lmstudio", "/v1/models"),
        ("lmstudio", "/api/v1/models"),
        ("llamacpp", "/models"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_inventory_knobs(start: Start, dialect: str, path: str) -> None:
    """inventory_status answers model lists with that status and an error body;
    inventory_invalid answers 200 with a body that is not the envelope; inference is unaffected."""
    engine = start(dialect, faults=Faults(inventory_status=500))
    failed = await fetch("GET", engine.url + path)
    assert failed.status == 500
    assert "error" in failed.json()
    engine.faults.clear()
    engine.faults.inventory_invalid = True
    invalid = await fetch("GET", engine.url + path)
    assert (invalid.status, invalid.body) == (200, b"not json")
    inference_path, body = INFERENCE[dialect]
    assert (await fetch("POST", engine.url + inference_path, body)).status == 200


@pytest_twisted.ensureDeferred
async def test_inventory_delay(start: Start) -> None:
    """inventory_delay holds model-list headers back."""
    engine = start("llamacpp", faults=Faults(inventory_delay=0.1))
    began = reactor.seconds()
    assert (await fetch("GET", engine.url + "/v1/models")).status == 200
    assert reactor.seconds() - began >= 0.1


@pytest_twisted.ensureDeferred
async def test_chunks_are_written_separately_at_the_interval(start: Start) -> None:
    """Each token is its own write, chunk_interval apart."""
    engine = start("ollama", chunk_interval=0.05)
    path, body = INFERENCE["ollama"]
    got = await pieces(await send("POST", engine.url + path, body))
    assert len(got) == 5  # four tokens and the done line
    assert got[-1][0] - got[0][0] >= 4 * 0.05


@pytest_twisted.ensureDeferred
async def test_client_disconnect_cancels_pending_writes(start: Start) -> None:
    """A client that goes away mid-stream cancels the engine's scheduled writes."""
    engine = start("ollama", chunk_interval=30.0)
    # Other tests' pooled client connections hold long timers of their own; only new ones count.
    before = set(reactor.getDelayedCalls())
    client = await raw_connect(engine, *INFERENCE["ollama"])
    await eventually(lambda: b'"done":false' in client.received)
    assert engine.in_flight == 1
    assert client.transport is not None
    client.transport.loseConnection()
    await client.ended
    await eventually(lambda: engine.in_flight == 0)
    assert engine.abandoned == 1
    late = [
        c
        for c in reactor.getDelayedCalls()
        if c not in before and c.getTime() > reactor.seconds() + 20
    ]
    assert late == []


@pytest_twisted.ensureDeferred
async def test_knobs_are_read_when_a_request_arrives(start: Start) -> None:
    """Changing a knob mid-answer affects the next request, not the one in flight."""
    engine = start("llamacpp", chunk_interval=0.02)
    path, body = INFERENCE["llamacpp"]
    response = await send("POST", engine.url + path, body)
    engine.faults.die_after_chunks = 1
    got = await pieces(response)
    assert b"[DONE]" in b"".join(data for _, data in got)


@pytest_twisted.ensureDeferred
async def test_requests_are_recorded(start: Start) -> None:
    """Every request is recorded: method, target with query, lower-cased headers, body."""
    engine = start("llamacpp")
    await fetch("GET", engine.url + "/slots?fail_on_no_slot=1", headers={"X-Trace": "t1"})
    await fetch("POST", engine.url + "/completion", {"prompt": "p"})
    first, second = engine.requests
    assert (first.method, first.path, first.body) == ("GET", "/slots?fail_on_no_slot=1", b"")
    assert first.headers["x-trace"] == ["t1"]
    assert (second.method, second.json()) == ("POST", {"prompt": "p"})


@implementer(IBodyProducer)
class _BodyBytes:
    """A request body written in one go (the in-memory agent has no reactor to pace it)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class _MemoryAgent(TypingProtocol):
    """The typed face of treq's (untyped) in-memory ``RequestTraversalAgent``."""

    def request(
        self,
        method: bytes,
        uri: bytes,
        headers: Headers | None = None,
        bodyProducer: IBodyProducer | None = None,
    ) -> Deferred[IResponse]: ...

    def flush(self) -> None: ...


class _Outcome:
    """Collects what a Deferred fires with, to look at synchronously."""

    def __init__(self, d: Deferred[Any]) -> None:
        self.results: list[Any] = []
        d.addBoth(self.results.append)

    @property
    def fired(self) -> bool:
        return bool(self.results)

    def result(self) -> Any:
        assert self.results, "the Deferred has not fired"
        if isinstance(self.results[0], Failure):
            self.results[0].raiseException()
        return self.results[0]


def test_resource_runs_on_an_injected_clock() -> None:
    """Without sockets, the resource answers through an in-memory agent and every delay is the
    injected clock's: nothing until the header delay has passed, then the whole stream."""
    clock = Clock()
    engine = SimEngine(clock, "llamacpp", models=["tiny"], faults=Faults(header_delay=5.0))
    make_agent: Callable[[IResource], _MemoryAgent] = RequestTraversalAgent
    agent = make_agent(engine.resource())
    body = _BodyBytes(json.dumps({"messages": [CHAT], "stream": True}).encode())
    answered = _Outcome(agent.request(b"POST", b"http://sim/v1/chat/completions", None, body))
    agent.flush()
    assert not answered.fired
    assert engine.in_flight == 1
    clock.advance(5)
    agent.flush()
    response: IResponse = answered.result()
    assert response.code == 200
    content = _Outcome(treq.content(response))
    clock.advance(0)  # the chunks' zero-interval calls, one after another
    agent.flush()
    got = Got(200, {}, content.result(), None)
    assert got.events()[-1] == (None, "[DONE]")
    assert got.data()[-1]["timings"]["predicted_n"] == 4
    assert engine.in_flight == 0


# -- the real client SDKs -------------------------------------------------------------------------


def _openai(engine: SimEngine) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="sim", max_retries=0, timeout=10)


@pytest.mark.parametrize("dialect", ["ollama", "lmstudio", "llamacpp"])
@pytest_twisted.ensureDeferred
async def test_openai_sdk_streams_with_usage(start: Start, dialect: str) -> None:
    """The openai SDK reads each engine's stream: the text, then a last chunk with usage."""
    engine = start(dialect, node="sdk")

    def run() -> tuple[str, list[int], int]:
        with _openai(engine) as client:
            stream = client.chat.completions.create(
                model="m1",
                messages=[{"role": "user", "content": "why is the sky blue"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", []
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage is not None:
                    usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
            listed = len(client.models.list().data)
        return text, usage, listed

    text, usage, listed = await deferToThread(run)
    assert text == "Hello from sdk."
    assert usage == [5, 4]
    assert listed == 1


@pytest_twisted.ensureDeferred
async def test_openai_sdk_non_stream_and_errors(start: Start) -> None:
    """The openai SDK parses a whole completion and raises NotFoundError for LM Studio's
    model_not_found."""
    engine = start("lmstudio", ["a", "b"], node="sdk")

    def run() -> tuple[str | None, int, str]:
        with _openai(engine) as client:
            answer = client.chat.completions.create(
                model="b", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.usage is not None
            try:
                client.chat.completions.create(
                    model="zzz", messages=[{"role": "user", "content": "hi"}]
                )
            except openai.NotFoundError as e:
                code = str(e.code)
            else:
                code = ""
        return answer.choices[0].message.content, answer.usage.total_tokens, code

    assert await deferToThread(run) == ("Hello from sdk.", 5, "model_not_found")


@pytest_twisted.ensureDeferred
async def test_ollama_sdk(start: Start) -> None:
    """The ollama SDK: chat (whole and streamed), generate, list, ps, delete, and a 404 for an
    unknown model."""
    engine = start("ollama", ["llama3:latest", "qwen2:7b"], node="py")

    def run() -> dict[str, object]:
        client = ollama.Client(host=engine.url, timeout=10)
        chat = client.chat(model="llama3", messages=[{"role": "user", "content": "a b"}])
        streamed = [
            part.message.content or ""
            for part in client.chat(
                model="llama3", messages=[{"role": "user", "content": "a b"}], stream=True
            )
        ]
        generated = client.generate(model="qwen2:7b", prompt="x y z")
        listed = [m.model for m in client.list().models]
        loaded = [m.model for m in client.ps().models]
        deleted = client.delete("qwen2:7b").status
        try:
            client.chat(model="nope", messages=[])
        except ollama.ResponseError as e:
            missing = (e.status_code, e.error)
        else:
            missing = (0, "")
        return {
            "chat": (chat.message.content, chat.prompt_eval_count, chat.eval_count),
            "streamed": "".join(streamed),
            "generated": (generated.response, generated.prompt_eval_count, generated.done_reason),
            "listed": listed,
            "loaded": loaded,
            "deleted": deleted,
            "missing": missing,
        }

    result = await deferToThread(run)
    assert result == {
        "chat": ("Hello from py.", 2, 4),
        "streamed": "Hello from py.",
        "generated": ("Hello from py.", 3, "stop"),
        "listed": ["llama3:latest", "qwen2:7b"],
        "loaded": ["llama3:latest", "qwen2:7b"],
        "deleted": "success",
        "missing": (404, "model 'nope' not found"),
    }
    assert engine.models == ["llama3:latest"]


# -- the runner -----------------------------------------------------------------------------------


def test_runner_serves_until_sigterm() -> None:
    """python -m nvpair.sim logs one line per listener on stderr, serves, and exits on SIGTERM."""
    command = [
        sys.executable,
        "-m",
        "nvpair.sim",
        "--serve",
        "ollama",
        "0",
        "node-r",
        "llama3:latest,qwen2:7b",
        "--serve",
        "llamacpp",
        "0",
        "node-s",
        "tiny",
        "--chunk-interval",
        "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        # Raw reads: a buffered readline could swallow the second line and leave select waiting.
        output = b""
        while output.count(b"\n") < 2:
            ready, _, _ = select.select([proc.stderr], [], [], 15)
            assert ready, f"runner printed only {output!r}"
            data = os.read(proc.stderr.fileno(), 4096)
            assert data, f"runner exited after {output!r}"
            output += data
        lines = output.decode().splitlines()
        ports = [int(line.split("port ")[1].split(")")[0]) for line in lines]
        assert "ollama" in lines[0] and "node-r" in lines[0]
        # No proxies: this must stay on loopback whatever the environment says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{ports[0]}/api/tags", timeout=5) as answer:
            names = [m["name"] for m in json.load(answer)["models"]]
        assert names == ["llama3:latest", "qwen2:7b"]
        with opener.open(f"http://127.0.0.1:{ports[1]}/health", timeout=5) as answer:
            assert json.load(answer) == {"status": "ok"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
