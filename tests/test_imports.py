"""Imports among ``nvpair`` modules run one way: no cycle, and no engine knowledge in the wire.

Read from the source, not from a running interpreter: every import statement of a module counts,
wherever it stands — at the top, under ``if TYPE_CHECKING:``, or inside a function that defers
it (a cycle hidden from the interpreter is still a cycle to a reader and to mypy). A submodule's
import of its own package is not an edge: a package is always initialised before its
submodules, whoever imports first.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nvpair

ROOT = Path(nvpair.__file__).parent


def _names() -> list[str]:
    """Every module's dotted name (a package's by its own name)."""
    names = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


#: HTTP/1.1 on the wire (the :mod:`nvpair.wire` package), and nothing about engines.
WIRE = tuple(sorted(name for name in _names() if name.startswith("nvpair.wire.")))
ENGINE_AWARE = frozenset(
    name for name in _names() if name.startswith(("nvpair.engines", "nvpair.facades"))
)


def module_names() -> dict[str, Path]:
    names: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``nvpair`` modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # ``from package import submodule`` imports the submodule; a plain name, the module.
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in known and m != name and m not in ancestors}


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {name: imported(name, path, known) for name, path in names.items()}


def cycle_through(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        trail.append(module)
        for following in sorted(graph[module]):
            if state.get(following) == "open":
                return [*trail[trail.index(following) :], following]
            if following not in state:
                found = visit(following)
                if found is not None:
                    return found
        trail.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found is not None:
                return found
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        for following in graph[module] - seen:
            seen.add(following)
            todo.append(following)
    return seen


def test_no_import_cycle_among_nvpair_modules() -> None:
    assert cycle_through(import_graph()) is None


def test_the_facade_server_imports_nothing_that_knows_an_engine() -> None:
    """The wire asks admission through its Gate only (docs/request-path.md#the-facade)."""
    graph = import_graph()
    for module in WIRE:
        assert reachable(graph, module) & ENGINE_AWARE == set(), module


def test_the_checks_see_deferred_imports_and_find_cycles(tmp_path: Path) -> None:
    """The checks above cannot pass by reading nothing: an import under ``TYPE_CHECKING`` and
    one inside a function are edges as a top-level one is."""
    module = tmp_path / "b.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from nvpair.engines import table\n"
        "if TYPE_CHECKING:\n"
        "    from nvpair.facades.facade import Facade\n"
        "def later() -> None:\n"
        "    import nvpair.cli\n"
    )
    known = {"nvpair.b", "nvpair.engines.table", "nvpair.facades.facade", "nvpair.cli", "nvpair"}
    assert imported("nvpair.b", module, known) == {
        "nvpair.engines.table",
        "nvpair.facades.facade",
        "nvpair.cli",
    }
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


#: The HTTP/1.1 server and client: they talk to Twisted's transports through its interfaces.
WIRE_MODULES = WIRE


def private_reads(path: Path) -> list[str]:
    """Each ``x._name`` where ``x`` is not ``self`` or ``cls``: another object's private
    attribute (a transport's buffer state, say)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_wire_reads_no_private_attribute_of_another_object() -> None:
    """The wire code once read Twisted's transport buffers (``_tempDataLen``,
    ``_writeDisconnected``): a Twisted release could change them under it. Its own objects
    keep their privates to themselves too."""
    names = module_names()
    found = [line for module in WIRE_MODULES for line in private_reads(names[module])]
    assert found == []


def test_the_private_read_check_sees_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(transport):\n    return transport._tempDataLen + self._ok\n")
    assert private_reads(probe) == ["probe.py:2 transport._tempDataLen"]


#: What each package may import besides itself (docs/architecture.md#layers). Modules directly
#: in ``nvpair`` are the process (options, wiring, start and stop): they may import anything,
#: and no package imports them.
LAYERS: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "engines": frozenset({"common"}),
    "control": frozenset({"common", "engines"}),
    "wire": frozenset({"common"}),
    "facades": frozenset({"common", "engines", "control", "wire"}),
    "dispatch": frozenset({"common", "engines", "control", "wire", "facades"}),
    "fleet": frozenset({"common", "engines", "control", "wire", "facades", "dispatch"}),
    "broker": frozenset({"common", "engines", "control", "wire", "facades", "dispatch"}),
    "observe": frozenset(
        {"common", "engines", "control", "wire", "facades", "dispatch", "fleet", "broker"}
    ),
    "sim": frozenset(),
    "examples": frozenset(),
}


def package_of(module: str) -> str | None:
    """The package a module belongs to, or None for the process's own modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs against the declared layering."""
    found = []
    for module, imports in sorted(graph.items()):
        own = package_of(module)
        for target in sorted(imports):
            theirs = package_of(target)
            if theirs == own or (own is None and module != "nvpair"):
                continue
            if theirs is None or own is None or theirs not in LAYERS[own]:
                found.append(f"{module} -> {target}")
    return found


def test_imports_run_one_way_between_packages() -> None:
    assert layer_breaches(import_graph()) == []


def test_every_module_lives_in_a_declared_package_or_is_the_process() -> None:
    process = {name for name in module_names() if package_of(name) is None}
    assert process == {
        "nvpair",
        "nvpair.cli",
        "nvpair.cli_actions",
        "nvpair.config",
        "nvpair.control_services",
        "nvpair.demo",
        "nvpair.service",
        "nvpair.tap",
        "nvpair.uvloopreactor",
    }
    assert {name.split(".")[1] for name in module_names() if package_of(name)} == set(LAYERS)


def test_each_package_says_what_it_may_import() -> None:
    """The docstring a newcomer reads names exactly the packages the test allows."""
    for package, allowed in LAYERS.items():
        doc = importlib.import_module(f"nvpair.{package}").__doc__ or ""
        named = set(re.findall(r":mod:`nvpair\.(\w+)`", doc)) - {package}
        assert named >= allowed, package
        assert doc.strip(), package


def test_the_layer_check_sees_a_breach() -> None:
    graph = {
        "nvpair.wire.server": {"nvpair.engines.table"},
        "nvpair.dispatch.job": {"nvpair.config", "nvpair.wire.web"},
        "nvpair.service": {"nvpair.dispatch.job"},
    }
    assert layer_breaches(graph) == [
        "nvpair.dispatch.job -> nvpair.config",
        "nvpair.wire.server -> nvpair.engines.table",
    ]


#: A module's length past which it holds more than one job (docs/architecture.md). The
#: simulated engines are test tooling, each one engine's whole behaviour.
MAX_MODULE_LINES = 400


def oversized(names: dict[str, Path]) -> list[str]:
    """Each module outside ``nvpair.sim`` longer than :data:`MAX_MODULE_LINES`, with its length."""
    found = []
    for name, path in sorted(names.items()):
        if name == "nvpair.sim" or name.startswith("nvpair.sim."):
            continue
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
    return found


def test_no_module_outside_the_simulated_engines_is_over_400_lines() -> None:
    assert oversized(module_names()) == []


def test_the_size_check_sees_a_long_module(tmp_path: Path) -> None:
    long, short, sim = tmp_path / "long.py", tmp_path / "short.py", tmp_path / "engine.py"
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    short.write_text("x = 1\n" * MAX_MODULE_LINES)
    sim.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    names = {"nvpair.long": long, "nvpair.short": short, "nvpair.sim.engine": sim}
    assert oversized(names) == [f"nvpair.long: {MAX_MODULE_LINES + 1} lines"]
