# -*- test-case-name: tests.sim.test_sim -*-
"""The Ollama dialect: native ``/api/*`` routes streaming NDJSON by
default, the OpenAI-compatible ``/v1/*`` routes, model lists, management routes, gin's plain-text
404/405, and Ollama's model names (case-insensitive, ``:latest`` by default).

Generations and embeddings run ``OLLAMA_NUM_PARALLEL`` at a time per model
(:data:`DEFAULT_NUM_PARALLEL`, the default since v0.10); the rest wait their turn in order,
with no bound, writing nothing, headers included, until they start (:mod:`nvpair.sim.turns`).
A request for a model not in memory waits first in the scheduler's queue
(:mod:`nvpair.sim.memory`), which holds ``OLLAMA_MAX_QUEUE`` (:data:`DEFAULT_MAX_QUEUE`); past
that Ollama answers 503 :data:`MAX_QUEUE_ERROR`. A request with no prompt only loads (or
unloads) its model and takes no turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime

import attrs

from nvpair.sim import openai
from nvpair.sim.generation import LOAD_MS, Generation, count_words, embedding, generate, texts
from nvpair.sim.wire import (
    NDJSON_TYPE,
    Answer,
    BadJSON,
    Call,
    EngineView,
    Reply,
    RouteKind,
    Routes,
    Task,
    empty_reply,
    get_dict,
    get_int,
    get_str,
    include_usage,
    json_reply,
    ndjson_line,
    parse_object,
    text_reply,
)

VERSION = "0.33.0"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
# The newest model of a list was modified at this instant; each later one an hour earlier, so the
# list order is already Ollama's newest-first order.
NEWEST_MODIFIED = 1_767_225_600  # 2026-01-01T00:00:00Z
FLAVOR = openai.Flavor(fingerprint="fp_ollama", role_chunk=False, zero_usage_on_text_chunks=True)
#: ``OLLAMA_NUM_PARALLEL``'s default (``envconfig.NumParallel``): one request per model at once.
DEFAULT_NUM_PARALLEL = 1
#: ``OLLAMA_MAX_QUEUE``'s default (``envconfig.MaxQueue``).
DEFAULT_MAX_QUEUE = 512
#: ``ErrMaxQueue`` (``server/sched.go``), answered 503; the two spaces are Ollama's.
MAX_QUEUE_ERROR = "server busy, please try again.  maximum pending requests exceeded"

Json = dict[str, object]


@attrs.frozen
class ModelName:
    """An Ollama model name, parts as written (``[host/][namespace/]model[:tag]``)."""

    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> ModelName | None:
        """Parse ``text`` with Ollama's defaults merged in; ``None`` when it is not a valid name.

        A tag exists only when the last ``:`` comes after the last ``/`` (so a host's port is not a
        tag); one ``/`` means ``namespace/model``.
        """
        if not text or "@" in text:
            return None
        base, tag = text, "latest"
        colon, slash = text.rfind(":"), text.rfind("/")
        if colon > slash:
            base, tag = text[:colon], text[colon + 1 :]
        if "://" in base:
            base = base.split("://", 1)[1]
        parts = base.split("/")
        if len(parts) == 1:
            host, namespace, model = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]
        elif len(parts) == 2:
            host, namespace, model = DEFAULT_HOST, parts[0], parts[1]
        elif len(parts) == 3:
            host, namespace, model = parts
        else:
            return None
        if not all((host, namespace, model, tag)):
            return None
        return cls(host, namespace, model, tag)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What two names must share to be the same model (case-insensitive)."""
        return (self.host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower())

    @property
    def display(self) -> str:
        """Ollama's shortest display form; the tag is always shown."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"


def find_model(models: list[str], requested: str) -> str | None:
    """The configured model (as configured) that ``requested`` names, if any."""
    wanted = ModelName.parse(requested)
    if wanted is None:
        return None
    for model in models:
        name = ModelName.parse(model)
        if name is not None and name.key == wanted.key:
            return model
    return None


def display(model: str) -> str:
    """How a configured model is listed."""
    name = ModelName.parse(model)
    return name.display if name is not None else model


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, as Go marshals a ``time.Time``."""
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _digest(model: str) -> str:
    return hashlib.sha256(display(model).encode("utf-8")).hexdigest()


def _size(model: str) -> int:
    return 1_000_000_000 + int(_digest(model)[:6], 16) * 1000


def _details() -> Json:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "8.0B",
        "quantization_level": "Q4_0",
    }


def _modified(index: int) -> int:
    return NEWEST_MODIFIED - 3600 * index


def metrics(gen: Generation) -> Json:
    """``api.Metrics`` in nanoseconds; every field is ``omitempty`` in Go, so zeros are left out."""
    load = LOAD_MS * 1_000_000
    prompt = gen.prompt_ms * 1_000_000
    eval_ = gen.eval_ms * 1_000_000
    fields: Json = {
        "total_duration": load + prompt + eval_,
        "load_duration": load,
        "prompt_eval_count": gen.prompt_tokens,
        "prompt_eval_duration": prompt,
        "eval_count": gen.completion_tokens,
        "eval_duration": eval_,
    }
    return {k: v for k, v in fields.items() if v}


def _go_json_error(bad: BadJSON, target: str) -> str:
    if bad.reason == "not-object":
        return f"json: cannot unmarshal {bad.detail} into Go value of type {target}"
    return f"invalid character '{bad.first}' looking for beginning of value"


def _is_unload(body: Mapping[str, object]) -> bool:
    return body.get("keep_alive") in (0, "0", "0s", "0m")


@attrs.frozen
class _Target:
    """A request's model: as sent (echoed in answers) and as configured."""

    sent: str
    model: str


class OllamaDialect:
    """Answers calls the way ``ollama serve`` does."""

    def __init__(self) -> None:
        routes = Routes()
        inference, inventory, other = RouteKind.INFERENCE, RouteKind.INVENTORY, RouteKind.OTHER
        routes.add("GET HEAD", "/", other, self._root)
        routes.add("GET HEAD", "/api/version", other, self._version)
        routes.add("GET HEAD", "/api/tags", inventory, self._tags)
        routes.add("GET", "/api/ps", inventory, self._ps)
        routes.add("GET", "/v1/models", inventory, self._v1_models)
        routes.add("GET", "/v1/models/*", inventory, self._v1_model)
        routes.add("POST", "/api/generate", inference, self._generate)
        routes.add("POST", "/api/chat", inference, self._chat)
        routes.add("POST", "/api/embed", inference, self._embed)
        routes.add("POST", "/api/embeddings", inference, self._embeddings)
        routes.add("POST", "/v1/chat/completions", inference, self._v1_chat)
        routes.add("POST", "/v1/completions", inference, self._v1_completions)
        routes.add("POST", "/v1/embeddings", inference, self._v1_embeddings)
        routes.add("POST", "/api/show", other, self._show)
        routes.add("POST", "/api/pull", other, self._pull)
        routes.add("POST", "/api/copy", other, self._copy)
        routes.add("DELETE", "/api/delete", other, self._delete)
        self._routes = routes

    # -- Dialect -------------------------------------------------------------------------------

    def classify(self, call: Call) -> RouteKind:
        return self._routes.kind(call)

    def answer(self, view: EngineView, call: Call) -> Answer:
        route = self._routes.find(call.method, call.path)
        if route is not None:
            return route.handler(view, call)
        if self._routes.knows(call.path):
            # gin runs with HandleMethodNotAllowed.
            return text_reply(405, "405 method not allowed")
        return text_reply(404, "404 page not found")

    def failure(self, call: Call, status: int, message: str) -> Reply:
        if call.path.startswith("/v1/"):
            return openai.error_reply(status, message, _v1_error_type(status))
        return json_reply(status, {"error": message})

    #: Ollama writes nothing, headers included, until the model is loaded.
    stream_headers_first = False

    default_parallel = DEFAULT_NUM_PARALLEL

    def model_for(self, view: EngineView, call: Call) -> str | None:
        body = parse_object(call.body)
        if isinstance(body, BadJSON):
            return None
        return find_model(view.models, get_str(body, "model") or get_str(body, "name"))

    # -- shared request handling ---------------------------------------------------------------

    def _body(self, call: Call, target: str) -> dict[str, object] | Reply:
        parsed = parse_object(call.body)
        if not isinstance(parsed, BadJSON):
            return parsed
        if parsed.reason == "empty":
            return self.failure(call, 400, "missing request body")
        return self.failure(call, 400, _go_json_error(parsed, target))

    def _target(self, view: EngineView, call: Call, body: Mapping[str, object]) -> _Target | Reply:
        # Management requests still accept the deprecated ``name``; ``model`` wins.
        sent = get_str(body, "model") or get_str(body, "name")
        if not sent:
            return self.failure(call, 400, "model is required")
        if ModelName.parse(sent) is None:
            return self.failure(call, 400, "invalid model name")
        model = find_model(view.models, sent)
        if model is None:
            return self.failure(call, 404, f"model '{sent}' not found")
        return _Target(sent, model)

    def _prepare(
        self, view: EngineView, call: Call, go_type: str
    ) -> tuple[dict[str, object], _Target] | Reply:
        body = self._body(call, go_type)
        if isinstance(body, Reply):
            return body
        target = self._target(view, call, body)
        if isinstance(target, Reply):
            return target
        return body, target

    # -- health and inventory ------------------------------------------------------------------

    def _root(self, view: EngineView, call: Call) -> Reply:
        return text_reply(200, "Ollama is running")

    def _version(self, view: EngineView, call: Call) -> Reply:
        return json_reply(200, {"version": VERSION})

    def _entry(self, index: int, model: str) -> Json:
        name = display(model)
        return {
            "name": name,
            "model": name,
            "modified_at": timestamp(_modified(index)),
            "size": _size(model),
            "digest": _digest(model),
            "details": _details(),
        }

    def _tags(self, view: EngineView, call: Call) -> Reply:
        return json_reply(200, {"models": [self._entry(i, m) for i, m in enumerate(view.models)]})

    def _ps(self, view: EngineView, call: Call) -> Reply:
        # The models in memory, loading ones included: Ollama lists a runner as soon as it
        # starts loading it. With no keep-alive a model never expires; it shows five minutes on.
        now = view.now()
        entries = [
            {
                "name": display(r.model),
                "model": display(r.model),
                "size": _size(r.model),
                "digest": _digest(r.model),
                "details": _details(),
                "expires_at": timestamp(r.expires_at if r.expires_at is not None else now + 300),
                "size_vram": _size(r.model),
                "context_length": 4096,
            }
            for r in view.memory.resident()
            if r.model in view.models
        ]
        return json_reply(200, {"models": entries})

    def _v1_entry(self, index: int, model: str) -> Json:
        name = ModelName.parse(model)
        return {
            "id": display(model),
            "object": "model",
            "created": _modified(index),
            "owned_by": name.namespace if name is not None else DEFAULT_NAMESPACE,
        }

    def _v1_models(self, view: EngineView, call: Call) -> Reply:
        # Ollama never initialises the slice, so an empty list marshals as null.
        data = [self._v1_entry(i, m) for i, m in enumerate(view.models)] or None
        return json_reply(200, {"object": "list", "data": data})

    def _v1_model(self, view: EngineView, call: Call) -> Reply:
        sent = call.path.removeprefix("/v1/models/")
        model = find_model(view.models, sent)
        if model is None:
            return self.failure(call, 404, f"model '{sent}' not found")
        return json_reply(200, self._v1_entry(view.models.index(model), model))

    # -- native inference ----------------------------------------------------------------------

    def _head(self, view: EngineView, target: _Target) -> Json:
        return {"model": target.sent, "created_at": timestamp(view.now())}

    def _generate(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call, "api.GenerateRequest")
        if isinstance(prepared, Reply):
            return prepared
        body, target = prepared
        head = self._head(view, target)
        prompt = body.get("prompt")
        if not prompt:
            # An empty prompt only loads (or, with keep_alive 0, unloads) the model.
            reason = "unload" if _is_unload(body) else "load"
            return json_reply(200, {**head, "response": "", "done": True, "done_reason": reason})
        gen = self._generation(view, body, prompt)
        final: Json = {
            "done": True,
            "done_reason": _done_reason(gen),
            "context": list(range(1, gen.total_tokens + 1)),
            **metrics(gen),
        }
        if not _streams(body):
            return Task.of(json_reply(200, {**head, "response": gen.text, **final}))
        lines = [ndjson_line({**head, "response": t, "done": False}) for t in gen.tokens]
        lines.append(ndjson_line({**head, "response": "", **final}))
        return Task.of(Reply(200, tuple(lines), NDJSON_TYPE, streamed=True))

    def _chat(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call, "api.ChatRequest")
        if isinstance(prepared, Reply):
            return prepared
        body, target = prepared
        head = self._head(view, target)
        messages = body.get("messages")
        if not messages:
            reason = "unload" if _is_unload(body) else "load"
            message = {"role": "assistant", "content": ""}
            done = {"done": True, "done_reason": reason}
            return json_reply(200, {**head, "message": message, **done})
        gen = self._generation(view, body, messages)
        final: Json = {"done": True, "done_reason": _done_reason(gen), **metrics(gen)}
        if not _streams(body):
            message = {"role": "assistant", "content": gen.text}
            return Task.of(json_reply(200, {**head, "message": message, **final}))
        lines = [
            ndjson_line({**head, "message": {"role": "assistant", "content": t}, "done": False})
            for t in gen.tokens
        ]
        lines.append(
            ndjson_line({**head, "message": {"role": "assistant", "content": ""}, **final})
        )
        return Task.of(Reply(200, tuple(lines), NDJSON_TYPE, streamed=True))

    def _generation(
        self, view: EngineView, body: Mapping[str, object], prompt: object
    ) -> Generation:
        limit = get_int(get_dict(body, "options"), "num_predict")
        return generate(view.tokens, count_words(prompt), limit)

    def _embed(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call, "api.EmbedRequest")
        if isinstance(prepared, Reply):
            return prepared
        body, target = prepared
        inputs = body.get("input")
        prompt_tokens = count_words(inputs)
        load = LOAD_MS * 1_000_000
        answer: Json = {
            "model": target.sent,
            "embeddings": [embedding(text) for text in texts(inputs)],
            "total_duration": load + prompt_tokens * 1_000_000,
            "load_duration": load,
            "prompt_eval_count": prompt_tokens,
        }
        return Task.of(json_reply(200, answer))

    def _embeddings(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call, "api.EmbeddingRequest")
        if isinstance(prepared, Reply):
            return prepared
        body, _ = prepared
        prompt = get_str(body, "prompt")
        if not prompt:
            return json_reply(200, {"embedding": []})
        return Task.of(json_reply(200, {"embedding": embedding(prompt)}))

    # -- OpenAI-compatible inference -----------------------------------------------------------

    def _v1(self, view: EngineView, call: Call, prompt_key: str, prefix: str) -> Answer:
        chat = prompt_key == "messages"
        go_type = "openai.ChatCompletionRequest" if chat else "openai.CompletionRequest"
        prepared = self._prepare(view, call, go_type)
        if isinstance(prepared, Reply):
            return prepared
        body, target = prepared
        limit = get_int(body, "max_tokens")
        if limit is None:
            limit = get_int(body, "max_completion_tokens")
        gen = generate(view.tokens, count_words(body.get(prompt_key)), limit)
        head = openai.Head(f"{prefix}-{view.next_id()}", int(view.now()), target.sent)
        stream = body.get("stream") is True
        if chat:
            if stream:
                return Task.of(openai.chat_stream(FLAVOR, head, gen, include_usage(body)))
            return Task.of(json_reply(200, openai.chat_body(FLAVOR, head, gen, {})))
        if stream:
            return Task.of(openai.text_stream(FLAVOR, head, gen, include_usage(body)))
        return Task.of(json_reply(200, openai.text_body(FLAVOR, head, gen, {})))

    def _v1_chat(self, view: EngineView, call: Call) -> Answer:
        return self._v1(view, call, "messages", "chatcmpl")

    def _v1_completions(self, view: EngineView, call: Call) -> Answer:
        return self._v1(view, call, "prompt", "cmpl")

    def _v1_embeddings(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call, "openai.EmbedRequest")
        if isinstance(prepared, Reply):
            return prepared
        body, target = prepared
        inputs = body.get("input")
        reply = json_reply(200, openai.embeddings_body(target.sent, inputs, count_words(inputs)))
        return Task.of(reply)

    # -- management ----------------------------------------------------------------------------

    def _show(self, view: EngineView, call: Call) -> Reply:
        prepared = self._prepare(view, call, "api.ShowRequest")
        if isinstance(prepared, Reply):
            return prepared
        _, target = prepared
        index = view.models.index(target.model)
        answer: Json = {
            "modelfile": f"# Modelfile (nvpair simulator)\nFROM {display(target.model)}\n",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": _details(),
            "model_info": {
                "general.architecture": "llama",
                "general.parameter_count": 8_000_000_000,
                "llama.context_length": 4096,
            },
            "capabilities": ["completion"],
            "modified_at": timestamp(_modified(index)),
        }
        return json_reply(200, answer)

    def _pull(self, view: EngineView, call: Call) -> Reply:
        body = self._body(call, "api.PullRequest")
        if isinstance(body, Reply):
            return body
        sent = get_str(body, "model") or get_str(body, "name")
        name = ModelName.parse(sent)
        if name is None:
            return self.failure(call, 400, "invalid model name" if sent else "model is required")
        if find_model(view.models, sent) is None:
            # A pulled model is the newest one.
            view.models.insert(0, name.display)
        if not _streams(body):
            return json_reply(200, {"status": "success"})
        steps = ("pulling manifest", "verifying sha256 digest", "writing manifest", "success")
        lines = tuple(ndjson_line({"status": step}) for step in steps)
        return Reply(200, lines, NDJSON_TYPE, streamed=True)

    def _copy(self, view: EngineView, call: Call) -> Reply:
        body = self._body(call, "api.CopyRequest")
        if isinstance(body, Reply):
            return body
        source, destination = get_str(body, "source"), get_str(body, "destination")
        dest_name = ModelName.parse(destination)
        if ModelName.parse(source) is None or dest_name is None:
            return self.failure(call, 400, "invalid model name")
        if find_model(view.models, source) is None:
            return self.failure(call, 404, f"model '{source}' not found")
        if find_model(view.models, destination) is None:
            view.models.insert(0, dest_name.display)
        return empty_reply(200)

    def _delete(self, view: EngineView, call: Call) -> Reply:
        prepared = self._prepare(view, call, "api.DeleteRequest")
        if isinstance(prepared, Reply):
            return prepared
        _, target = prepared
        view.models.remove(target.model)
        # 200 with an empty body; ollama-python maps that to status "success".
        return empty_reply(200)


def _streams(body: Mapping[str, object]) -> bool:
    """Native routes stream unless ``stream`` is explicitly ``false``."""
    return body.get("stream") is not False


def _done_reason(gen: Generation) -> str:
    return "length" if gen.truncated else "stop"


def _v1_error_type(status: int) -> str:
    if status == 400:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    return "api_error"
