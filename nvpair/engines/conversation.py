"""A request's conversation as prefix keys, what fleet mode's affinity looks up and records
(docs/fleet-scheduling.md#conversations-go-where-their-cache-is).

An engine keeps the prompt it just read: the next turn of a conversation, sent to the same
node, is read from where the last one ended. A key names one leading run of a conversation —
the first k messages of a chat, the first k blocks of a completion prompt — by a digest, so
that two requests sharing a beginning share its keys, and nothing of the text is kept.

The keys come from the body admission has already parsed (:func:`prefix_keys`); the table
they are recorded in is :mod:`nvpair.control.affinity`'s. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from hashlib import blake2b

#: A completion prompt's keys cover it in blocks of this many characters (and the whole).
BLOCK = 1024

#: Most keys one request gives: its longest prefixes. A conversation of more messages still
#: finds its node by its latest ones; a body of a million messages records no more than these.
MAX_KEYS = 1024

#: Bytes of each digest: 64 bits keep a collision between two of a full table's prefixes
#: below one in a hundred million, in a key a quarter the size of a 32-byte one.
_DIGEST = 8


def prefix_keys(document: object) -> tuple[int, ...]:
    """The prefix keys of an inference body, shortest first; () when it has none.

    A chat (``messages``, a non-empty list) gives one per leading run of its messages, each
    message in canonical JSON (sorted keys, no spaces), so that a client re-sending the same
    history in another key order or spacing finds the same keys. A completion (``prompt``, a
    string, or a list of one) gives one per leading block of :data:`BLOCK` characters, the
    last one the whole prompt. Anything else (token arrays, embeddings' ``input``) gives none.
    """
    if not isinstance(document, dict):
        return ()
    messages = document.get("messages")
    if isinstance(messages, list) and messages:
        try:
            return _chain(_canonical(message) for message in messages)
        except (ValueError, TypeError, RecursionError):
            # Nested past what the encoder takes, or a value it refuses: no affinity for it,
            # the request itself goes on as it came.
            return ()
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return _chain(
            prompt[start : start + BLOCK].encode("utf-8", "surrogatepass")
            for start in range(0, len(prompt), BLOCK)
        )
    return ()


def _canonical(message: object) -> bytes:
    text = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def _chain(pieces: Iterable[bytes]) -> tuple[int, ...]:
    """One digest per leading run of ``pieces``: the k-th covers the first k, each piece
    framed by its length so that no two different runs read as the same bytes."""
    running = blake2b(digest_size=_DIGEST)
    keys: list[int] = []
    for piece in pieces:
        running.update(len(piece).to_bytes(8, "big"))
        running.update(piece)
        keys.append(int.from_bytes(running.copy().digest(), "big"))
    return tuple(keys[-MAX_KEYS:])
