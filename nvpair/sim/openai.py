# -*- test-case-name: tests.sim.test_sim -*-
"""OpenAI-compatible response bodies and SSE streams; each engine's quirks are a :class:`Flavor`.

All three engines serve ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``; they
differ in small ways that the flavor switches on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from nvpair.sim.generation import Generation, embedding, texts
from nvpair.sim.wire import SSE_DONE, SSE_TYPE, Reply, json_reply, sse_data

Json = dict[str, object]


@attrs.frozen
class Flavor:
    """How one engine's OpenAI-compatible answers differ from the others.

    :param fingerprint: ``system_fingerprint`` value, or ``None`` to omit it.
    :param role_chunk: ``True``: a first chat chunk carries only the role (LM Studio,
        llama.cpp); ``False``: the role rides on the first content chunk (Ollama).
    :param role_chunk_content: ``delta.content`` of that role chunk (llama.cpp sends ``null``).
    :param logprobs: whether choices carry ``"logprobs": null``.
    :param zero_usage_on_text_chunks: Ollama's ``/v1/completions`` quirk: with ``include_usage``
        every chunk carries an all-zero ``usage``.
    :param usage_details: whether ``usage`` has ``prompt_tokens_details`` (llama.cpp): the
        prompt tokens read from cache.
    :param extra: fields added to the final result: the whole body, the usage chunk, or (without
        ``include_usage``) the finish chunk — llama.cpp's ``timings``.
    """

    fingerprint: str | None = None
    role_chunk: bool = True
    role_chunk_content: str | None = ""
    logprobs: bool = False
    zero_usage_on_text_chunks: bool = False
    usage_details: bool = False
    extra: Callable[[Generation], Json] | None = None

    def final_extra(self, gen: Generation) -> Json:
        return self.extra(gen) if self.extra is not None else {}


def finish_reason(gen: Generation) -> str:
    """``length`` when the token limit cut the completion short, else ``stop``."""
    return "length" if gen.truncated else "stop"


def usage(flavor: Flavor, gen: Generation) -> Json:
    """The ``usage`` object for ``gen``."""
    result: Json = {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": gen.total_tokens,
    }
    if flavor.usage_details:
        result["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens}
    return result


@attrs.frozen
class Head:
    """The fields every object of one completion shares."""

    id: str
    created: int
    model: str


def _base(flavor: Flavor, head: Head, obj: str) -> Json:
    result: Json = {"id": head.id, "object": obj, "created": head.created, "model": head.model}
    if flavor.fingerprint is not None:
        result["system_fingerprint"] = flavor.fingerprint
    return result


def _choice(flavor: Flavor, fields: Json, finish: str | None) -> Json:
    choice: Json = {"index": 0, **fields}
    if flavor.logprobs:
        choice["logprobs"] = None
    choice["finish_reason"] = finish
    return choice


def chat_body(flavor: Flavor, head: Head, gen: Generation, extra: Mapping[str, object]) -> Json:
    """A non-streamed ``chat.completion``; ``extra`` adds top-level fields (LM Studio stats)."""
    message = {"role": "assistant", "content": gen.text}
    return {
        **_base(flavor, head, "chat.completion"),
        "choices": [_choice(flavor, {"message": message}, finish_reason(gen))],
        "usage": usage(flavor, gen),
        **flavor.final_extra(gen),
        **extra,
    }


def text_body(flavor: Flavor, head: Head, gen: Generation, extra: Mapping[str, object]) -> Json:
    """A non-streamed ``text_completion``."""
    return {
        **_base(flavor, head, "text_completion"),
        "choices": [_text_choice(gen.text, finish_reason(gen))],
        "usage": usage(flavor, gen),
        **flavor.final_extra(gen),
        **extra,
    }


def chat_stream(flavor: Flavor, head: Head, gen: Generation, with_usage: bool) -> Reply:
    """A streamed chat completion: (role chunk), one chunk per token, the finish chunk, the
    usage chunk when asked for, then ``[DONE]``."""
    base = _base(flavor, head, "chat.completion.chunk")
    events: list[bytes] = []
    if flavor.role_chunk:
        delta: Json = {"role": "assistant", "content": flavor.role_chunk_content}
        events.append(sse_data({**base, "choices": [_choice(flavor, {"delta": delta}, None)]}))
    for i, token in enumerate(gen.tokens):
        delta = {"content": token}
        if i == 0 and not flavor.role_chunk:
            delta = {"role": "assistant", "content": token}
        events.append(sse_data({**base, "choices": [_choice(flavor, {"delta": delta}, None)]}))
    finish: Json = {**base, "choices": [_choice(flavor, {"delta": {}}, finish_reason(gen))]}
    events.extend(_tail(flavor, base, gen, finish, with_usage))
    return Reply(200, tuple(events), SSE_TYPE, streamed=True)


def text_stream(flavor: Flavor, head: Head, gen: Generation, with_usage: bool) -> Reply:
    """A streamed text completion: one chunk per token, the finish chunk, the usage chunk when
    asked for, then ``[DONE]``."""
    base = _base(flavor, head, "text_completion")
    zero: Json = {}
    if with_usage and flavor.zero_usage_on_text_chunks:
        zero = {"usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    events = [
        sse_data({**base, "choices": [_text_choice(token, None)], **zero}) for token in gen.tokens
    ]
    finish: Json = {**base, "choices": [_text_choice("", finish_reason(gen))], **zero}
    events.extend(_tail(flavor, base, gen, finish, with_usage))
    return Reply(200, tuple(events), SSE_TYPE, streamed=True)


def _text_choice(text: str, finish: str | None) -> Json:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


def _tail(
    flavor: Flavor, base: Json, gen: Generation, finish: Json, with_usage: bool
) -> list[bytes]:
    extra = flavor.final_extra(gen)
    if not with_usage:
        # Without include_usage there is no usage chunk; llama.cpp's timings ride on the finish
        # chunk instead.
        return [sse_data({**finish, **extra}), SSE_DONE]
    usage_chunk: Json = {**base, "choices": [], "usage": usage(flavor, gen), **extra}
    return [sse_data(finish), sse_data(usage_chunk), SSE_DONE]


def embeddings_body(model: str, inputs: object, prompt_tokens: int) -> Json:
    """An OpenAI ``/v1/embeddings`` list."""
    data = [
        {"object": "embedding", "embedding": embedding(text), "index": i}
        for i, text in enumerate(texts(inputs))
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> Json:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_reply(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> Reply:
    """An OpenAI-style error reply."""
    return json_reply(status, error_body(message, kind, param, code))
