# -*- test-case-name: tests.sim.test_sim -*-
"""What the simulated model "generates", and the deterministic figures derived from it.

Every number here is exact so tests can assert it:

- the completion is the engine's ``tokens``, one token per streamed chunk, truncated to the
  request's token limit when it sets one (finish reason ``length`` then);
- completion tokens = number of tokens generated;
- prompt tokens = number of whitespace-separated words in the request's prompt text: the string(s)
  in ``prompt`` / ``input`` / ``content``, or each message's ``content`` (a string, or the ``text``
  of its parts), whichever field the route reads;
- the prompt's tokens themselves, where an engine compares prompts (llama.cpp's prompt cache,
  :mod:`nvpair.sim.promptcache`), are those words (:func:`prompt_words`); a chat's are its
  template's rendering (:func:`chat_words`), each message ``<|role|>content``, so roles and
  message boundaries are part of the prompt while the count stays the contents' words;
- the simulated model takes :data:`PROMPT_MS_PER_TOKEN` per prompt token it evaluates (tokens
  read from cache are free), :data:`EVAL_MS_PER_TOKEN` per generated token and :data:`LOAD_MS` to
  load; dialects report durations, speeds and timings computed from these (never from the wall
  clock).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

PROMPT_MS_PER_TOKEN = 1
EVAL_MS_PER_TOKEN = 20
LOAD_MS = 1
EMBEDDING_SIZE = 8


@attrs.frozen
class Generation:
    """One simulated completion.

    :param tokens: the generated tokens, one streamed chunk each.
    :param prompt_tokens: the prompt's token count.
    :param truncated: whether the request's token limit cut the completion short.
    :param cached_tokens: of the prompt's tokens, how many were read from cache rather than
        evaluated (llama.cpp's prompt cache).
    """

    tokens: tuple[str, ...]
    prompt_tokens: int
    truncated: bool = False
    cached_tokens: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def evaluated_tokens(self) -> int:
        """The prompt tokens the model read (those not found in cache)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def prompt_ms(self) -> int:
        return self.evaluated_tokens * PROMPT_MS_PER_TOKEN

    @property
    def eval_ms(self) -> int:
        return self.completion_tokens * EVAL_MS_PER_TOKEN

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 / EVAL_MS_PER_TOKEN


def generate(
    tokens: Sequence[str], prompt_tokens: int, limit: int | None, cached: int = 0
) -> Generation:
    """The completion for a prompt of ``prompt_tokens`` (``cached`` of them read from cache)
    under an optional token ``limit``.

    A negative limit means "no limit", as ``n_predict: -1`` / ``num_predict: -1`` do.
    """
    produced = tuple(tokens)
    if limit is not None and 0 <= limit < len(produced):
        return Generation(produced[:limit], prompt_tokens, truncated=True, cached_tokens=cached)
    return Generation(produced, prompt_tokens, cached_tokens=cached)


def count_words(value: object) -> int:
    """Whitespace-separated words of the prompt text in ``value``.

    Strings count their words; lists add up their items; objects (messages, content parts)
    count only their ``content`` and ``text`` fields, so roles and part types are not words.
    """
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(count_words(item) for item in value)
    if isinstance(value, dict):
        return count_words(value.get("content")) + count_words(value.get("text"))
    return 0


def prompt_words(value: object) -> list[str]:
    """The words :func:`count_words` counts, in order."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [word for item in value for word in prompt_words(item)]
    if isinstance(value, dict):
        return prompt_words(value.get("content")) + prompt_words(value.get("text"))
    return []


def chat_words(messages: object) -> list[str]:
    """A chat's prompt as the simulated chat template renders it, in words: each message
    ``<|role|>`` followed directly by its content, so the marker joins the content's first word
    (a message with no words is its marker alone). The next turn of a conversation (the same
    messages, a reply, a new message) starts with the words of the turn before."""
    if not isinstance(messages, list):
        return prompt_words(messages)
    words: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            words.extend(prompt_words(message))
            continue
        role = message.get("role")
        marker = f"<|{role if isinstance(role, str) else ''}|>"
        content = prompt_words(message)
        words.append(marker + content[0] if content else marker)
        words.extend(content[1:])
    return words


def texts(value: object) -> list[str]:
    """The input strings of an embedding request (``input``: a string or a list of strings)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def embedding(text: str) -> list[float]:
    """A deterministic unit-free vector for ``text``: same text, same vector."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [round((byte - 128) / 128, 6) for byte in digest[:EMBEDDING_SIZE]]


def default_tokens(node: str) -> tuple[str, ...]:
    """The default completion, which names the node so a test can tell who answered."""
    return ("Hello", " from", f" {node}", ".")
