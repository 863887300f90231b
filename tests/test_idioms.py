"""Idioms a reader trips over stay out of the source (issue 34 item 3).

An enum's members unpacked by position (``A, B = tuple(Phase)``) mean each other once the enum
is reordered, with nothing failing: each alias names its member instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_imports import module_names

#: The base classes that make a class an enum.
ENUM_BASES = frozenset({"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"})


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")


def enum_names(paths: list[Path]) -> set[str]:
    """The name of every enum class the modules define."""
    return {
        node.name
        for path in paths
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(_base_name(base) in ENUM_BASES for base in node.bases)
    }


def _unpacked(value: ast.expr) -> str | None:
    """The name whose members ``value`` spreads: ``X``, ``tuple(X)``, ``list(X)``, ``[*X]``."""
    if isinstance(value, ast.Name):
        return value.id
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("tuple", "list")
        and len(value.args) == 1
        and isinstance(value.args[0], ast.Name)
    ):
        return value.args[0].id
    if (
        isinstance(value, ast.List | ast.Tuple)
        and len(value.elts) == 1
        and isinstance(value.elts[0], ast.Starred)
        and isinstance(value.elts[0].value, ast.Name)
    ):
        return value.elts[0].value.id
    return None


def positional_enums(path: Path, enums: set[str]) -> list[str]:
    """Each assignment in ``path`` that unpacks one of ``enums`` by position."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Tuple | ast.List) for target in node.targets
        ):
            name = _unpacked(node.value)
            if name in enums:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_enum_is_unpacked_by_position() -> None:
    paths = list(module_names().values())
    enums = enum_names(paths)
    assert {"Phase", "Reason"} <= enums
    assert [line for path in paths for line in positional_enums(path, enums)] == []


def test_the_enum_check_sees_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import enum\n"
        "class Phase(enum.Enum):\n"
        "    A = 1\n"
        "    B = 2\n"
        "_A, _B = tuple(Phase)\n"
        "_C, _D = [*Phase]\n"
        "_E = Phase.A\n"
        "x, y = tuple(things)\n"
    )
    enums = enum_names([probe])
    assert enums == {"Phase"}
    assert positional_enums(probe, enums) == [
        "probe.py:5 _A, _B = tuple(Phase)",
        "probe.py:6 _C, _D = [*Phase]",
    ]


def gather_uses(path: Path) -> list[str]:
    """Each place ``path`` enters :data:`nvpair.wire.outlet.GATHER` (``with GATHER:``) or sets
    one of its attributes by hand."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.With):
            entered = [item.context_expr for item in node.items]
            if any(isinstance(e, ast.Name) and e.id == "GATHER" for e in entered):
                found.append(f"{path.name}:{node.lineno} with")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "GATHER"
                ):
                    found.append(f"{path.name}:{node.lineno} set")
    return found


def test_sends_are_gathered_in_one_place() -> None:
    """Whether a send leaves now depends on whether a read is being handled beneath it
    (docs/performance.md#one-send-per-read): that is decided in one place, in one block."""
    found = {name: uses for name, path in module_names().items() if (uses := gather_uses(path))}
    assert list(found) == ["nvpair.wire.client.connection"]
    assert [use.rpartition(" ")[2] for use in found["nvpair.wire.client.connection"]] == ["with"]


def test_the_gather_check_sees_a_hand_set_depth(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("with GATHER:\n    pass\nGATHER.depth += 1\n")
    assert gather_uses(probe) == ["probe.py:1 with", "probe.py:3 set"]
