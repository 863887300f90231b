"""The multi-turn bench's seeded conversations and the requests built from them."""

from __future__ import annotations

import json
from random import Random

import attrs
import pytest

from bench.conversations import (
    WORDS,
    ChatMix,
    chat_mix,
    fitted,
    history,
    offered_requests_per_second,
    request_body,
    user_text,
)

#: Characters per token as the bench measured them on its model's tokenizer (about 1.06).
CPT = 1.06


def test_the_same_seed_gives_the_same_conversations() -> None:
    """Both sides of a round send the same messages at the same moments."""
    assert chat_mix(23, ChatMix(), CPT) == chat_mix(23, ChatMix(), CPT)
    assert chat_mix(24, ChatMix(), CPT) != chat_mix(23, ChatMix(), CPT)


def test_the_default_mix_is_what_the_issue_asks() -> None:
    """At least 24 conversations of six turns, answers of at most 32 tokens."""
    mix = ChatMix()
    conversations = chat_mix(23, mix, CPT)
    assert len(conversations) == mix.conversations >= 24
    assert all(len(c.messages) == mix.turns == 6 for c in conversations)
    assert all(len(c.thinks) == mix.turns - 1 for c in conversations)
    assert mix.max_tokens <= 32


def test_messages_are_sized_in_tokens_through_the_measured_ratio() -> None:
    """150-300 tokens a message: at ``CPT`` characters a token, that many characters times it,
    up to a word (the bench then fits each one with the engine's tokenizer: ``fitted``)."""
    mix = ChatMix()
    lengths = [len(m) for c in chat_mix(5, mix, CPT) for m in c.messages]
    low, high = mix.user_tokens
    longest = max(len(w) for w in WORDS)
    assert min(lengths) >= round(low * CPT) - longest - 1
    assert max(lengths) <= round(high * CPT)
    # Uniform between the bounds: both ends are reached over 144 messages.
    assert min(lengths) < round((low + 20) * CPT) and max(lengths) > round((high - 20) * CPT)


def test_user_text_is_whole_words_and_a_full_stop_of_about_the_asked_length() -> None:
    longest = max(len(w) for w in WORDS)
    for tokens in (2, 150, 300):
        text = user_text(Random(tokens), tokens, 1.5)
        target = round(tokens * 1.5)
        assert target - longest - 1 <= len(text) <= max(target, longest + 1)
        assert text.endswith(".") and ".." not in text and "  " not in text
        assert all(w in WORDS for w in text.rstrip(".").split(" "))


def test_every_conversation_opens_with_its_own_message() -> None:
    """No shared system prompt: the first messages part after their first few words."""
    conversations = chat_mix(23, ChatMix(), CPT)
    openings = [c.messages[0][:40] for c in conversations]
    assert len(set(openings)) == len(openings)


def test_starts_are_staggered_and_think_times_within_bounds() -> None:
    mix = ChatMix(conversations=200)
    conversations = chat_mix(7, mix, CPT)
    starts = [c.start for c in conversations]
    assert starts == sorted(starts)
    for index, start in enumerate(starts):
        assert index * mix.stagger <= start <= (index + 1) * mix.stagger
    thinks = [t for c in conversations for t in c.thinks]
    assert all(mix.think[0] <= t <= mix.think[1] for t in thinks)
    assert sum(thinks) / len(thinks) == pytest.approx(sum(mix.think) / 2, rel=0.05)


def test_history_is_every_earlier_turn_with_its_actual_answer_then_the_new_message() -> None:
    conversation = chat_mix(1, ChatMix(conversations=1, turns=3), CPT)[0]
    first, second, third = conversation.messages
    assert history(conversation, [], 0) == [{"role": "user", "content": first}]
    assert history(conversation, ["A1", "A2"], 2) == [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": second},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": third},
    ]
    # Turn 2's request starts with turn 1's exactly: the prefix an engine has in cache.
    assert history(conversation, ["A1"], 1)[:1] == history(conversation, [], 0)


def test_a_shared_system_prompt_opens_every_request_of_every_conversation() -> None:
    one, two = (
        attrs.evolve(c, system="S") for c in chat_mix(1, ChatMix(conversations=2, turns=2), CPT)
    )
    system = {"role": "system", "content": "S"}
    assert history(one, [], 0) == [system, {"role": "user", "content": one.messages[0]}]
    assert history(one, ["A1"], 1)[:2] == history(one, [], 0)
    assert history(two, [], 0)[0] == system


def test_history_refuses_a_turn_it_cannot_build() -> None:
    conversation = chat_mix(1, ChatMix(conversations=1, turns=2), CPT)[0]
    with pytest.raises(ValueError):
        history(conversation, [], 1)
    with pytest.raises(ValueError):
        history(conversation, ["a", "b"], 2)
    with pytest.raises(ValueError):
        chat_mix(1, ChatMix(), 0)


def test_a_request_is_a_greedy_streamed_chat_completion() -> None:
    messages = [{"role": "user", "content": "hello"}]
    body = json.loads(request_body("mt", messages, 32))
    assert body == {
        "model": "mt",
        "messages": messages,
        "stream": True,
        "max_tokens": 32,
        "temperature": 0,
    }


def test_the_offered_rate_is_conversations_over_the_mean_think_time() -> None:
    assert offered_requests_per_second(ChatMix(conversations=22, think=(2.0, 9.0))) == 4.0


def by_characters(text: str) -> int:
    """A stand-in tokenizer: one token a character."""
    return len(text)


def test_a_message_outside_the_range_is_fitted_into_it_by_whole_words() -> None:
    long = user_text(Random(1), 320, 1.0)
    short = user_text(Random(2), 140, 1.0)
    for text in (long, short):
        fit = fitted(text, by_characters, 150, 300)
        assert 150 <= len(fit) <= 300 and fit.endswith(".")
        assert all(word in WORDS for word in fit.rstrip(".").split(" ")[:-1])
    within = user_text(Random(3), 200, 1.0)
    assert fitted(within, by_characters, 150, 300) == within  # nothing to change


def test_a_range_no_words_can_reach_is_an_error_not_a_loop() -> None:
    with pytest.raises(ValueError):
        fitted("a b c.", lambda text: 1000, 150, 300)  # even one word is too long
    with pytest.raises(ValueError):
        fitted("a b c.", lambda text: 0, 150, 300)  # words never count
