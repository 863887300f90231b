"""Pure: the multi-turn bench's seeded conversations and the requests a chat client sends.

Each conversation has its own first message (no system prompt shared between conversations), six
user messages of 150-300 tokens each, a think time between an answer and the next message, and a
start time, staggered. The same seed gives the same conversations, byte for byte, so both sides of
a round (affinity on, affinity off) send the same user messages at the same moments; what differs
is only where the proxy sends them.

A request for turn ``k`` carries the whole conversation so far, as a chat client sends it: every
earlier user message with the assistant's actual answer to it, then the new message
(:func:`history`). The answers come from the engines, so they are passed in, not drawn here.

Nothing here does I/O: :mod:`bench.chatclient` sends the requests and :mod:`bench.multiturn`
runs the engines.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

import attrs

_WORD_TEXT = (
    "the of and to in is it that for you was on are with as be this have from or one had by "
    "but not what all were we when your can said there use an each which she do how their if "
    "will up other about out many then them these so some her would make like him into time has "
    "look two more write go see number no way could people my than first water been call who oil "
    "its now find long down day did get come made may part over new sound take only little work "
    "know place year live me back give most very after thing our just name good sentence man "
    "think say great where help through much before line right too mean old any same tell boy "
    "follow came want show also around form three small set put end does another well large must "
    "big even such because turn here why ask went men read need land different home us move try "
    "kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high every near add food between own below "
    "country plant last school father keep tree never start city earth eye light thought head "
    "under story saw left few while along might close something seem next hard open example begin "
    "life always those both paper together got group often run important until children side feet "
    "car mile night walk white sea began grow took river four carry state once book hear stop "
    "without second later miss idea enough eat face watch far really almost let above girl "
    "sometimes mountain cut young talk soon list song being leave family"
)
#: Words a user message is made of: common English, drawn at random, so that two conversations'
#: first messages part after a word or two and no conversation shares another's prefix.
WORDS = tuple(_WORD_TEXT.split())


@attrs.frozen
class ChatMix:
    """The shape of the conversations.

    :param conversations: how many.
    :param turns: user messages per conversation.
    :param user_tokens: the least and most tokens a user message has (uniform between).
    :param think: the least and most seconds between an answer and the next message.
    :param stagger: seconds between two conversations' starts, on average (the first starts
        within one stagger of the run's start, the last within one of ``conversations *
        stagger``).
    :param max_tokens: the most tokens an answer has (``max_tokens``).
    """

    conversations: int = 24
    turns: int = 6
    user_tokens: tuple[int, int] = (150, 300)
    think: tuple[float, float] = (5.0, 15.0)
    stagger: float = 2.0
    max_tokens: int = 32


@attrs.frozen
class Conversation:
    """One conversation: when it starts, its user messages, and the think time after each answer
    but the last (one fewer than the messages)."""

    index: int
    start: float
    messages: tuple[str, ...]
    thinks: tuple[float, ...]
    #: A system prompt that opens every request of it (the shared-prefix part: one for all).
    system: str = ""


def user_text(rng: random.Random, tokens: int, chars_per_token: float) -> str:
    """Whole words drawn from :data:`WORDS` and a full stop, as many as fit in about ``tokens``
    tokens, as ``chars_per_token`` (measured on the engine's own tokenizer) says."""
    target = max(2, round(tokens * chars_per_token))
    words = [rng.choice(WORDS)]
    length = len(words[0]) + 1
    while True:
        word = rng.choice(WORDS)
        if length + len(word) + 1 > target:
            return " ".join(words) + "."
        words.append(word)
        length += len(word) + 1


def fitted(text: str, count: Callable[[str], int], low: int, high: int) -> str:
    """``text`` with words taken off its end, or common words added, until ``count`` (the
    engine's tokenizer) makes it ``low``..``high`` tokens; ValueError when no number of words
    does (a ratio of characters to tokens is an average: a message can land a few outside)."""
    words = text.rstrip(".").split(" ")
    for _ in range(4 * high):
        tokens = count(" ".join(words) + ".")
        if tokens > high and len(words) > 1:
            words.pop()
        elif tokens < low:
            words.append(WORDS[len(words) % len(WORDS)])
        elif low <= tokens <= high:
            return " ".join(words) + "."
        else:
            break
    raise ValueError(f"no words make {low}-{high} tokens of {text[:40]!r}...")


def chat_mix(seed: int, mix: ChatMix, chars_per_token: float) -> tuple[Conversation, ...]:
    """The conversations of one round, by start time; the same arguments, the same round."""
    if chars_per_token <= 0:
        raise ValueError("chars_per_token must be positive")
    rng = random.Random(seed)
    low, high = mix.user_tokens
    out = []
    for index in range(mix.conversations):
        start = (index + rng.random()) * mix.stagger
        messages = tuple(
            user_text(rng, rng.randint(low, high), chars_per_token) for _ in range(mix.turns)
        )
        thinks = tuple(round(rng.uniform(*mix.think), 3) for _ in range(mix.turns - 1))
        out.append(Conversation(index, round(start, 3), messages, thinks))
    return tuple(out)


def history(conversation: Conversation, replies: Sequence[str], turn: int) -> list[dict[str, str]]:
    """The messages a chat client sends on ``turn`` (0-based): each earlier user message and
    the assistant's answer to it (``replies``, as the engine gave them), then the new message."""
    if not 0 <= turn < len(conversation.messages):
        raise ValueError(f"turn {turn} of a conversation of {len(conversation.messages)}")
    if len(replies) < turn:
        raise ValueError(f"turn {turn} needs {turn} earlier answers, not {len(replies)}")
    messages: list[dict[str, str]] = []
    if conversation.system:
        messages.append({"role": "system", "content": conversation.system})
    for earlier in range(turn):
        messages.append({"role": "user", "content": conversation.messages[earlier]})
        messages.append({"role": "assistant", "content": replies[earlier]})
    messages.append({"role": "user", "content": conversation.messages[turn]})
    return messages


def request_body(model: str, messages: Sequence[dict[str, str]], max_tokens: int) -> bytes:
    """A streamed chat completion, greedy (temperature 0), at most ``max_tokens`` tokens."""
    payload = {
        "model": model,
        "messages": list(messages),
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return json.dumps(payload).encode()


def offered_requests_per_second(mix: ChatMix) -> float:
    """Turns sent per second while every conversation runs, ignoring the answers' own time:
    each conversation sends one message per mean think time."""
    mean_think = sum(mix.think) / 2
    return mix.conversations / mean_think
