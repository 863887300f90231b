"""Pure merge of the model lists a fleet's nodes answer on an inventory route.

One job: given the 2xx bodies of every responding node, in node order, produce the one
envelope the client gets (docs/inventories.md#merge-rules), or refuse with
:class:`InvalidInventory` when any body is not the engine's envelope — there is never a
partial list. Fanning out, timeouts and statuses belong to the caller; this module only sees
bytes.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence

from nvpair.common import strictjson
from nvpair.common.strictjson import NestedTooDeeply
from nvpair.engines.modelnames import OtherName
from nvpair.engines.table import Dialect, InventoryRoute

__all__ = ["InvalidInventory", "empty_inventory", "merge_inventories", "with_other_names"]


class InvalidInventory(ValueError):
    """A responder's body is not the envelope its engine answers on that route.

    The message names the node's position and what was wrong, never the body itself: bodies
    stay out of logs (docs/README.md#logging).

    :ivar index: the position of the offending body in the sequence given to
        :func:`merge_inventories` (that is, the node's position in node order).
    :ivar reason: a short description of what was wrong.
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"inventory from responder {index} is invalid: {reason}")
        self.index = index
        self.reason = reason


def empty_inventory(engine: Dialect, path: str) -> bytes:
    """The engine's own empty envelope for an inventory route, as JSON bytes.

    :param engine: the facade's engine.
    :param path: a key of ``engine.inventory``.
    :raises KeyError: when *path* is not an inventory route of *engine*.
    """
    return _dump(engine.inventory[path].empty)


def merge_inventories(
    engine: Dialect,
    path: str,
    bodies: Sequence[bytes],
    names: Sequence[OtherName] = (),
    read_as: Sequence[InventoryRoute] | None = None,
    allowed: Callable[[str], bool] | None = None,
    lan: bool = False,
) -> bytes:
    """Merge the 2xx bodies of every responding node for the inventory route *path*.

    Entries come out in node order; the first entry with a given model key wins and later
    ones are dropped, whichever node (or the same node) repeats it. Keys are compared with
    ``engine.model_key`` (so on Ollama ``llama3`` and ``Llama3:latest`` are one model, and the
    entry kept is the first one, spelled as its node spelled it). Every entry passes through
    with its fields unchanged. On Ollama ``/api/tags`` the result is then stably sorted by
    ``modified_at``, newest first, as Ollama itself sorts it; an entry whose ``modified_at``
    is missing or not an RFC 3339 timestamp sorts after every dated one, and such entries
    keep node order among themselves. The envelope is the engine's empty envelope with its
    list field filled, so an empty result is exactly that empty envelope (Ollama
    ``/v1/models``: ``"data": null``); any other top-level field a node sent is dropped, but
    for the route's companion list (llama.cpp's ``models``), merged alike where nodes sent one.

    A body is valid when it is a JSON object whose list field is a list of objects, each with a
    string in the route's key field. ``null`` in the list field counts as an empty list only on a
    route whose engine itself answers ``null`` for an empty list (Ollama ``/v1/models``). llama.cpp
    nodes answer with both ``models`` and ``data``; ``data`` is required, ``models`` is merged
    (keyed by ``name``) from the nodes whose ``models`` is such a list and skipped for the others,
    never invalidating an answer (docs/inventories.md#llamacpps-two-lists).

    :param engine: the facade's engine.
    :param path: the client's inventory route, a key of ``engine.inventory``.
    :param bodies: each responding node's body, in node order.
    :param names: the other names the nodes are known by (fleet mode), in node order: each is
        listed once, after the first entry of a model it stands for, as a copy of that entry
        under its own name (:func:`with_other_names`).
    :param read_as: how each body is validated and read, when not as the facade's route: the
        route of the node's own engine, for a facade that reaches several engines' nodes
        (an Ollama node's ``"data": null`` is an empty list there too).
    :param allowed: which names the caller may use (a fleet key's patterns, judged on the
        model behind each name: docs/lan.md#what-a-key-can-and-cannot-do): an entry whose name
        it refuses is left out, after the copies are made. None: every entry.
    :param lan: the caller is on the LAN: a llama.cpp router's ``status.args`` and
        ``status.preset`` (the command line and preset it starts the model with, file paths of
        the node's disk in both) are left out of every entry
        (docs/lan.md#what-a-key-can-and-cannot-do).
    :return: the merged envelope as compact JSON bytes.
    :raises InvalidInventory: when any body is not the expected envelope.
    :raises KeyError: when *path* is not an inventory route of *engine*.
    """
    route = engine.inventory[path]
    documents: list[object] = []
    lists: list[list[dict[str, object]]] = []
    for index, body in enumerate(bodies):
        # Every body is validated before anything is returned, duplicates included: one bad
        # node makes the whole answer invalid, so a partial list can never escape.
        documents.append(_load(index, body))
        lists.append(_entries(route if read_as is None else read_as[index], index, documents[-1]))
    merged = _merged(engine, route, lists, names, allowed, lan, read_as)
    companion = route.companion
    if companion is None or read_as is not None:
        return _dump({**route.empty, route.list_field: merged} if merged else route.empty)
    # llama.cpp's models beside its data: merged the same way from the nodes that sent a
    # readable one, never required (docs/inventories.md#llamacpps-two-lists).
    also = [found for doc in documents if (found := _companion(companion, doc)) is not None]
    if not also:
        return _dump({**route.empty, route.list_field: merged} if merged else route.empty)
    beside = _merged(engine, companion, also, names, allowed, lan)
    return _dump({companion.list_field: beside, **route.empty, route.list_field: merged})


def _merged(
    engine: Dialect,
    route: InventoryRoute,
    lists: Sequence[list[dict[str, object]]],
    names: Sequence[OtherName],
    allowed: Callable[[str], bool] | None,
    lan: bool,
    read_as: Sequence[InventoryRoute] | None = None,
) -> list[dict[str, object]]:
    """One list field's entries from every node's, in node order, one per key, with the other
    names, the caller's filter and the LAN's trimming applied."""
    seen: set[str] = set()
    merged: list[dict[str, object]] = []
    for index, entries in enumerate(lists):
        reading = route if read_as is None else read_as[index]
        for entry in entries:
            key = engine.model_key(_key(reading, entry))
            if key not in seen:
                seen.add(key)
                merged.append(entry)
    if names:
        merged = with_other_names(engine, route, merged, names)
    if allowed is not None:
        merged = [entry for entry in merged if allowed(_key(route, entry))]
    if lan:
        merged = [_without_args(entry) for entry in merged]
    # Ollama's ListHandler sorts /api/tags by modified_at; a merged list that kept node order
    # would read as a different engine.
    sort_field = route.newest_first
    if sort_field is not None:
        # list.sort is stable with reverse=True too: equal timestamps keep node order.
        merged.sort(key=lambda entry: _timestamp_key(entry.get(sort_field)), reverse=True)
    return merged


def _companion(route: InventoryRoute, document: object) -> list[dict[str, object]] | None:
    """A node's companion list (its body already judged valid), or None when it sent none or
    one that is not a list of objects each with a string key: a usable answer is never spoiled
    by a list nobody requires."""
    try:
        return _entries(route, 0, document)
    except InvalidInventory:
        return None


#: What a llama.cpp router's entry ``status`` says of how it starts the model: its command line
#: and its preset, the node's file paths in both.
_NODE_ONLY = frozenset({"args", "preset"})


def _without_args(entry: dict[str, object]) -> dict[str, object]:
    status = entry.get("status")
    if not isinstance(status, dict) or _NODE_ONLY.isdisjoint(status):
        return entry
    return {**entry, "status": {k: v for k, v in status.items() if k not in _NODE_ONLY}}


def with_other_names(
    engine: Dialect,
    route: InventoryRoute,
    entries: Sequence[dict[str, object]],
    names: Sequence[OtherName],
) -> list[dict[str, object]]:
    """``entries`` (already merged, so one per key) with an entry for each other name that has
    none: a copy of the first entry of a model it stands for, renamed (the key field, and the
    route's :attr:`~nvpair.engines.table.InventoryRoute.also_named` fields that repeat the name) and
    placed after it (docs/model-names.md#inventories).

    A name stands for different reported names on different nodes (an alias naming a model
    per engine or per node); any of them is its owner's entry. A name none of whose models is
    in this list (a model not in memory, on ``/api/ps``) is left out.
    """
    behind: dict[str, tuple[str, set[str]]] = {}
    for other in names:
        _, reported = behind.setdefault(other.key, (other.name, set()))
        reported.add(other.reported_key)
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        first.setdefault(engine.model_key(_key(route, entry)), index)
    copies: dict[int, list[dict[str, object]]] = {}
    for key, (name, owners) in behind.items():
        listed = [first[owned] for owned in owners if owned in first]
        if key in first or not listed:
            continue
        owner = min(listed)
        entry, shown = entries[owner], engine.model_display(name)
        copy = dict(entry)
        for field in (route.key_field, *route.also_named):
            if field == route.key_field or copy.get(field) == entry[route.key_field]:
                copy[field] = shown
        copies.setdefault(owner, []).append(copy)
    return [e for i, entry in enumerate(entries) for e in (entry, *copies.get(i, ()))]


def _key(route: InventoryRoute, entry: Mapping[str, object]) -> str:
    key = entry[route.key_field]
    assert isinstance(key, str)  # checked by _entries
    return key


def _entries(route: InventoryRoute, index: int, document: object) -> list[dict[str, object]]:
    """The entries of one node's parsed body, or :class:`InvalidInventory`."""
    if not isinstance(document, dict):
        raise InvalidInventory(index, "not a JSON object")
    if route.list_field not in document:
        raise InvalidInventory(index, f"no {route.list_field!r} field")
    entries = document[route.list_field]
    if entries is None and route.empty.get(route.list_field, ()) is None:
        return []
    if not isinstance(entries, list):
        raise InvalidInventory(index, f"{route.list_field!r} is not a list")
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidInventory(index, f"entry {position} is not an object")
        if not isinstance(entry.get(route.key_field), str):
            raise InvalidInventory(index, f"entry {position} has no string {route.key_field!r}")
    return entries


def _load(index: int, body: bytes) -> object:
    # Strict: NaN, Infinity or 1e400 re-serialized would make the merged answer unparseable
    # for every client.
    try:
        return strictjson.loads(body)
    except NestedTooDeeply:
        raise InvalidInventory(index, "nested too deeply") from None
    except ValueError as error:
        # JSONDecodeError, UnicodeDecodeError, the strict reader's refusals, and integers over
        # Python's digit limit are all ValueErrors.
        raise InvalidInventory(index, f"not JSON ({type(error).__name__})") from None


def _dump(document: Mapping[str, object]) -> bytes:
    # ensure_ascii keeps the output encodable even when an input escaped a lone surrogate
    # ("\\ud800"), which UTF-8 cannot carry; values are unchanged either way.
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("ascii")


# RFC 3339 as Go marshals a time.Time (RFC3339Nano: up to nine fractional digits, "Z" or a
# numeric offset). [0-9] rather than \d, which would also match non-ASCII digits.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()


def _timestamp_key(value: object) -> tuple[int, int]:
    """Sort key for ``modified_at``: ``(1, ns since the epoch)``, or ``(0, 0)`` if undated."""
    instant = _parse_rfc3339(value) if isinstance(value, str) else None
    return (0, 0) if instant is None else (1, instant)


def _parse_rfc3339(text: str) -> int | None:
    """Nanoseconds since the Unix epoch, or None when *text* is not an RFC 3339 timestamp.

    Computed in integers rather than through :class:`datetime.datetime`: that keeps Go's
    nanoseconds (two writes in the same microsecond still order) and cannot overflow on
    Go's zero time (``0001-01-01T00:00:00Z``) shifted by an offset.
    """
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.group(1, 2, 3, 4, 5, 6))
    fraction, zulu, sign, offset_hour, offset_minute = match.group(7, 8, 9, 10, 11)
    try:
        days = datetime.date(year, month, day).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None
    # Second 60 is RFC 3339's leap second; counting it linearly keeps the order right.
    if hour > 23 or minute > 59 or second > 60:
        return None
    offset = 0
    if not zulu:
        if int(offset_hour) > 23 or int(offset_minute) > 59:
            return None
        offset = (int(offset_hour) * 3600 + int(offset_minute) * 60) * (-1 if sign == "-" else 1)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
    nanos = int((fraction or "")[:9].ljust(9, "0"))
    return seconds * 1_000_000_000 + nanos
