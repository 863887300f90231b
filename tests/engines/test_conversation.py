"""Prefix keys of a request's conversation (docs/fleet-scheduling.md#prefix-keys): what the
next turn shares with the last, from digests only."""

from __future__ import annotations

import json

from nvpair.engines.conversation import BLOCK, MAX_KEYS, MAX_MESSAGES, prefix_keys

SYSTEM = {"role": "system", "content": "be brief"}
HELLO = {"role": "user", "content": "hello"}
REPLY = {"role": "assistant", "content": "hi there"}
NEXT = {"role": "user", "content": "and then?"}


def chat(*messages: object) -> dict[str, object]:
    return {"model": "m", "messages": list(messages)}


def test_each_leading_run_of_messages_has_a_key_and_the_next_turn_shares_them() -> None:
    first = prefix_keys(chat(SYSTEM, HELLO))
    second = prefix_keys(chat(SYSTEM, HELLO, REPLY, NEXT))
    assert len(first) == 2 and len(second) == 4
    assert second[:2] == first
    assert len(set(second)) == 4


def test_the_same_messages_in_another_key_order_or_spacing_give_the_same_keys() -> None:
    body = json.dumps(chat(HELLO, REPLY))
    reordered = '{"messages": [{"content": "hello", "role": "user"},' + (
        ' {"content":"hi there","role":"assistant"}], "model": "m"}'
    )
    assert prefix_keys(json.loads(body)) == prefix_keys(json.loads(reordered))


def test_a_different_message_anywhere_changes_every_key_from_there_on() -> None:
    keys = prefix_keys(chat(HELLO, REPLY, NEXT))
    edited = prefix_keys(chat(HELLO, {"role": "assistant", "content": "hi"}, NEXT))
    assert keys[0] == edited[0]
    assert not set(keys[1:]) & set(edited[1:])


def test_moving_text_between_messages_is_not_the_same_conversation() -> None:
    # Each message is framed by its length: two runs never read as the same bytes.
    assert (
        prefix_keys(chat({"c": "ab"}, {"c": "c"}))[1]
        != prefix_keys(chat({"c": "a"}, {"c": "bc"}))[1]
    )


def test_a_completion_prompt_gives_a_key_per_block_and_the_whole() -> None:
    prompt = "x" * (BLOCK * 2 + 10)
    keys = prefix_keys({"prompt": prompt})
    assert len(keys) == 3
    longer = prefix_keys({"prompt": prompt + " more text"})
    assert longer[:2] == keys[:2] and longer[2] != keys[2]
    assert prefix_keys({"prompt": [prompt]}) == keys


def test_bodies_without_a_conversation_have_no_keys() -> None:
    documents: tuple[object, ...] = (
        None,
        [],
        "text",
        {"model": "m"},
        {"messages": []},
        {"messages": "hello"},
        {"prompt": ""},
        {"prompt": [1, 2, 3]},
        {"prompt": ["a", "b"]},
        {"input": "embed me"},
    )
    for document in documents:
        assert prefix_keys(document) == ()


def test_a_very_long_conversation_gives_only_its_longest_keys() -> None:
    messages = [{"role": "user", "content": str(n)} for n in range(MAX_KEYS + 500)]
    keys = prefix_keys(chat(*messages))
    assert len(keys) == MAX_KEYS
    assert keys[-1] == prefix_keys(chat(*messages))[-1]
    assert keys[0] == prefix_keys(chat(*messages[:501]))[-1]


def test_a_chat_of_more_messages_than_any_context_holds_has_no_keys() -> None:
    # Encoding each of millions of tiny messages would stall the reactor for seconds.
    assert len(prefix_keys(chat(*[{}] * MAX_MESSAGES))) == MAX_KEYS
    assert prefix_keys(chat(*[{}] * (MAX_MESSAGES + 1))) == ()


def test_hostile_values_give_keys_or_none_never_an_error() -> None:
    deep: object = "x"
    for _ in range(100_000):
        deep = [deep]
    assert prefix_keys(chat(HELLO, {"role": "user", "content": deep})) == ()
    # A lone surrogate (json.loads lets "\ud800" through) still has a digest.
    lone = json.loads('{"messages": [{"role": "user", "content": "\\ud800"}]}')
    assert len(prefix_keys(lone)) == 1
    assert len(prefix_keys({"prompt": "\ud800" * 3})) == 1
    assert len(prefix_keys(chat({"n": float("nan")}, {"big": 10**400}))) == 2
