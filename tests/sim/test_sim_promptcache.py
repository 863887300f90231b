# -*- test-case-name: tests.sim.test_sim_promptcache -*-
"""The simulated llama.cpp's prompt cache (issue 23; docs/fleet-scheduling.md#simulated-engines):
each slot keeps the prompt it last read, a request is given the slot that shares most of its
prompt (else the least recently used), a RAM prompt cache keeps what slots gave up, and the
answer reports what was read from cache as llama-server does — first the rules alone, then
over a real socket with treq and the openai SDK."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import openai
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from nvpair.sim import SimEngine
from nvpair.sim.__main__ import main
from nvpair.sim.generation import chat_words, count_words
from nvpair.sim.promptcache import KV_BYTES_PER_TOKEN, PromptCache, Reuse, common_prefix
from tests.sim.test_sim import Start, eventually, fetch, raw_connect, start

__all__ = ["start"]  # listening engines, stopped after each test: a fixture of test_sim


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def served(cache: PromptCache, prompt: Sequence[str], **kwargs: Any) -> Reuse:
    """One request from start to end."""
    reuse = cache.take(prompt, **kwargs)
    cache.release(reuse.slot)
    return reuse


A1 = words("a1 a2 a3 a4 a5 a6 a7 a8")
A2 = A1 + words("r1 r2 q1 q2")
B1 = words("b1 b2 b3 b4 b5 b6 b7 b8")
B2 = B1 + words("r1 r2 q1 q2")

# -- the rules alone ------------------------------------------------------------------------------


def test_the_next_turn_reads_the_turn_before_and_a_repeat_all_but_one_token() -> None:
    cache = PromptCache(1)
    assert served(cache, A1) == Reuse(0, 0)
    assert served(cache, A2) == Reuse(0, len(A1))
    # The whole prompt found: the last token is evaluated again for its logits.
    assert served(cache, A2) == Reuse(0, len(A2) - 1)
    assert cache.kept(0) == A2
    assert served(cache, ()) == Reuse(0, 0)


def test_a_fresh_server_starts_on_its_last_slot_then_the_least_recently_used() -> None:
    cache = PromptCache(3)
    assert [served(cache, p).slot for p in (A1, B1, words("c1 c2"))] == [2, 1, 0]
    # Nothing shared with any slot: the least recently used one, slot 2.
    assert served(cache, words("d1 d2")) == Reuse(2, 0)
    assert cache.kept(2) == words("d1 d2")


def test_a_request_goes_to_the_slot_that_shares_most_of_its_prompt() -> None:
    cache = PromptCache(2)
    assert served(cache, A1).slot == 1 and served(cache, B1).slot == 0
    assert served(cache, B2) == Reuse(0, len(B1))
    assert served(cache, A2) == Reuse(1, len(A1))


def test_a_slot_sharing_no_more_than_a_tenth_is_not_chosen_for_it() -> None:
    ten = words("x a b c d e f g h i")

    def server() -> PromptCache:
        """Slot 0 holds ``ten``; slot 1, the least recently used, B1."""
        cache = PromptCache(2)
        assert served(cache, B1).slot == 1 and served(cache, ten).slot == 0
        return cache

    # One token of ten in common with slot 0 is not more than a tenth: least recently used.
    assert served(server(), words("x z z z z z z z z z")) == Reuse(1, 0)
    # Two are: slot 0, two tokens read from it.
    assert served(server(), words("x a y y y y y y y y")) == Reuse(0, 2)


def test_busy_slots_are_skipped_and_with_every_slot_busy_the_best_is_shared() -> None:
    cache = PromptCache(2)
    first = cache.take(A1)
    assert cache.busy(first.slot)
    # A1's slot is busy with it: its next turn goes to the other slot, which holds nothing.
    second = cache.take(A2)
    assert second.slot != first.slot and second.cached == 0
    # Both busy: the one that shares most, as if the request had waited for it.
    third = cache.take(A2 + words("more"))
    assert third == Reuse(second.slot, len(A2))
    for reuse in (first, second, third):
        cache.release(reuse.slot)
    assert not cache.busy(0) and not cache.busy(1)
    cache.release(0)  # a release too many changes nothing
    assert not cache.busy(0)


def test_the_ram_cache_brings_a_conversation_back_into_the_one_slot() -> None:
    cache = PromptCache(1)
    served(cache, A1)
    served(cache, B1)  # A1 saved in RAM as B1 takes the slot
    assert cache.saved == (A1,)
    assert served(cache, A2) == Reuse(0, len(A1))  # B1 saved, A1 loaded back from RAM
    assert cache.saved == (B1,)
    assert served(cache, B2) == Reuse(0, len(B1))
    assert cache.saved == (A2,)


def test_with_the_ram_cache_off_two_conversations_on_one_slot_evict_each_other() -> None:
    cache = PromptCache(1, cache_ram=0)
    for prompt in (A1, B1, A2, B2):
        assert served(cache, prompt) == Reuse(0, 0)
    assert cache.saved == ()


def test_the_ram_cache_keeps_its_size_oldest_out() -> None:
    # 1 MiB holds 8 tokens of 128 KiB.
    assert 1024 * 1024 // KV_BYTES_PER_TOKEN == 8
    cache = PromptCache(1, cache_ram=1)
    p, q, r = words("p1 p2 p3 p4 p5"), words("q1 q2 q3"), words("r1 r2 r3 r4")
    for prompt in (p, q, r):
        served(cache, prompt)
    # Each prompt went in as the next took the slot: p and q, 8 tokens together.
    assert cache.saved == (p, q)
    served(cache, words("s1 s2 s3 s4 s5 s6 s7 s8 s9"))
    # r made it 12: the oldest, p, went out.
    assert cache.saved == (q, r)
    # A prompt larger than the whole cache is never saved.
    served(cache, words("t1"))
    assert cache.saved == (q, r)
    unbounded = PromptCache(1, cache_ram=-1)
    for n in range(100):
        served(unbounded, words(f"u{n} " * 100))
    assert len(unbounded.saved) == 99


def test_a_saved_prompt_held_whole_is_not_saved_twice_and_its_prefixes_go() -> None:
    cache = PromptCache(1)
    served(cache, A1)
    served(cache, B1)  # A1 saved as B1 takes the slot
    assert cache.saved == (A1,)
    # A request naming its slot skips the choice (and the RAM cache): the slot holds A2 now.
    served(cache, A2, slot=0)
    served(cache, words("c1 c2"))  # A2 saved; A1, which it holds whole, goes
    assert cache.saved == (A2,)
    served(cache, A1, slot=0)
    served(cache, words("d1 d2"))  # A1 is not saved: A2 holds it whole
    assert cache.saved == (A2,)


def test_a_saved_prompt_that_would_keep_under_a_quarter_of_itself_stays_saved() -> None:
    cache = PromptCache(1)
    long = words("l1 l2 l3 l4 l5 l6 l7 l8 l9 l10")
    served(cache, long)
    served(cache, B1)  # long saved
    # Shares 2 of long's 10 tokens: loading it would throw away 80% of it.
    assert served(cache, words("l1 l2 n n n")) == Reuse(0, 0)
    assert long in cache.saved


def test_cache_prompt_false_reads_nothing_but_the_slot_keeps_the_prompt() -> None:
    cache = PromptCache(1)
    served(cache, A1)
    assert served(cache, A2, reuse=False) == Reuse(0, 0)
    assert served(cache, A2) == Reuse(0, len(A2) - 1)


def test_id_slot_names_the_slot_and_wraps_around() -> None:
    cache = PromptCache(2)
    assert served(cache, A1, slot=0) == Reuse(0, 0)
    assert served(cache, A2, slot=3) == Reuse(1, 0)
    assert served(cache, A2, slot=-1) == Reuse(1, len(A2) - 1)


def test_a_server_needs_a_slot_and_a_cache_size() -> None:
    with pytest.raises(ValueError, match="slot"):
        PromptCache(0)
    with pytest.raises(ValueError, match="cache_ram"):
        PromptCache(1, cache_ram=-2)
    with pytest.raises(ValueError, match="parallel"):
        SimEngine(reactor, "llamacpp", models=["tiny"], parallel=0)
    with pytest.raises(SystemExit):
        main(["--serve", "llamacpp", "0", "n", "tiny", "--cache-ram", "-2"])


def test_common_prefix() -> None:
    assert common_prefix("abc", "abd") == 2
    assert common_prefix("", "abc") == 0
    assert common_prefix("abc", "abc") == 3


# -- the chat template's words --------------------------------------------------------------------


def test_a_chat_is_its_template_in_words_and_the_next_turn_starts_with_the_last() -> None:
    first = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "why is"}, {"text": "the sky"}]},
    ]
    rendered = chat_words(first)
    assert rendered == ["<|system|>be", "brief", "<|user|>why", "is", "the", "sky"]
    # Markers join their message's first word: the count is the contents' words.
    assert len(rendered) == count_words(first) == 6
    following = [*first, {"role": "assistant", "content": "blue."}, {"role": "user"}]
    assert chat_words(following)[: len(rendered)] == rendered
    assert chat_words(following)[len(rendered) :] == ["<|assistant|>blue.", "<|user|>"]
    # Another role, or a message boundary elsewhere, is another prompt.
    assert chat_words([{"role": "assistant", "content": "be brief"}])[0] != rendered[0]
    merged = [{"role": "user", "content": "a b"}, {"role": "user", "content": "c"}]
    assert chat_words(merged) != chat_words([{"role": "user", "content": "a b c"}])
    # What is not a list of messages is read for its words; odd roles and items never raise.
    assert chat_words("a b") == ["a", "b"]
    assert chat_words([{"role": 7, "content": "x"}, "y z", 3]) == ["<||>x", "y", "z"]


# -- over a real socket ---------------------------------------------------------------------------

TURN1 = [{"role": "user", "content": "why is the sky blue"}]
TURN2 = [
    *TURN1,
    {"role": "assistant", "content": "Hello from sim."},
    {"role": "user", "content": "and at night"},
]


@pytest_twisted.ensureDeferred
async def test_llamacpp_reports_what_it_read_from_cache_as_llama_server(start: Start) -> None:
    """First turn: all evaluated; next turn: the first one's prompt from cache, the rest
    evaluated (and only that costs prompt time); the same request again: all but one token.
    Reported twice over: ``timings`` and ``usage.prompt_tokens_details``. One slot, so that
    every turn finds it."""
    engine = start("llamacpp", parallel=1)
    url = engine.url + "/v1/chat/completions"

    async def ask(messages: object) -> tuple[dict[str, Any], dict[str, Any]]:
        answer = (await fetch("POST", url, {"messages": messages})).json()
        return answer["usage"], answer["timings"]

    usage, timings = await ask(TURN1)
    assert usage["prompt_tokens"] == 5 and usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert (timings["cache_n"], timings["prompt_n"], timings["prompt_ms"]) == (0, 5, 5.0)
    usage, timings = await ask(TURN2)
    assert usage["prompt_tokens"] == 11 and usage["prompt_tokens_details"]["cached_tokens"] == 5
    assert (timings["cache_n"], timings["prompt_n"], timings["prompt_ms"]) == (5, 6, 6.0)
    assert usage["total_tokens"] == 11 + 4
    usage, timings = await ask(TURN2)
    assert (timings["cache_n"], timings["prompt_n"]) == (10, 1)
    assert engine.prompts.kept(0) == tuple(chat_words(TURN2))
    assert not engine.prompts.busy(0)


@pytest_twisted.ensureDeferred
async def test_llamacpp_streams_and_native_completions_report_the_cache(start: Start) -> None:
    """The streamed usage chunk, a stream's finish chunk without it, the native stop object
    (with the slot it ran in), ``cache_prompt: false`` and ``/v1/completions`` all say what
    was read from cache."""
    engine = start("llamacpp", parallel=2)
    stream = {"messages": TURN1, "stream": True, "stream_options": {"include_usage": True}}
    got = (await fetch("POST", engine.url + "/v1/chat/completions", stream)).data()
    assert got[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    stream["messages"] = TURN2
    del stream["stream_options"]
    finish = (await fetch("POST", engine.url + "/chat/completions", stream)).data()[-1]
    assert (finish["timings"]["cache_n"], finish["timings"]["prompt_n"]) == (5, 6)

    native = {"prompt": "one two three four", "stream": True}
    final = (await fetch("POST", engine.url + "/completion", native)).data()[-1]
    # The chat's slot (1) shares nothing with it: the other one, least recently used.
    assert (final["id_slot"], final["timings"]["cache_n"], final["tokens_evaluated"]) == (0, 0, 4)
    native.update(prompt="one two three four five", stream=False)
    final = (await fetch("POST", engine.url + "/completions", native)).json()
    assert (final["id_slot"], final["timings"]["cache_n"], final["timings"]["prompt_n"]) == (
        0,
        4,
        1,
    )
    final = (
        await fetch("POST", engine.url + "/completion", {**native, "cache_prompt": False})
    ).json()
    assert (final["timings"]["cache_n"], final["timings"]["prompt_n"]) == (0, 5)
    pinned = {"prompt": "one two three four five", "id_slot": 1}
    final = (await fetch("POST", engine.url + "/completion", pinned)).json()
    assert (final["id_slot"], final["timings"]["cache_n"]) == (1, 0)
    text = (
        await fetch(
            "POST", engine.url + "/v1/completions", {"prompt": "one two three four five six"}
        )
    ).json()
    assert text["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    assert text["timings"]["prompt_n"] == 1


@pytest_twisted.ensureDeferred
async def test_a_slot_is_busy_while_its_answer_is_delivered(start: Start) -> None:
    """A stalled answer holds its slot: the conversation's next turn goes to the other slot
    and reads nothing from cache; once the client of the stalled one goes away, the slot is
    free again and the turn after finds it."""
    engine = start("llamacpp", parallel=2)
    engine.faults.stall = True
    held = await raw_connect(engine, "/v1/chat/completions", {"messages": TURN1})
    await eventually(lambda: engine.headers_sent == 1)
    assert engine.prompts.busy(1) and not engine.prompts.busy(0)
    engine.faults.stall = False
    answer = (await fetch("POST", engine.url + "/completion", {"prompt": "why is the sky"})).json()
    assert (answer["id_slot"], answer["timings"]["cache_n"]) == (0, 0)
    assert held.transport is not None
    held.transport.loseConnection()
    await held.ended
    await eventually(lambda: not engine.prompts.busy(1))
    assert engine.abandoned == 1


@pytest_twisted.ensureDeferred
async def test_the_openai_sdk_reads_the_cached_tokens(start: Start) -> None:
    """Through the openai SDK, one slot, two conversations in turn: with the RAM prompt cache
    (the default) each turn finds its conversation's last prompt; with ``cache_ram=0`` each
    evicts the other and nothing is found."""
    with_ram, without = start("llamacpp", parallel=1), start("llamacpp", parallel=1, cache_ram=0)

    def chat(engine: SimEngine, conversations: list[list[dict[str, str]]]) -> list[int]:
        found = []
        client = openai.OpenAI(base_url=engine.url + "/v1", api_key="sim", max_retries=0)
        with client:
            for turn in range(3):
                for n, history in enumerate(conversations):
                    history.append({"role": "user", "content": f"c{n} turn {turn} please"})
                    answer = client.chat.completions.create(model="tiny", messages=history)  # type: ignore[arg-type]
                    assert answer.usage is not None and answer.usage.prompt_tokens_details
                    found.append(answer.usage.prompt_tokens_details.cached_tokens or 0)
                    history.append(
                        {"role": "assistant", "content": answer.choices[0].message.content or ""}
                    )
        return found

    # Each turn is 4 words, each reply 3: a conversation's prompts are 4, 11, 18 tokens long.
    assert await deferToThread(chat, with_ram, [[], []]) == [0, 0, 4, 4, 11, 11]
    assert await deferToThread(chat, without, [[], []]) == [0, 0, 0, 0, 0, 0]
