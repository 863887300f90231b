"""Imports among ``nvpair`` modules run one way: no cycle, and no engine knowledge in the wire.

Read from the source, not from a running interpreter: every module's top-level imports count,
those under ``if TYPE_CHECKING:`` too (a cycle hidden from the interpreter is still a cycle to a
reader and to mypy). A submodule's import of its own package is not an edge: a package is
always initialised before its submodules, whoever imports first.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

import nvpair

ROOT = Path(nvpair.__file__).parent

#: The facade server's side of the seam: HTTP/1.1 on the wire, and nothing about engines.
WIRE = (
    "nvpair.facade_server",
    "nvpair.facade_channel",
    "nvpair.facade_head",
    "nvpair.facade_reader",
    "nvpair.facade_request",
    "nvpair.facade_timeouts",
    "nvpair.facade_types",
)
ENGINE_AWARE = frozenset(
    {"nvpair.engines", "nvpair.http_facade", "nvpair.proxy_answers", "nvpair.admission"}
)


def module_names() -> dict[str, Path]:
    names: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The module's own statements, descending into ``if`` and ``try`` (TYPE_CHECKING, optional
    imports) but never into a function or a class."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _statements(node.body)
            for handler in node.handlers:
                yield from _statements(handler.body)
            yield from _statements(node.orelse)


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``nvpair`` modules ``name`` imports at its top level."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements(ast.parse(path.read_text()).body):
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


def test_the_checks_see_type_checking_imports_and_find_cycles(tmp_path: Path) -> None:
    """The checks above cannot pass by reading nothing."""
    module = tmp_path / "b.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "from nvpair import engines\n"
        "if TYPE_CHECKING:\n"
        "    from nvpair.http_facade import Facade\n"
        "def later() -> None:\n"
        "    import nvpair.cli\n"
    )
    known = {"nvpair.b", "nvpair.engines", "nvpair.http_facade", "nvpair.cli", "nvpair"}
    assert imported("nvpair.b", module, known) == {"nvpair.engines", "nvpair.http_facade"}
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


#: The HTTP/1.1 server and client: they talk to Twisted's transports through its interfaces.
WIRE_MODULES = (
    *WIRE,
    "nvpair.outlet",
    "nvpair.sniffing",
    "nvpair.tls",
    "nvpair.upstream",
    "nvpair.upstream_conn",
    "nvpair.upstream_framing",
    "nvpair.upstream_pool",
    "nvpair.upstream_response",
    "nvpair.upstream_types",
)


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
