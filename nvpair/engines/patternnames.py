"""Pattern aliases: ``[models]`` names that are shell-style patterns, for the names clients
hard-code (docs/model-names.md#pattern-aliases).

An OpenAI SDK asks for ``gpt-3.5-turbo``, an Anthropic client for ``claude-...``, a test for
``test``; a single-model ``llama-server`` serves whatever is named, the fleet serves only the
names it knows. ``"gpt-*" = ["qwen2.5-7b"]`` takes such a request: one whose model matches no
name the fleet knows (reported, derived or a plain alias), the longest matching pattern first.

A pattern is no name: nothing lists it, no key's pattern matches it, no client can spell its
way to it. Its owners are indexed under a :class:`PatternKey`, a key no name's key ever equals.
Pure values and decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

__all__ = ["PatternKey", "choose", "is_pattern", "ordered", "pattern_problem"]

#: What makes a ``[models]`` name a pattern: the shell's wildcards, as :mod:`fnmatch` reads them.
_WILDCARDS = frozenset("*?[")


def is_pattern(alias: str) -> bool:
    """Whether a ``[models]`` name is a pattern alias rather than a plain one."""
    return not _WILDCARDS.isdisjoint(alias)


class PatternKey(str):
    """The key a pattern alias's owners are found under (``Node.model_keys``).

    A ``str`` to every signature that carries model keys, yet equal to no plain string and
    hashed apart from them: a request's key is always a plain string (the engine's
    ``model_key`` of what it names), so no spelling — ``"*"`` included — reaches a pattern's
    owners except through :func:`choose` (docs/model-names.md#pattern-aliases).
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PatternKey) and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((PatternKey, str.__str__(self)))

    def __repr__(self) -> str:
        return f"PatternKey({str.__repr__(self)})"


def _precedence(pattern: str) -> tuple[int, str]:
    # The longest pattern is the most specific; equal lengths in code-point order, so the
    # choice never depends on the file's order (docs/model-names.md#pattern-aliases).
    return (-len(pattern), pattern)


def ordered(patterns: Iterable[str]) -> tuple[str, ...]:
    """``patterns`` once each, in the order they are tried: longest first, then code points."""
    return tuple(sorted(set(patterns), key=_precedence))


def choose(patterns: Sequence[str], name: str, folds: bool) -> str | None:
    """The pattern that takes a request naming ``name``: the first of ``patterns`` (as
    :func:`ordered` gives them) that matches it whole; None when none does.

    :param folds: the facade compares names ignoring case (Ollama's): so does the match.
    """
    subject = name.lower() if folds else name
    for pattern in patterns:
        if fnmatchcase(subject, pattern.lower() if folds else pattern):
            return pattern
    return None


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with a pattern alias, if anything: a ``[`` never closed, which
    :mod:`fnmatch` would quietly read as a literal character (a typo, not a wish)."""
    index = 0
    while index < len(pattern):
        if pattern[index] != "[":
            index += 1
            continue
        end = index + 1
        if end < len(pattern) and pattern[end] == "!":
            end += 1
        if end < len(pattern) and pattern[end] == "]":
            end += 1  # "[]...]": a leading "]" is a member of the set
        close = pattern.find("]", end)
        if close < 0:
            return f"the [ at {index} is never closed"
        index = close + 1
    return None
