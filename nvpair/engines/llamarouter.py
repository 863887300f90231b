"""llama.cpp router mode, read: which models a router holds, and where each one's slots are
(docs/fleet-scheduling.md#llamacpp-router-mode).

A ``llama-server`` started without a model (``--models-dir``, ``--models-preset``) serves
several, each in a server instance of its own that it starts on demand, and lists every one in
``GET /v1/models`` with ``status.value``: ``loaded``, ``loading``, ``unloaded``, ``sleeping``.
Its ``/slots`` wants ``?model=`` (400 without it), and a model named there that is not loaded
would be loaded by the asking — so only loaded models are asked after, and with
``autoload=false``: a model unloaded in between then answers 400 instead of being loaded by a
poll. Pure: parsed JSON in, names and paths out.
"""

from __future__ import annotations

from urllib.parse import quote

#: The ``status.value`` of a model the router holds in memory.
LOADED = "loaded"

#: The ``status.value`` of a model it is loading now.
LOADING = "loading"

#: The ``status.value`` of a model whose instance sleeps (``--sleep-idle-seconds``): out of
#: memory until a request wakes it.
SLEEPING = "sleeping"

#: Per poll, the most loaded models whose slots are asked after: ``--models-max`` is 4 by
#: default, and a list that claims thousands must not cost thousands of requests.
MAX_SLOT_READS = 16


def router_statuses(document: object) -> list[tuple[str, str]] | None:
    """``(id, status)`` of every model of a router's ``/v1/models``, in its order; None when
    the document is not a router's list: not an object with a ``data`` list of entries with a
    string ``id``, or no entry carrying ``status`` (a server started with ``-m`` lists its
    model without one). An entry whose ``status`` is not an object with a string ``value``
    makes the whole list unreadable (None) rather than be guessed at.
    """
    if not isinstance(document, dict):
        return None
    entries = document.get("data")
    if not isinstance(entries, list) or not entries:
        return None
    if not any(isinstance(entry, dict) and "status" in entry for entry in entries):
        return None
    statuses: list[tuple[str, str]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        model, status = entry.get("id"), entry.get("status")
        if not isinstance(model, str) or not isinstance(status, dict):
            return None
        value = status.get("value")
        if not isinstance(value, str):
            return None
        statuses.append((model, value))
    return statuses


def slots_path(model: str) -> str | None:
    """The route that reads ``model``'s slots without loading it; None for an id that has no
    UTF-8 form (a lone surrogate), which no request could name."""
    try:
        name = quote(model, safe="", errors="strict")
    except UnicodeEncodeError:
        return None
    return f"/slots?model={name}&autoload=false"


def slot_reads(statuses: list[tuple[str, str]]) -> tuple[tuple[str | None, str], ...]:
    """``(id, path)`` for the slots of each loaded model, at most :data:`MAX_SLOT_READS`."""
    reads: list[tuple[str | None, str]] = []
    for model, status in statuses:
        path = slots_path(model) if status == LOADED else None
        if path is not None:
            reads.append((model, path))
    return tuple(reads[:MAX_SLOT_READS])
