# -*- test-case-name: tests.sim.test_sim -*-
"""The llama.cpp ``llama-server`` dialect in single-model mode: native
``/completion`` (SSE without ``[DONE]``, ``stop``/``stop_type``/``timings``), OpenAI-compatible
routes carrying ``usage`` and ``timings``, the combined ``/models`` list, ``/health``, ``/props``,
``/slots``, embeddings and rerank, and ``{"error":{code,message,type}}`` errors.

The request's ``model`` is ignored: the server's model (the first configured name) answers and is
named in every response. Every configured name is listed by ``/models``. With no model configured
the server behaves as while loading: inference answers 503 ``Loading model``. While the server
loads its model (a cold start: from :meth:`~nvpair.sim.SimEngine.listen` for the engine's load
delay) every route, ``/health`` included, answers 503 ``Loading model``, as current builds do.

Every completion, chat, embedding and rerank runs in one of the server's ``parallel`` slots
(``-np``; :data:`DEFAULT_PARALLEL` as ``-np auto``). With every slot busy the request is
deferred, as llama-server defers its task: no answer, not even headers, until a slot frees, in
arrival order (:mod:`nvpair.sim.turns`; an ``id_slot`` waits for that slot). ``/slots`` shows
which slots are busy, ``/props`` ``total_slots`` how many there are; deferred requests appear
in neither, as in the real server.

Completions and chats go through the prompt cache (:mod:`nvpair.sim.promptcache`): each is
given a slot, reads from cache the prefix its prompt shares with what that slot (or the RAM
prompt cache) kept, and reports it as llama-server does: ``timings.cache_n`` read from cache,
``timings.prompt_n`` evaluated, ``usage.prompt_tokens_details.cached_tokens`` = ``cache_n``,
``usage.prompt_tokens`` = both. A chat's prompt is its template's rendering
(:func:`~nvpair.sim.generation.chat_words`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from nvpair.sim import openai
from nvpair.sim.generation import (
    EVAL_MS_PER_TOKEN,
    PROMPT_MS_PER_TOKEN,
    Generation,
    chat_words,
    count_words,
    embedding,
    generate,
    prompt_words,
    texts,
)
from nvpair.sim.promptcache import Reuse
from nvpair.sim.wire import (
    SSE_TYPE,
    Answer,
    BadJSON,
    Call,
    EngineView,
    Reply,
    RouteKind,
    Routes,
    Task,
    get_int,
    include_usage,
    json_reply,
    parse_object,
    sse_data,
)

BUILD = "b0-nvpair-sim"
N_CTX = 4096
CREATED = 1_767_225_600  # 2026-01-01T00:00:00Z, the model file's (fixed) creation time
#: The slots of ``-np auto`` (the default, -1): llama-server then sets 4.
DEFAULT_PARALLEL = 4

Json = dict[str, object]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def _error_type(status: int) -> str:
    default = "server_error" if status >= 500 else "invalid_request_error"
    return _ERROR_TYPES.get(status, default)


def error_reply(status: int, message: str) -> Reply:
    """llama-server's ``format_error_response``: the status is the ``code``."""
    error = {"message": message, "type": _error_type(status), "code": status}
    return json_reply(status, {"error": error})


def timings(gen: Generation) -> Json:
    """``server_slot_stats`` for ``gen``, from the simulated model's fixed speeds: ``cache_n``
    prompt tokens read from cache, ``prompt_n`` (and its time) the ones evaluated."""
    prompt_per_token = float(PROMPT_MS_PER_TOKEN)
    predicted_per_token = float(EVAL_MS_PER_TOKEN)
    return {
        "cache_n": gen.cached_tokens,
        "prompt_n": gen.evaluated_tokens,
        "prompt_ms": float(gen.prompt_ms),
        "prompt_per_token_ms": prompt_per_token,
        "prompt_per_second": 1000.0 / prompt_per_token,
        "predicted_n": gen.completion_tokens,
        "predicted_ms": float(gen.eval_ms),
        "predicted_per_token_ms": predicted_per_token,
        "predicted_per_second": 1000.0 / predicted_per_token,
    }


FLAVOR = openai.Flavor(
    fingerprint=BUILD,
    role_chunk=True,
    role_chunk_content=None,
    usage_details=True,
    extra=lambda gen: {"timings": timings(gen)},
)


def _parse_error(bad: BadJSON) -> str:
    # nlohmann::json's wording, which llama-server passes through.
    if bad.reason == "empty":
        where, what = "line 1, column 1", "attempting to parse an empty input"
    else:
        where, what = f"line {bad.line}, column {bad.column}", "syntax error while parsing value"
    return f"[json.exception.parse_error.101] parse error at {where}: {what}"


class LlamaCppDialect:
    """Answers calls the way ``llama-server -m <model>`` does."""

    def __init__(self) -> None:
        routes = Routes()
        inference, inventory, other = RouteKind.INFERENCE, RouteKind.INVENTORY, RouteKind.OTHER
        # cpp-httplib answers HEAD wherever it answers GET.
        routes.add("GET HEAD", "/health", other, self._health)
        routes.add("GET HEAD", "/v1/health", other, self._health)
        routes.add("GET HEAD", "/models", inventory, self._models)
        routes.add("GET HEAD", "/v1/models", inventory, self._models)
        routes.add("GET HEAD", "/props", other, self._props)
        routes.add("GET HEAD", "/slots", other, self._slots)
        for path in ("/completion", "/completions", "/infill"):
            routes.add("POST", path, inference, self._native_completion)
        routes.add("POST", "/v1/completions", inference, self._oai_completions)
        routes.add("POST", "/chat/completions", inference, self._oai_chat)
        routes.add("POST", "/v1/chat/completions", inference, self._oai_chat)
        routes.add("POST", "/embedding", inference, self._native_embeddings)
        routes.add("POST", "/embeddings", inference, self._native_embeddings)
        routes.add("POST", "/v1/embeddings", inference, self._oai_embeddings)
        for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
            routes.add("POST", path, inference, self._rerank)
        self._routes = routes

    # -- Dialect -------------------------------------------------------------------------------

    def classify(self, call: Call) -> RouteKind:
        return self._routes.kind(call)

    def answer(self, view: EngineView, call: Call) -> Answer:
        if view.models and view.memory.loading(view.models[0]):
            # The server's own gate while it loads: before routing, so every path answers it.
            return error_reply(503, "Loading model")
        route = self._routes.find(call.method, call.path)
        if route is None:
            # cpp-httplib has no 405: a wrong method is as unknown as a wrong path.
            return error_reply(404, "File Not Found")
        return route.handler(view, call)

    def failure(self, call: Call, status: int, message: str) -> Reply:
        return error_reply(status, message)

    #: The model is loaded once, at start (single-model mode), never per request.
    stream_headers_first = False

    default_parallel = DEFAULT_PARALLEL

    def model_for(self, view: EngineView, call: Call) -> str | None:
        return None

    # -- shared request handling ---------------------------------------------------------------

    def _prepare(self, view: EngineView, call: Call) -> tuple[dict[str, object], str] | Reply:
        """The body and the server's model, or the error reply."""
        if not view.models:
            return error_reply(503, "Loading model")
        body = parse_object(call.body)
        if isinstance(body, BadJSON):
            if body.reason == "not-object":
                return error_reply(400, "request body must be a JSON object")
            return error_reply(400, _parse_error(body))
        return body, view.models[0]

    # -- health and inventory ------------------------------------------------------------------

    def _health(self, view: EngineView, call: Call) -> Reply:
        return json_reply(200, {"status": "ok"})

    def _models(self, view: EngineView, call: Call) -> Reply:
        # One object carrying both the Ollama-style and the OpenAI-style list.
        models = [
            {
                "name": m,
                "model": m,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
            for m in view.models
        ]
        data = [
            {
                "id": m,
                "aliases": [m],
                "tags": [],
                "object": "model",
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "created": CREATED,
                "owned_by": "llamacpp",
                "meta": {
                    "vocab_type": 1,
                    "n_vocab": 32000,
                    "n_ctx": N_CTX,
                    "n_ctx_train": N_CTX,
                    "n_embd": 4096,
                    "n_params": 8_000_000_000,
                    "size": 4_000_000_000,
                    "ftype": "Q4_0",
                },
            }
            for m in view.models
        ]
        return json_reply(200, {"models": models, "object": "list", "data": data})

    def _props(self, view: EngineView, call: Call) -> Reply:
        model = view.models[0] if view.models else ""
        props: Json = {
            "default_generation_settings": {
                "id": 0,
                "n_ctx": N_CTX,
                "is_processing": False,
                "params": {"n_predict": -1, "temperature": 0.8, "seed": 4294967295},
            },
            "total_slots": view.parallel,
            "model_alias": model,
            "model_path": f"/models/{model}.gguf",
            "modalities": {"vision": False, "audio": False},
            "chat_template": (
                "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }} {% endfor %}"
            ),
            "bos_token": "<s>",
            "eos_token": "</s>",
            "build_info": BUILD,
            "webui": False,
        }
        return json_reply(200, props)

    def _slots(self, view: EngineView, call: Call) -> Reply:
        # A slot is busy while the answer running in it is delivered; deferred requests wait
        # for a slot and show nowhere.
        busy = [view.prompts.busy(index) for index in range(view.parallel)]
        if all(busy) and "fail_on_no_slot=1" in call.query.split("&"):
            return error_reply(503, "no slot available")
        slots = [
            {
                "id": index,
                "id_task": -1,
                "n_ctx": N_CTX,
                "speculative": False,
                "is_processing": processing,
            }
            for index, processing in enumerate(busy)
        ]
        return json_reply(200, slots)

    # -- native inference ----------------------------------------------------------------------

    def _native_completion(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        if call.path == "/infill":
            prompt: object = [
                body.get("input_prefix"),
                body.get("prompt"),
                body.get("input_suffix"),
            ]
        elif "prompt" in body:
            prompt = body["prompt"]
        else:
            return error_reply(400, "'prompt' is required")
        limit = get_int(body, "n_predict")
        words = prompt_words(prompt)
        stream = body.get("stream") is True

        def decide() -> Reply:
            return _native_reply(view, body, model, prompt, words, limit, stream)

        return Task(decide, stream, _pin(view, body))

    def _native_embeddings(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, _ = prepared
        inputs = body.get("content", body.get("input"))
        # Pooled embeddings still come as a one-row matrix on the native route.
        answer = [{"index": i, "embedding": [embedding(t)]} for i, t in enumerate(texts(inputs))]
        return _in_a_slot(view, json_reply(200, answer))

    # -- OpenAI-compatible inference -----------------------------------------------------------

    def _oai(self, view: EngineView, call: Call, chat: bool) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        key = "messages" if chat else "prompt"
        if key not in body:
            return error_reply(400, f"'{key}' is required")
        limit = get_int(body, "max_tokens")
        if limit is None:
            limit = get_int(body, "max_completion_tokens")
        words = chat_words(body[key]) if chat else prompt_words(body[key])
        stream = body.get("stream") is True

        def decide() -> Reply:
            # The slot, and so what it reads from cache, is known only once it starts.
            reuse = _take(view, body, words)
            gen = generate(view.tokens, len(words), limit, reuse.cached)
            prefix = "chatcmpl" if chat else "cmpl"
            head = openai.Head(f"{prefix}-{view.next_id()}", int(view.now()), model)
            if stream:
                streamer = openai.chat_stream if chat else openai.text_stream
                reply = streamer(FLAVOR, head, gen, include_usage(body))
            else:
                build = openai.chat_body if chat else openai.text_body
                reply = json_reply(200, build(FLAVOR, head, gen, {}))
            return attrs.evolve(reply, slot=reuse.slot)

        return Task(decide, stream, _pin(view, body))

    def _oai_chat(self, view: EngineView, call: Call) -> Answer:
        return self._oai(view, call, chat=True)

    def _oai_completions(self, view: EngineView, call: Call) -> Answer:
        return self._oai(view, call, chat=False)

    def _oai_embeddings(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        if "input" not in body:
            return error_reply(400, "'input' is required")
        inputs = body["input"]
        reply = json_reply(200, openai.embeddings_body(model, inputs, count_words(inputs)))
        return _in_a_slot(view, reply)

    def _rerank(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        query, documents = body.get("query"), texts(body.get("documents"))
        if not isinstance(query, str) or not documents:
            return error_reply(400, '"query" and "documents" are required')
        words = set(query.lower().split())
        # Relevance = the share of query words the document contains; best first.
        scores = [
            (len(words & set(doc.lower().split())) / len(words) if words else 0.0, i)
            for i, doc in enumerate(documents)
        ]
        scores.sort(key=lambda pair: -pair[0])
        top_n = get_int(body, "top_n")
        if top_n is not None:
            scores = scores[:top_n]
        results = [{"index": i, "relevance_score": score} for score, i in scores]
        tokens = count_words(query) + count_words(documents)
        answer: Json = {
            "model": model,
            "object": "list",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }
        return _in_a_slot(view, json_reply(200, answer))


def _pin(view: EngineView, body: dict[str, object]) -> int | None:
    """The slot a request's ``id_slot`` names (past the last one it wraps around); None: any."""
    slot = get_int(body, "id_slot")
    return None if slot is None or slot < 0 else slot % view.parallel


def _in_a_slot(view: EngineView, reply: Reply) -> Task:
    """An embedding or a rerank: known now, but it runs in a slot all the same."""
    return Task(lambda: attrs.evolve(reply, slot=view.prompts.occupy()), reply.streamed)


def _native_reply(
    view: EngineView,
    body: dict[str, object],
    model: str,
    prompt: object,
    words: Sequence[str],
    limit: int | None,
    stream: bool,
) -> Reply:
    """A native completion's answer, once it has its slot (and knows what that slot kept)."""
    reuse = _take(view, body, words)
    gen = generate(view.tokens, len(words), limit, reuse.cached)
    final = _native_final(model, gen, prompt, limit, reuse.slot)
    if not stream:
        return attrs.evolve(json_reply(200, {**final, "content": gen.text}), slot=reuse.slot)
    events = [
        sse_data(
            {
                "index": 0,
                "content": token,
                "tokens": [],
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": i + 1,
                "tokens_evaluated": gen.prompt_tokens,
            }
        )
        for i, token in enumerate(gen.tokens)
    ]
    # The native stream ends with the stop chunk; it sends no [DONE].
    events.append(sse_data(final))
    return Reply(200, tuple(events), SSE_TYPE, streamed=True, slot=reuse.slot)


def _take(view: EngineView, body: dict[str, object], words: Sequence[str]) -> Reuse:
    """The slot a completion runs in and what it reads from cache: ``cache_prompt: false``
    reads nothing, ``id_slot`` names a slot."""
    slot = get_int(body, "id_slot")
    return view.prompts.take(words, reuse=body.get("cache_prompt") is not False, slot=slot)


def _native_final(
    model: str, gen: Generation, prompt: object, limit: int | None, slot: int
) -> Json:
    """The last (``stop``) object of a native completion, without the content."""
    return {
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": slot,
        "stop": True,
        "model": model,
        "tokens_predicted": gen.completion_tokens,
        "tokens_evaluated": gen.prompt_tokens,
        "generation_settings": {"n_predict": -1 if limit is None else limit, "temperature": 0.8},
        "prompt": prompt if isinstance(prompt, str) else "",
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit" if gen.truncated else "eos",
        "stopping_word": "",
        "tokens_cached": gen.total_tokens,
        "timings": timings(gen),
    }
