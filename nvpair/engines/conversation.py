"""A request's conversation as prefix keys, what fleet mode's affinity looks up and records
(docs/fleet-scheduling.md#conversations-go-where-their-cache-is).

An engine keeps the prompt it just read: the next turn of a conversation, sent to the same
node, is read from where the last one ended. A key names one leading run of a conversation —
the first k messages of a chat, the first k blocks of a completion prompt — by a digest, so
that two requests sharing a beginning share its keys, and nothing of the text is kept. The
digests are Python's own hash (SipHash, keyed with a secret the process draws at start): 64
bits, cheap, and as good as any digest for a table that lives and dies with the process.

The keys come from the body admission has already parsed (:func:`prefix_keys`); the table
they are recorded in is :mod:`nvpair.control.affinity`'s. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

#: A completion prompt's keys cover it in blocks of this many characters (and the whole).
BLOCK = 1024

#: Most keys one request gives: its longest prefixes. A conversation of more messages still
#: finds its node by its latest ones; a body of a million messages records no more than these.
MAX_KEYS = 1024

#: Most messages a chat may have and still get keys. Each message is encoded on its own, a few
#: microseconds apiece, on the reactor: a body of millions of tiny messages (a 16 MiB body holds
#: five million ``{}``) would stall it for seconds. No chat a model's context holds comes near.
MAX_MESSAGES = 4096

#: Where a chat's chain of keys and a prompt's start, so that neither is ever the other's.
_CHAT, _PROMPT = 0x43484154, 0x50524F4D

#: A message that is not a flat object is encoded in canonical JSON (one encoder, built once).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prefix_keys(document: object) -> tuple[int, ...]:
    """The prefix keys of an inference body, shortest first; () when it has none.

    A chat (``messages``, a non-empty list) gives one per leading run of its messages, each
    message taken as its sorted items (or its canonical JSON), so that a client re-sending the
    same history in another key order or spacing finds the same keys. A completion (``prompt``, a
    string, or a list of one) gives one per leading block of :data:`BLOCK` characters, the
    last one the whole prompt. Anything else (token arrays, embeddings' ``input``, a chat of
    more than :data:`MAX_MESSAGES` messages) gives none.
    """
    if not isinstance(document, dict):
        return ()
    messages = document.get("messages")
    if isinstance(messages, list) and messages:
        if len(messages) > MAX_MESSAGES:
            return ()
        try:
            return _chain(_CHAT, map(_digest, messages))
        except (ValueError, TypeError, RecursionError):
            # Nested past what the encoder takes, or a value it refuses: no affinity for it,
            # the request itself goes on as it came.
            return ()
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return _chain(
            _PROMPT, (hash(prompt[start : start + BLOCK]) for start in range(0, len(prompt), BLOCK))
        )
    return ()


def _digest(message: object) -> int:
    """One message's digest: a flat object's (every value a string, number or null, as chat
    messages mostly are) from its sorted items, anything else from its canonical JSON. Either
    way the order of its keys and the spacing of the body do not matter."""
    if type(message) is dict:
        try:
            return hash(tuple(sorted(message.items())))
        except TypeError:
            pass  # a value that is a list or an object: content in parts, tool calls
    return hash(_CANONICAL.encode(message))


def _chain(start: int, digests: Iterable[int]) -> tuple[int, ...]:
    """One key per leading run of the pieces ``digests`` stand for: the k-th covers the first
    k, as the digest of the (k-1)-th key and the k-th piece's digest."""
    keys: list[int] = []
    key = start
    for digest in digests:
        key = hash((key, digest))
        keys.append(key)
    return tuple(keys[-MAX_KEYS:])
