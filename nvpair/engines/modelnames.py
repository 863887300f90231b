"""The names people use for a model, besides the ones its nodes report (docs/model-names.md).

Two kinds, in standalone fleet mode only:

- **file names**: a llama.cpp or LM Studio model id that is a file path (it contains ``/`` or
  ``\\``, or ends in ``.gguf``) is also known by its file name and by its file name without
  ``.gguf``, on every node that reports the same file name, whatever its directory;
- **aliases**: the fleet file's ``[models]`` table, ``"alias" = [names...]``; an alias names
  whichever of its names each node has (a reported name or a file name). An alias that is a
  shell-style pattern is no name but a catch for names nothing else matches
  (:mod:`nvpair.engines.patternnames`).

Values in, values out: :func:`known_names` turns one engine's node inventories and the aliases
into the other names each node is known by, each with the node's own name for the model, which
is what a request for it is sent with (docs/model-names.md#the-node-gets-its-own-name).
Comparison is the engine's own (``Engine.model_key``), so Ollama names keep Ollama's rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from attrs import frozen

from nvpair.engines.names import ollama_key
from nvpair.engines.patternnames import PatternKey, is_pattern, ordered, pattern_problem
from nvpair.engines.table import Engine

__all__ = [
    "NO_ALIASES",
    "AliasError",
    "Aliases",
    "KnownNames",
    "OtherName",
    "file_names",
    "known_names",
]

_GGUF = ".gguf"


@frozen
class OtherName:
    """A name a node is known by besides the ones it reports.

    :ivar name: the name as people write it: a file name, or an alias as ``[models]`` spells it.
    :ivar key: the engine's comparison key of ``name``.
    :ivar reported: the node's own name for the model, which a request for ``name`` is sent with.
    :ivar reported_key: the comparison key of ``reported``.
    """

    name: str
    key: str
    reported: str
    reported_key: str


def file_names(model_id: str) -> tuple[str, ...]:
    """The names a model id that is a file path derives: its file name, and that without
    ``.gguf`` (any case); ``()`` for an id that is no path.

    ``/models/qwen2.5-7b-q4.gguf`` gives ``("qwen2.5-7b-q4.gguf", "qwen2.5-7b-q4")``; a
    Windows path (``C:\\models\\x.gguf``) is cut at its backslashes the same way. A name equal to
    the id itself is left out, and so is an empty one (``dir/``, ``.gguf``).
    """
    is_path = "/" in model_id or "\\" in model_id or model_id.lower().endswith(_GGUF)
    if not is_path:
        return ()
    base = model_id.replace("\\", "/").rpartition("/")[2]
    stem = base[: -len(_GGUF)] if base.lower().endswith(_GGUF) else base
    names: list[str] = []
    for name in (base, stem):
        if name and name != model_id and name not in names:
            names.append(name)
    return tuple(names)


class AliasError(ValueError):
    """A ``[models]`` table that cannot be used.

    :ivar where: the offending key below ``models`` (``.llama3``), or ``""`` for the table.
    :ivar why: what is wrong.
    """

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"models{where}: {why}")
        self.where = where
        self.why = why


def _quoted(alias: str) -> str:
    return "." + json.dumps(alias, ensure_ascii=False)


def _same_name(a: str, b: str) -> bool:
    """Whether two names could be one model on some engine: equal, or one Ollama model."""
    return a == b or ollama_key(a) == ollama_key(b)


@frozen
class Aliases:
    """The ``[models]`` table: each plain alias with the names it stands for, in the file's
    order; each pattern alias likewise, in the order patterns are tried (longest first)."""

    table: tuple[tuple[str, tuple[str, ...]], ...] = ()
    patterns: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, value: object) -> Aliases:
        """Read and check a ``[models]`` table; :class:`AliasError` says what is wrong.

        An alias names one or more names, each a non-empty string listed once. No alias may be
        one of the names the table lists (or a file name one of them derives): it would be at
        once an alias and a model's own name. Nor may two aliases be one Ollama name
        (``Llama3`` and ``llama3:latest``), which the Ollama facade could not tell apart.
        A pattern alias (``"gpt-*"``), being no name, is held to the first rule only, and its
        brackets must close (docs/model-names.md#pattern-aliases).
        """
        if not isinstance(value, Mapping):
            raise AliasError("", 'must be a table of "alias" = ["name", ...]')
        table: list[tuple[str, tuple[str, ...]]] = []
        patterns: dict[str, tuple[str, ...]] = {}
        for alias, names in value.items():
            where = _quoted(alias)
            if not alias:
                raise AliasError(where, "an alias must not be empty")
            if not isinstance(names, list) or not names:
                raise AliasError(where, "must be a non-empty array of model names")
            for name in names:
                if not isinstance(name, str) or not name:
                    raise AliasError(where, "every model name must be a non-empty string")
                if names.count(name) > 1:
                    raise AliasError(where, f"lists {name!r} twice")
            if is_pattern(alias):
                problem = pattern_problem(alias)
                if problem is not None:
                    raise AliasError(where, f"{alias!r} is no shell-style pattern: {problem}")
                patterns[alias] = tuple(names)
            else:
                table.append((alias, tuple(names)))
        cls._distinct(table, [*table, *patterns.items()])
        return cls(tuple(table), tuple((p, patterns[p]) for p in ordered(patterns)))

    @staticmethod
    def _distinct(
        table: Sequence[tuple[str, tuple[str, ...]]],
        every: Sequence[tuple[str, tuple[str, ...]]],
    ) -> None:
        named = [
            (derived, name)
            for _, names in every
            for name in names
            for derived in (name, *file_names(name))
        ]
        for index, (alias, _) in enumerate(table):
            for derived, name in named:
                if _same_name(alias, derived):
                    also = "" if derived == name else f" (the file name of {name!r})"
                    raise AliasError(
                        _quoted(alias),
                        f"{alias!r} is also a model name the table lists{also}: "
                        "a name is either an alias or a model's own",
                    )
            for other, _ in table[:index]:
                if _same_name(alias, other):
                    raise AliasError(
                        _quoted(alias), f"{alias!r} and {other!r} are one name to Ollama"
                    )


#: No ``[models]`` table.
NO_ALIASES = Aliases()


@frozen
class KnownNames:
    """What :func:`known_names` found for one engine's nodes.

    :ivar others: per node, in the order given: the names it is known by besides its reported
        ones, in the order inventories list them (file names by reported name, then aliases
        in the table's order).
    :ivar keys: per node: the comparison keys of every name it answers to, reported or other.
    :ivar shadowed: the aliases left out because a node of the engine reports (or derives) the
        same name, which stays that node's (docs/model-names.md#conflicts).
    :ivar patterns: per node: the pattern aliases it serves, each keyed by its
        :class:`~nvpair.engines.patternnames.PatternKey`; no name, so apart from ``others``
        (no list shows them, no key's pattern matches them).
    """

    others: tuple[tuple[OtherName, ...], ...]
    keys: tuple[frozenset[str], ...]
    shadowed: tuple[str, ...]
    patterns: tuple[tuple[OtherName, ...], ...] = ()


def known_names(
    engine: Engine, inventories: Sequence[Sequence[str]], aliases: Aliases = NO_ALIASES
) -> KnownNames:
    """Every other name each node of ``engine`` is known by.

    :param inventories: each node's reported model names, in the node's own order.
    :param aliases: the ``[models]`` table.

    A name a node reports is its own and is sent as the client wrote it. A file name a node
    derives, or an alias naming one of its names, is sent as the node's reported name: the
    first (in the node's order) of the reported names it stands for, and for an alias its first
    name (in the table's order) that the node has.
    """
    key = engine.model_key
    # Per node: key of every name it has (reported or derived) -> the reported name behind it.
    behind: list[dict[str, str]] = []
    others: list[list[OtherName]] = []
    for inventory in inventories:
        own: dict[str, str] = {}
        for name in inventory:
            own.setdefault(key(name), name)
        derived: list[OtherName] = []
        if engine.file_path_ids:
            for name in inventory:
                for file_name in file_names(name):
                    file_key = key(file_name)
                    if file_key not in own:
                        own[file_key] = name
                        derived.append(OtherName(file_name, file_key, name, key(name)))
        behind.append(own)
        others.append(derived)
    taken = set().union(*behind) if behind else set()
    shadowed: list[str] = []
    for alias, names in aliases.table:
        alias_key = key(alias)
        if alias_key in taken:
            shadowed.append(alias)
            continue
        for own, node_others in zip(behind, others, strict=True):
            reported = next((own[k] for k in map(key, names) if k in own), None)
            if reported is not None:
                node_others.append(OtherName(alias, alias_key, reported, key(reported)))
    patterns = [
        tuple(
            OtherName(pattern, PatternKey(pattern), reported, key(reported))
            for pattern, names in aliases.patterns
            for reported in [next((own[k] for k in map(key, names) if k in own), None)]
            if reported is not None
        )
        for own in behind
    ]
    return KnownNames(
        others=tuple(tuple(node) for node in others),
        keys=tuple(
            frozenset(own) | {other.key for other in (*node, *caught)}
            for own, node, caught in zip(behind, others, patterns, strict=True)
        ),
        shadowed=tuple(shadowed),
        patterns=tuple(patterns),
    )
