"""Every command README.md and docs/*.md show is exercised by a test (issue 12 item 10).

The table is ``tests/documented_commands.py``; the commands it marks as run here are run by
``tests/integration/test_running_documented_commands.py``. These checks are the cheap half: the
table and the docs agree both ways, every test the table names exists (and, for the ones run
here, holds the command's text), and what a command names in the checkout is there.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from nvpair.demo import ADMIN_PORT, FACADES
from tests.documented_commands import (
    COMMANDS,
    ROOT,
    RUNS,
    Command,
    ExercisedBy,
    NotHere,
    RunHere,
    commands_in,
    documented_commands,
    strip_comment,
)

SAMPLE = """\
Text with `make inline` code, which is no command.

```sh
make demo    # a comment
  echo '# not a comment' "nor # this" \\# nor this   # but this
echo a \\
     b
```

```toml
port = 1   # not shell
```

```console
$ curl -s http://127.0.0.1:1/healthz
{"status": "ok"}
```

~~~bash
kill -HUP PID
~~~

````sh
```
````
"""


def test_commands_are_the_lines_of_shell_blocks_without_comments() -> None:
    """One command a line, from sh/bash/console blocks only; comments stripped, quotes and
    escapes respected, a continued line joined, a session's output left out."""
    assert [(c.text, c.line) for c in commands_in(SAMPLE)] == [
        ("make demo", 4),
        ("""echo '# not a comment' "nor # this" \\# nor this""", 5),
        ("echo a b", 6),
        ("curl -s http://127.0.0.1:1/healthz", 15),
        ("kill -HUP PID", 20),
        ("```", 24),
    ]


def test_strip_comment_keeps_a_hash_inside_a_word() -> None:
    assert strip_comment("curl http://h/#frag  # why") == "curl http://h/#frag"


def _where(commands: list[Command]) -> str:
    return "\n".join(f"  {c.page}:{c.line}: {c.text}" for c in commands)


def test_every_documented_command_is_in_the_table() -> None:
    """A command added to a page needs a way to be exercised: an entry in
    tests/documented_commands.py (run here, tested elsewhere, or why it cannot run)."""
    missing = [c for c in documented_commands() if c.text not in COMMANDS]
    assert missing == [], "documented commands with no entry in COMMANDS:\n" + _where(missing)


def test_every_table_entry_is_still_documented() -> None:
    """An entry whose command left the docs (or changed) goes too."""
    shown = {c.text for c in documented_commands()}
    assert sorted(set(COMMANDS) - shown) == []


def test_the_table_covers_readme_and_every_docs_page() -> None:
    """The pages read are README.md and each docs/*.md, and they show commands to read."""
    pages = {c.page for c in documented_commands()}
    assert {"README.md", "docs/operations.md"} <= pages


def _functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _strings(function: ast.AST) -> set[str]:
    return {
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def _exists(reference: str) -> bool:
    path, _, function = reference.partition("::")
    file = ROOT / path
    return file.is_file() and (not function or function in _functions(file))


@pytest.mark.parametrize(
    "command", sorted(c for c, h in COMMANDS.items() if isinstance(h, RunHere))
)
def test_a_command_run_here_is_in_the_test_that_runs_it(command: str) -> None:
    """The test the table names exists in the integration module and holds the command's
    text (which it runs through ``documented(...)``, checking the table back)."""
    how = COMMANDS[command]
    assert isinstance(how, RunHere)
    functions = _functions(ROOT / RUNS)
    assert how.test in functions, f"{RUNS} has no {how.test}"
    assert command in _strings(functions[how.test]), f"{how.test} does not run {command!r}"


@pytest.mark.parametrize(
    "command", sorted(c for c, h in COMMANDS.items() if not isinstance(h, RunHere))
)
def test_a_test_named_for_a_command_exists(command: str) -> None:
    """Each ``path::function`` the table names is there; a file named alone (CI's script)
    runs the command itself."""
    how = COMMANDS[command]
    assert not isinstance(how, RunHere)
    reference = how.test if isinstance(how, ExercisedBy) else how.checked
    if reference is None:
        assert isinstance(how, NotHere) and how.reason
        return
    assert _exists(reference), reference
    if "::" not in reference:
        assert command in (ROOT / reference).read_text()


def _makefile_rules() -> dict[str, list[str]]:
    """Each Makefile target and its recipe lines."""
    rules: dict[str, list[str]] = {}
    recipe: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and recipe is not None:
            recipe.append(line.strip())
            continue
        rule = re.match(r"^([A-Za-z][\w-]*):(?!=)", line)
        recipe = rules.setdefault(rule[1], []) if rule else None
    return rules


def test_every_documented_make_target_is_a_rule() -> None:
    rules = _makefile_rules()
    targets = {
        shlex.split(c)[1] for c in COMMANDS if c.startswith("make ") and len(shlex.split(c)) == 2
    }
    assert targets and sorted(targets - set(rules)) == []


def test_make_demo_runs_what_the_demo_test_runs() -> None:
    """``make demo`` is exercised through test_demo.py, which runs its recipe's module."""
    assert any(line.endswith("-m nvpair.demo") for line in _makefile_rules()["demo"])
    assert "nvpair.demo" in (ROOT / "tests/integration/test_demo.py").read_text()


def test_no_command_needs_a_file_of_the_checkout() -> None:
    """No command names a file of the source tree (``etc/...``, ``nvpair/...``): a ``pip
    install`` has none. What an operator installs, the console script prints
    (``--example-fleet``, ``--systemd-unit``)."""
    named = {
        word
        for command in COMMANDS
        for word in shlex.split(command)
        if word.startswith(("etc/", "nvpair/", "./etc/"))
    }
    assert named == set()


def test_troubleshooting_ports_are_the_demos() -> None:
    """docs/operations.md says its commands use ``make demo``'s ports: they do."""
    demo = {ADMIN_PORT, *FACADES.values()}
    ports = {
        int(port)
        for command in commands_in((ROOT / "docs/operations.md").read_text())
        for port in re.findall(r"(?:127\.0\.0\.1:|--admin-port )(\d+)", command.text)
    }
    assert ports and sorted(ports - demo) == []


def test_the_quick_start_says_how_long_make_test_takes() -> None:
    """A first `make test` builds llama-server before the suite: the quick start says how long
    the suite takes without it and how long the build adds, so neither looks like a hang."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"`make test` takes about \d+ minutes", quick_start)
    assert re.search(r"build.*about \d+\s+minutes", quick_start, re.DOTALL)
