# -*- test-case-name: tests.sim.test_sim_promptcache -*-
"""llama-server's prompt cache, over the simulator's tokens (words): which slot a request is
given, how much of its prompt it finds there, and the RAM prompt cache behind the slots
(docs/fleet-scheduling.md#simulated-engines).

The rules are llama-server's (``get_available_slot`` and ``server_prompt_cache``):

- **Each slot keeps the prompt it last read.** A request is given the idle slot whose kept
  prompt shares the longest prefix with its own, when that prefix is more than
  :data:`SIMILARITY` of the request's prompt (``--slot-prompt-similarity``); otherwise the
  least recently used idle slot (of equals, the last one: a fresh server starts on its highest
  slot). With every slot busy the request waits until one frees, as the real server defers it
  (:mod:`nvpair.sim.turns`): a slot is only ever taken idle. An embedding or a rerank takes the
  least recently used idle slot and leaves its kept prompt alone (:meth:`PromptCache.occupy`).
- **The RAM prompt cache** (``--cache-ram``, :data:`DEFAULT_CACHE_RAM_MIB` MiB by default, 0
  off, -1 unbounded) keeps prompts slots gave up. When a slot is taken by least-recent use, or
  by similarity while keeping under :data:`KEEP_ON_SWITCH` of its prompt, its prompt is saved
  there first (unless a saved one already holds it whole; saved ones it holds whole go). Then
  the saved prompt sharing most with the request — both a larger part of itself kept and a
  larger part of the request covered than the slot's own, and at least :data:`MIN_KEEP` of
  itself kept — is moved into the slot. The oldest saved prompts go when the RAM is over its
  size, a token taking :data:`KV_BYTES_PER_TOKEN`.
- **The answer** reads from cache the prefix it shares with the slot's prompt, but at least
  one token is evaluated (the last one gives the logits): the same request twice finds all but
  one token. ``cache_prompt: false`` reads nothing from cache. Either way the slot keeps the
  request's prompt from then on.

Not modelled: a slot's context size (a kept prompt is never shifted or truncated), the tokens a
slot generated (only the prompt is kept), what an embedding or a rerank leaves in its slot,
multimodal prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

#: ``--slot-prompt-similarity``'s default: the share of a request's prompt a slot's kept
#: prompt must cover for the request to be given that slot rather than the least recently used.
SIMILARITY = 0.1
#: A slot taken by similarity that keeps less than this share of its prompt saves it first.
KEEP_ON_SWITCH = 0.5
#: A saved prompt is loaded into a slot only if at least this share of it is kept.
MIN_KEEP = 0.25
#: ``--cache-ram``'s default, in MiB.
DEFAULT_CACHE_RAM_MIB = 8192
#: What a token's keys and values take in RAM: an 8B model with grouped-query attention
#: (32 layers, 8 KV heads of 128, 16-bit) takes 128 KiB.
KV_BYTES_PER_TOKEN = 128 * 1024

Prompt = tuple[str, ...]


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@attrs.frozen
class Reuse:
    """What a request found: the slot it runs in and how many of its prompt tokens it read from
    cache (:attr:`cached`) rather than evaluating them."""

    slot: int
    cached: int


@attrs.define
class _Slot:
    kept: Prompt = ()
    last_used: int = -1
    busy: int = 0


class PromptCache:
    """One llama-server's slots and RAM prompt cache.

    :param slots: how many slots (``--parallel``).
    :param cache_ram: the RAM prompt cache's size in MiB (``--cache-ram``): 0 off, -1 unbounded.
    """

    def __init__(self, slots: int, cache_ram: int = DEFAULT_CACHE_RAM_MIB) -> None:
        if slots < 1:
            raise ValueError("a server has at least one slot")
        if cache_ram < -1:
            raise ValueError("cache_ram is MiB, 0 (off) or -1 (unbounded)")
        self._slots = [_Slot() for _ in range(slots)]
        self._budget = None if cache_ram == -1 else cache_ram * 1024 * 1024 // KV_BYTES_PER_TOKEN
        #: Saved prompts, oldest first.
        self._saved: list[Prompt] = []
        self._uses = 0

    # -- what a test reads ---------------------------------------------------------------------

    def kept(self, slot: int) -> Prompt:
        """The prompt ``slot`` holds."""
        return self._slots[slot].kept

    @property
    def saved(self) -> tuple[Prompt, ...]:
        """The RAM prompt cache's prompts, oldest first."""
        return tuple(self._saved)

    def busy(self, slot: int) -> bool:
        return self._slots[slot].busy > 0

    # -- a request -----------------------------------------------------------------------------

    def take(self, prompt: Sequence[str], reuse: bool = True, slot: int | None = None) -> Reuse:
        """A request for ``prompt`` starts: the slot it is given is busy until
        :meth:`release`, and keeps ``prompt``. ``reuse``: the request's ``cache_prompt``;
        ``slot``: its ``id_slot`` (-1 or None: any; past the last slot it wraps around)."""
        tokens = tuple(prompt)
        if slot is None or slot < 0:
            slot = self._choose(tokens)
        else:
            slot %= len(self._slots)
        chosen = self._slots[slot]
        found = common_prefix(chosen.kept, tokens) if reuse else 0
        self._uses += 1
        chosen.kept, chosen.last_used, chosen.busy = tokens, self._uses, chosen.busy + 1
        return Reuse(slot, min(found, max(len(tokens) - 1, 0)))

    def occupy(self) -> int:
        """A request that keeps no prompt (an embedding, a rerank) starts: it is given the least
        recently used idle slot, busy until :meth:`release`, whose kept prompt stays."""
        slot = self._least_recently_used(self._candidates())
        self._slots[slot].busy += 1
        return slot

    def release(self, slot: int) -> None:
        """The request that took ``slot`` has ended."""
        chosen = self._slots[slot]
        chosen.busy = max(0, chosen.busy - 1)

    # -- llama-server's rules ------------------------------------------------------------------

    def _candidates(self) -> list[int]:
        # The engine hands out a slot only when one is idle; all of them is a last resort.
        idle = [i for i, s in enumerate(self._slots) if not s.busy]
        return idle or list(range(len(self._slots)))

    def _least_recently_used(self, candidates: list[int]) -> int:
        """Of equals, the last: a fresh server starts on its highest slot."""
        lru = candidates[0]
        for i in candidates:
            if self._slots[i].last_used <= self._slots[lru].last_used:
                lru = i
        return lru

    def _choose(self, tokens: Prompt) -> int:
        candidates = self._candidates()
        best, best_share = None, 0.0
        for i in candidates:
            kept = self._slots[i].kept
            if not kept or not tokens:
                continue
            share = common_prefix(kept, tokens) / len(tokens)
            if share > best_share and share > SIMILARITY:
                best, best_share = i, share
        if best is not None:
            kept = self._slots[best].kept
            if best_share * len(tokens) / len(kept) < KEEP_ON_SWITCH:
                self._switch(best, tokens)
            return best
        lru = self._least_recently_used(candidates)
        self._switch(lru, tokens)
        return lru

    def _switch(self, slot: int, tokens: Prompt) -> None:
        """``slot`` is about to lose most of its prompt to ``tokens``: save that prompt in
        RAM, and load the saved prompt that serves ``tokens`` best in its place."""
        chosen = self._slots[slot]
        if self._budget == 0 or not chosen.kept:
            return
        self._save(chosen.kept)
        found = common_prefix(chosen.kept, tokens)
        keep_best = found / len(chosen.kept)
        cover_best = found / len(tokens) if tokens else 0.0
        best = None
        for index, saved in enumerate(self._saved):
            shared = common_prefix(saved, tokens)
            keep, cover = shared / len(saved), (shared / len(tokens) if tokens else 0.0)
            if keep >= MIN_KEEP and keep > keep_best and cover > cover_best:
                best, keep_best, cover_best = index, keep, cover
        if best is not None:
            chosen.kept = self._saved.pop(best)

    def _save(self, prompt: Prompt) -> None:
        if any(common_prefix(saved, prompt) == len(prompt) for saved in self._saved):
            return  # already held whole
        if self._budget is not None and len(prompt) > self._budget:
            return  # larger than the whole cache
        self._saved = [saved for saved in self._saved if common_prefix(saved, prompt) != len(saved)]
        self._saved.append(prompt)
        if self._budget is not None:
            while sum(len(saved) for saved in self._saved) > self._budget:
                self._saved.pop(0)
