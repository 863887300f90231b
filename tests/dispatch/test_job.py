"""A job's fields each have one owner, the only module that sets them (the table in
:mod:`nvpair.dispatch.job`'s docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs

import nvpair
from nvpair.dispatch.job import Job

ROOT = Path(nvpair.__file__).parent

#: Where each field is assigned after the job is made, by module (file stem, so the table
#: holds wherever the module lives). The rest are set once, when the job is made.
OWNERS = {
    "deferred": "job",
    "ending": "job",
    "refused": "job",
    "reservation": "job",
    "served_status": "job",
    "committed_at": "job",
    "budget": "failover",
    "workload": "failover",
    "trail": "failover",
    "queued": "failover",
    "stats": "delivery",
    "node": "delivery",
    "node_engine": "delivery",
    "dispatches": "delivery",
    "cut": "delivery",
}
MADE_WITH = {"admitted", "request", "outgoing", "created"}


def assignments(source: str, stem: str) -> set[tuple[str, str]]:
    """``(field, stem)`` for each ``job.<field> = ...`` in ``source`` (``self.<field>`` in
    the job's own module)."""
    holders = {"job", "self"} if stem == "job" else {"job"}
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id in holders
                ):
                    found.add((part.attr, stem))
    return found


def test_each_field_of_a_job_is_set_by_its_owner_only() -> None:
    found: set[tuple[str, str]] = set()
    for path in ROOT.rglob("*.py"):
        found |= assignments(path.read_text(), path.stem)
    fields = {field.name for field in attrs.fields(Job)}
    assert {(name, stem) for name, stem in found if name in fields} == set(OWNERS.items())


def test_the_table_names_every_field() -> None:
    assert set(OWNERS) | MADE_WITH == {field.name for field in attrs.fields(Job)}


def test_the_check_sees_a_second_owner() -> None:
    source = "def f(job):\n    job.refused = 'x'\n    job.stats, other = None, 1\n"
    assert assignments(source, "fleetwide") == {("refused", "fleetwide"), ("stats", "fleetwide")}
