"""Two runs of llama.cpp's server tests compared: the counts of each, and the tests whose
outcomes differ (docs/engine-suite.md#reading-the-output).

Pure: results in, values out. A run's results are what ``tools/engine_suite/plugin.py`` writes:
how many tests were collected, each test's outcome and, for one that did not pass, why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Run:
    """One run's results: collected count, outcome per test id, reason per test that did not
    pass."""

    collected: int
    outcomes: Mapping[str, str]
    reasons: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Run:
        return cls(
            int(document["collected"]),
            dict(document["outcomes"]),
            dict(document.get("reasons", {})),
        )

    def count(self, outcome: str) -> int:
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def ran(self) -> int:
        """Tests that ran (collected, not skipped)."""
        return sum(1 for value in self.outcomes.values() if value != "skipped")


class Difference(NamedTuple):
    """A test whose outcome differs: its id, both outcomes (``missing`` where a run has none),
    the proxied run's reason, and the documented cause when there is one."""

    test: str
    direct: str
    proxied: str
    reason: str
    cause: str | None


MISSING = "missing"


def differences(
    direct: Run, proxied: Run, documented: Mapping[str, str] | None = None
) -> list[Difference]:
    """The tests whose outcomes differ between the runs, in test-id order; ``documented`` maps a
    test id (or an id's prefix ending in ``[`` or ``::``, for parameters and whole files) to
    why it differs by design."""
    found = []
    for test in sorted(set(direct.outcomes) | set(proxied.outcomes)):
        before = direct.outcomes.get(test, MISSING)
        after = proxied.outcomes.get(test, MISSING)
        if before != after:
            reason = proxied.reasons.get(test) or direct.reasons.get(test, "")
            found.append(Difference(test, before, after, reason, cause(test, documented or {})))
    return found


def cause(test: str, documented: Mapping[str, str]) -> str | None:
    """The documented cause of ``test``'s difference: its own entry, else the longest prefix
    entry that ends where a test id's part ends."""
    if test in documented:
        return documented[test]
    prefixes = [key for key in documented if key.endswith(("[", "::")) and test.startswith(key)]
    return documented[max(prefixes, key=len)] if prefixes else None


#: How a documented cause that is a bug found, not a choice, begins.
BUG = "bug: "


def unaccepted(found: list[Difference]) -> list[Difference]:
    """The differences the target fails on: every one not documented as by design."""
    return [d for d in found if d.cause is None or d.cause.startswith(BUG)]


def summary(direct: Run, proxied: Run, found: list[Difference]) -> list[str]:
    """The report's lines: a table of both runs, then each difference with its cause."""
    lines = [
        f"{'':10}{'collected':>10}{'ran':>6}{'passed':>8}{'failed':>8}{'error':>7}{'skipped':>9}",
    ]
    for name, run in (("direct", direct), ("proxied", proxied)):
        lines.append(
            f"{name:10}{run.collected:>10}{run.ran():>6}{run.count('passed'):>8}"
            f"{run.count('failed'):>8}{run.count('error'):>7}{run.count('skipped'):>9}"
        )
    undocumented = sum(1 for difference in found if difference.cause is None)
    bugs = len(unaccepted(found)) - undocumented
    lines.append(
        f"differing: {len(found)} ({len(found) - bugs - undocumented} by design, "
        f"{bugs} known bugs, {undocumented} not documented)"
    )
    for difference in found:
        lines.append(f"  {difference.test}: {difference.direct} -> {difference.proxied}")
        lines.append(f"      {difference.cause or 'NOT DOCUMENTED'}")
        if difference.reason:
            lines.append(f"      proxied: {difference.reason}")
    return lines
