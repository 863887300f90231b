"""Who a request came from, where fleet mode's ``[access]`` is in force, and what its key lets
it use (docs/lan.md#what-a-key-can-and-cannot-do).

Pure values and decisions. A key's patterns judge a **model**, never a spelling: the names a
pattern is matched against are the names the fleet knows the model the request resolves to by
(:func:`forms` of each, as the engine parses and compares them), so a name the engine would
read otherwise than it is written (``llama3://registry.ollama.ai/library/secret`` is
``secret`` to Ollama) is judged as what it reaches. Which model a request resolves to on which
node is the fleet's to say (:mod:`nvpair.control.keyscope`); this module says whether a set of
names is one the key may use, and which routes change what an engine holds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from attrs import frozen

from nvpair.engines.names import DEFAULT_TAG, parse_ollama_name
from nvpair.engines.table import Dialect


class Priority(enum.IntEnum):
    """A key's ``priority`` in the fleet's queue (docs/fleet-scheduling.md#the-queue);
    lower values are served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2


@frozen
class Caller:
    """A request's caller where ``[access]`` is in force (None stands for "not in force").

    :ivar name: the name of the fleet key it presented, if a valid one; None for a loopback
        caller that presented none and for a LAN caller where no key file is named.
    :ivar models: that key's shell-style patterns of the model names it may use; empty: every
        model.
    :ivar manage: the key may use the routes that change what an engine holds (pull, copy,
        delete, load, ...); a loopback caller always may.
    :ivar lan: the caller is not on this machine: what only an operator there should see (a
        router's model file paths) is not shown to it.
    :ivar priority: its key's place in the fleet's queue (docs/fleet-scheduling.md#the-queue).
    """

    name: str | None = None
    models: tuple[str, ...] = ()
    manage: bool = True
    lan: bool = False
    priority: Priority = Priority.NORMAL


#: A caller with no key.
KEYLESS = Caller()

#: Ollama's suffixes that pick where a model runs, dropped before the name is parsed
#: (``gpt-oss:20b:cloud``, ``llama3:local``, a tag ending ``-cloud``).
_SOURCES = (":cloud", ":local")
_CLOUD_TAG = "-cloud"


def _ollama_readings(name: str) -> list[str]:
    """The names Ollama may read ``name`` as: itself and, when it ends in a source suffix, the
    name without it. Judged on all of them, a suffix cannot make one model pass for another."""
    readings = [name]
    lowered = name.lower()
    for suffix in _SOURCES:
        if lowered.endswith(suffix):
            readings.append(name[: -len(suffix)])
    if lowered.endswith(_CLOUD_TAG) and name.rfind(":") > name.rfind("/"):
        readings.append(name[: -len(_CLOUD_TAG)])
    return readings


def readings(engine: Dialect, name: str) -> list[tuple[str, ...]] | None:
    """The forms a pattern is matched against for a model the fleet knows as ``name``: one
    tuple per way the engine may read the name.

    On an engine whose names ignore case (Ollama's) every form is lower-case and so are the
    patterns (:func:`permits`); an Ollama name is matched as Ollama parses it: in its shortest
    form (``llama3:latest``), without its default tag (``llama3``), and whole
    (``registry.ollama.ai/library/llama3:latest``), once as written and once without a source
    suffix when it has one. None: the engine would read the name as no model it can serve (an
    invalid Ollama name), so nothing can be said to allow it.
    """
    if engine.model_key("A") != engine.model_key("a"):
        return [(name,)]
    found: list[tuple[str, ...]] = []
    readings = _ollama_readings(name)
    if len(readings) > 1 and parse_ollama_name(name) is None:
        # Invalid as written: only what Ollama reads once the suffix is dropped is a name.
        readings = readings[1:]
    for reading in readings:
        parsed = parse_ollama_name(reading)
        if parsed is None:
            return None
        shortest = parsed.display().lower()
        if parsed.tag.lower() == DEFAULT_TAG:
            found.append((shortest, shortest.rpartition(":")[0], parsed.key()))
        else:
            found.append((shortest, parsed.key()))
    return found


def permits(patterns: Sequence[str], engine: Dialect, names: Iterable[str]) -> bool:
    """Whether a key with ``patterns`` may use a model the fleet knows by ``names``: one
    pattern matches a form (:func:`readings`) of one of them. An empty ``patterns`` is every
    model; a name with no forms is no name a pattern can match.

    A name is allowed only when every reading of it is: ``x:local`` is judged as ``x:local``
    and as ``x``, so a suffix cannot make one model pass for another. A pattern without ``/``
    matches short names only (:func:`_matches`).
    """
    if not patterns:
        return True
    folds = engine.model_key("A") == engine.model_key("a")
    wanted = [pattern.lower() for pattern in patterns] if folds else list(patterns)
    for name in names:
        found = readings(engine, name)
        if found is not None and all(
            any(_matches(form, pattern) for form in reading for pattern in wanted)
            for reading in found
        ):
            return True
    return False


def _matches(form: str, pattern: str) -> bool:
    """A pattern without ``/`` names models by their short names: it matches no form with a
    host, a namespace or a directory in it (``llama3*`` is not ``llama3.evil.com/x/y`` nor
    ``llama3/secret``, whose short forms hold a ``/``)."""
    return fnmatchcase(form, pattern) and ("/" in pattern or "/" not in form)
