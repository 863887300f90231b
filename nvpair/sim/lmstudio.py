# -*- test-case-name: tests.sim.test_sim -*-
"""The LM Studio dialect: OpenAI-compatible ``/v1/*``, REST v0
(``/api/v0/*``, answers carry ``stats``) and REST v1 (``/api/v1/models``, ``/api/v1/chat`` with
named SSE events), Express's HTTP 200 "Unexpected endpoint" for anything unrouted, and LM Studio's
model choice (one loaded model answers whatever name was asked for).

Predictions (completions and chats) run Max Concurrent Predictions at a time per model
(:data:`DEFAULT_MAX_CONCURRENT_PREDICTIONS`, LM Studio's default); the rest are queued, in
order and without bound as far as its documentation says (:mod:`nvpair.sim.turns`). A queued
stream has its headers on accept, as one waiting for its model's load does, and its first byte
when it starts. Embeddings are no predictions: they take no turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import attrs

from nvpair.sim import openai
from nvpair.sim.generation import Generation, count_words, generate
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
    get_str,
    include_usage,
    json_reply,
    parse_object,
    sse_event,
)

FLAVOR = openai.Flavor(role_chunk=True, role_chunk_content="", logprobs=True)
DEFAULT_PUBLISHER = "lmstudio-community"
CONTEXT_LENGTH = 4096
MAX_CONTEXT_LENGTH = 131072
#: "By default, Max Concurrent Predictions is set to 4" (LM Studio's parallel-requests page).
DEFAULT_MAX_CONCURRENT_PREDICTIONS = 4

Json = dict[str, object]


def _publisher(model: str) -> str:
    # 0.4 keys are ``publisher/name``; older ids are bare.
    return model.split("/", 1)[0] if "/" in model else DEFAULT_PUBLISHER


def _type(model: str) -> str:
    return "embeddings" if "embed" in model.lower() else "llm"


def _error_type(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"


def _stats(gen: Generation) -> Json:
    """REST v0 ``stats``, from the simulated model's fixed speeds."""
    return {
        "tokens_per_second": gen.tokens_per_second,
        "time_to_first_token": gen.prompt_ms / 1000,
        "generation_time": gen.eval_ms / 1000,
        "stop_reason": "maxPredictedTokensReached" if gen.truncated else "eosFound",
    }


def _v0_extra(gen: Generation) -> Json:
    return {
        "stats": _stats(gen),
        "model_info": {
            "arch": "llama",
            "quant": "Q4_K_M",
            "format": "gguf",
            "context_length": CONTEXT_LENGTH,
        },
        "runtime": {
            "name": "llama.cpp-linux-x86_64-avx2",
            "version": "1.0.0",
            "supported_formats": ["gguf"],
        },
    }


class LMStudioDialect:
    """Answers calls the way LM Studio's server does."""

    def __init__(self) -> None:
        routes = Routes()
        inference, inventory = RouteKind.INFERENCE, RouteKind.INVENTORY
        # Express routes answer HEAD wherever they answer GET.
        routes.add("GET HEAD", "/v1/models", inventory, self._v1_models)
        routes.add("GET HEAD", "/api/v0/models", inventory, self._v0_models)
        routes.add("GET HEAD", "/api/v0/models/*", inventory, self._v0_model)
        routes.add("GET HEAD", "/api/v1/models", inventory, self._v1_rest_models)
        routes.add("POST", "/v1/chat/completions", inference, self._v1_chat)
        routes.add("POST", "/v1/completions", inference, self._v1_completions)
        routes.add("POST", "/v1/embeddings", inference, self._embeddings)
        routes.add("POST", "/api/v0/chat/completions", inference, self._v0_chat)
        routes.add("POST", "/api/v0/completions", inference, self._v0_completions)
        routes.add("POST", "/api/v0/embeddings", inference, self._embeddings)
        routes.add("POST", "/api/v1/chat", inference, self._rest_chat)
        self._routes = routes

    # -- Dialect -------------------------------------------------------------------------------

    def classify(self, call: Call) -> RouteKind:
        return self._routes.kind(call)

    def answer(self, view: EngineView, call: Call) -> Answer:
        route = self._routes.find(call.method, call.path)
        if route is not None:
            return route.handler(view, call)
        # Express's fallback answers anything unrouted -- wrong method included -- with 200.
        message = f"Unexpected endpoint or method. ({call.method} {call.path})"
        return json_reply(200, {"error": message})

    def failure(self, call: Call, status: int, message: str) -> Reply:
        return openai.error_reply(status, message, _error_type(status))

    #: A stream's headers go out on accept; its first byte waits: what the first-body budget
    #: is for (docs/retry-budget.md#per-attempt-budgets).
    stream_headers_first = True

    default_parallel = DEFAULT_MAX_CONCURRENT_PREDICTIONS

    def model_for(self, view: EngineView, call: Call) -> str | None:
        # JIT loading: a request for a model not in memory loads it.
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return None
        _, model = prepared
        return model

    # -- shared request handling ---------------------------------------------------------------

    def _prepare(self, view: EngineView, call: Call) -> tuple[dict[str, object], str] | Reply:
        """The body and the model that answers it, or the error reply."""
        body = parse_object(call.body)
        if isinstance(body, BadJSON):
            detail = "empty request body" if body.reason == "empty" else "invalid JSON body"
            return self.failure(call, 400, f"Failed to parse request: {detail}")
        models = view.models
        requested = get_str(body, "model")
        if not models:
            message = "No models loaded. Please load a model in the developer page first."
            return openai.error_reply(
                404, message, "invalid_request_error", "model", "model_not_found"
            )
        if len(models) == 1 or not requested:
            # With one model loaded the requested name is ignored and that model answers (#619).
            return body, models[0]
        if requested in models:
            return body, requested
        listing = "\n".join(f"- {m}" for m in models)
        message = (
            f'Model "{requested}" not found. Please specify a valid model.\n\n'
            f"Your models:\n{listing}"
        )
        return openai.error_reply(404, message, "invalid_request_error", "model", "model_not_found")

    # -- inventory -----------------------------------------------------------------------------

    def _v1_models(self, view: EngineView, call: Call) -> Reply:
        data = [{"id": m, "object": "model", "owned_by": "organization_owner"} for m in view.models]
        return json_reply(200, {"data": data, "object": "list"})

    def _v0_entry(self, view: EngineView, model: str) -> Json:
        return {
            "id": model,
            "object": "model",
            "type": _type(model),
            "publisher": _publisher(model),
            "arch": "llama",
            "compatibility_type": "gguf",
            "quantization": "Q4_K_M",
            "state": "loaded" if view.memory.in_memory(model) else "not-loaded",
            "max_context_length": MAX_CONTEXT_LENGTH,
        }

    def _v0_models(self, view: EngineView, call: Call) -> Reply:
        return json_reply(
            200, {"object": "list", "data": [self._v0_entry(view, m) for m in view.models]}
        )

    def _v0_model(self, view: EngineView, call: Call) -> Reply:
        wanted = call.path.removeprefix("/api/v0/models/")
        if wanted not in view.models:
            message = f'Model "{wanted}" not found.'
            return openai.error_reply(
                404, message, "invalid_request_error", "model", "model_not_found"
            )
        return json_reply(200, self._v0_entry(view, wanted))

    def _v1_rest_models(self, view: EngineView, call: Call) -> Reply:
        entries = [
            {
                "type": "embedding" if _type(m) == "embeddings" else "llm",
                "publisher": _publisher(m),
                "key": m,
                "display_name": m.rsplit("/", 1)[-1],
                "architecture": "llama",
                "quantization": {"name": "Q4_K_M", "bits_per_weight": 4.8},
                "size_bytes": 1_000_000_000 + int(hashlib.sha256(m.encode()).hexdigest()[:6], 16),
                "params_string": "8B",
                "loaded_instances": (
                    [{"id": m, "config": {"context_length": CONTEXT_LENGTH}}]
                    if view.memory.in_memory(m)
                    else []
                ),
                "max_context_length": MAX_CONTEXT_LENGTH,
                "format": "gguf",
                "capabilities": {"vision": False, "trained_for_tool_use": True},
            }
            for m in view.models
        ]
        return json_reply(200, {"models": entries})

    # -- OpenAI-compatible and REST v0 inference -----------------------------------------------

    def _completion(self, view: EngineView, call: Call, chat: bool, v0: bool) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        key = "messages" if chat else "prompt"
        if key not in body:
            message = f"'{key}' field is required"
            return openai.error_reply(
                400, message, "invalid_request_error", key, "missing_required_parameter"
            )
        limit = get_int(body, "max_tokens")
        if limit is None:
            limit = get_int(body, "max_completion_tokens")
        gen = generate(view.tokens, count_words(body[key]), limit)
        prefix = "chatcmpl" if chat else "cmpl"
        head = openai.Head(f"{prefix}-{view.next_id()}", int(view.now()), model)
        # LM Studio reports the model id as the system fingerprint.
        flavor = attrs.evolve(FLAVOR, fingerprint=model)
        if body.get("stream") is True:
            stream = openai.chat_stream if chat else openai.text_stream
            return Task.of(stream(flavor, head, gen, include_usage(body)))
        extra = _v0_extra(gen) if v0 else {}
        build = openai.chat_body if chat else openai.text_body
        return Task.of(json_reply(200, build(flavor, head, gen, extra)))

    def _v1_chat(self, view: EngineView, call: Call) -> Answer:
        return self._completion(view, call, chat=True, v0=False)

    def _v1_completions(self, view: EngineView, call: Call) -> Answer:
        return self._completion(view, call, chat=False, v0=False)

    def _v0_chat(self, view: EngineView, call: Call) -> Answer:
        return self._completion(view, call, chat=True, v0=True)

    def _v0_completions(self, view: EngineView, call: Call) -> Answer:
        return self._completion(view, call, chat=False, v0=True)

    def _embeddings(self, view: EngineView, call: Call) -> Reply:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        inputs = body.get("input")
        return json_reply(200, openai.embeddings_body(model, inputs, count_words(inputs)))

    # -- REST v1 chat --------------------------------------------------------------------------

    def _rest_chat(self, view: EngineView, call: Call) -> Answer:
        prepared = self._prepare(view, call)
        if isinstance(prepared, Reply):
            return prepared
        body, model = prepared
        if "input" not in body:
            message = "'input' is required"
            return openai.error_reply(
                400, message, "invalid_request_error", "input", "missing_required_parameter"
            )
        gen = generate(view.tokens, count_words(body["input"]), get_int(body, "max_output_tokens"))
        result = _rest_result(view, model, gen, body)
        if body.get("stream") is not True:
            return Task.of(json_reply(200, result))
        events = [
            sse_event("chat.start", {"type": "chat.start", "model_instance_id": model}),
            sse_event("prompt_processing.start", {"type": "prompt_processing.start"}),
            sse_event("prompt_processing.end", {"type": "prompt_processing.end"}),
            sse_event("message.start", {"type": "message.start"}),
            *(
                sse_event("message.delta", {"type": "message.delta", "content": t})
                for t in gen.tokens
            ),
            sse_event("message.end", {"type": "message.end"}),
            sse_event("chat.end", {"type": "chat.end", "result": result}),
        ]
        return Task.of(Reply(200, tuple(events), SSE_TYPE, streamed=True))


def _rest_result(view: EngineView, model: str, gen: Generation, body: Mapping[str, object]) -> Json:
    """The ``/api/v1/chat`` answer (also the ``result`` of the ``chat.end`` event)."""
    result: Json = {
        "model_instance_id": model,
        "output": [{"type": "message", "content": gen.text}],
        "stats": {
            "input_tokens": gen.prompt_tokens,
            "total_output_tokens": gen.completion_tokens,
            "reasoning_output_tokens": 0,
            "tokens_per_second": gen.tokens_per_second,
            "time_to_first_token_seconds": gen.prompt_ms / 1000,
        },
    }
    if body.get("store") is not False:
        result["response_id"] = f"resp_{view.next_id():048x}"
    return result
