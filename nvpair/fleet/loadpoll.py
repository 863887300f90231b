"""Asking one engine for its load: the I/O half of :mod:`nvpair.engines.loadstate`
(docs/fleet-scheduling.md#load-state).

Every route of the engine's :class:`~nvpair.engines.loadstate.LoadProbe` is asked at once; then,
when those answers call for it, the follow-up routes one at a time (a llama.cpp router: each
loaded model's slots, docs/fleet-scheduling.md#llamacpp-router-mode). Each request is the
caller's to bound. A request that fails says nothing this time, and never fails the reading:
what the answers mean is the pure module's to say.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred

from nvpair.engines.loadstate import Answer, LoadProbe, LoadState

#: One bounded GET of a route on the engine.
Ask = Callable[[str], Coroutine[Any, Any, Answer]]


async def _answer(ask: Ask, path: str) -> Answer | None:
    try:
        return await ask(path)
    except CancelledError:
        raise
    except Exception:
        # Refused, reset, timed out, too large: this route says nothing this time.
        return None


def _each(ask: Ask, paths: Sequence[str]) -> Deferred[list[Answer | None]]:
    """Every path at once; cancelling the result cancels each request still out."""
    return defer.gatherResults(
        [Deferred.fromCoroutine(_answer(ask, path)) for path in paths], consumeErrors=True
    )


async def read_load(probe: LoadProbe, key: Callable[[str], str], ask: Ask) -> LoadState:
    """The engine's load as ``probe`` reads it, asking with ``ask``.

    :param key: the engine's model-key function.
    """
    first = await _each(ask, probe.paths)
    state = probe.read(first, key)
    more = probe.follow_up(first)
    if not more:
        return state
    # One at a time: a router counts each probe as a request in flight on its model, and a
    # model with one in flight cannot be evicted, so probing every model at once would pin
    # them all and fail a load that needs an eviction just then
    # (docs/fleet-scheduling.md#one-probe-at-a-time).
    answers = [(model, await _answer(ask, path)) for model, path in more]
    return probe.read_follow_up(state, answers, key)
