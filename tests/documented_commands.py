"""The commands README.md and docs/*.md show, read out of their shell code blocks, and the table
that says how each one is exercised (issue 12 item 10).

Every command a reader may copy is either run by this suite as written
(:class:`RunHere`: ``tests/integration/test_running_documented_commands.py``), or run in effect
by a test that already exists (:class:`ExercisedBy`), or cannot run on a test machine, and the
table says why (:class:`NotHere`). ``tests/test_documented_commands.py`` holds the table to the
docs: a command added to a page without an entry here fails the suite, and so does an entry
whose command left the docs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parents[1]

#: The pages whose commands are held to the table.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

#: Code blocks read as commands, by the first word of their info string. ``console`` blocks
#: show a session: only the ``$ `` lines are commands, the rest is output.
SHELL = frozenset({"sh", "bash", "shell"})
SESSION = frozenset({"console"})

#: Where :class:`RunHere` tests live.
RUNS = "tests/integration/test_running_documented_commands.py"

_FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@frozen
class Command:
    """One command as a reader sees it (comments stripped), and where it is shown."""

    text: str
    page: str
    line: int


def strip_comment(line: str) -> str:
    """``line`` without its shell comment: a ``#`` at the start or after a blank, outside
    quotes and not escaped, starts one."""
    quote: str | None = None
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line.rstrip()


def _blocks(markdown: str) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """Each fenced code block: its language (lower case, "" for none) and numbered lines."""
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        index += 1
        if opening is None or "`" in opening["info"]:
            continue
        fence, words = opening["fence"], opening["info"].split()
        body: list[tuple[int, str]] = []
        while index < len(lines):
            closing = _FENCE.match(lines[index])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                index += 1
                break
            body.append((index + 1, lines[index]))
            index += 1
        yield (words[0].lower() if words else ""), body


def code_blocks(markdown: str, language: str) -> list[str]:
    """The text of each of ``markdown``'s code blocks in ``language`` (``python``)."""
    return [
        "\n".join(line for _, line in body) + "\n"
        for found, body in _blocks(markdown)
        if found == language
    ]


def commands_in(markdown: str, page: str = "") -> list[Command]:
    """The commands of ``markdown``'s shell code blocks, one a line, comments stripped; a line
    ending in a backslash goes on on the next."""
    found: list[Command] = []
    for language, body in _blocks(markdown):
        if language not in SHELL | SESSION:
            continue
        pending: tuple[int, str] | None = None
        for number, raw in body:
            if pending is None:
                if language in SESSION:
                    if not raw.startswith("$ "):
                        continue
                    raw = raw[2:]
                start, text = number, raw
            else:
                start, text = pending[0], pending[1] + " " + raw.strip()
                pending = None
            if text.rstrip().endswith("\\"):
                pending = (start, text.rstrip()[:-1].rstrip())
                continue
            command = strip_comment(text).strip()
            if command:
                found.append(Command(command, page, start))
    return found


def documented_commands(pages: Sequence[Path] = PAGES) -> list[Command]:
    """Every command of every page, in page order."""
    return [
        command
        for page in pages
        for command in commands_in(page.read_text(), str(page.relative_to(ROOT)))
    ]


@frozen
class RunHere:
    """Run as written by ``test``, a test (or fixture) of :data:`RUNS`; ``as_run`` says what
    differs from the page, if anything (a free port for a fixed one, a temporary directory for
    a system one)."""

    test: str
    as_run: str = "as written"


@frozen
class ExercisedBy:
    """Not run as written, but what it does is: ``test`` is ``path::function``, or a file that
    runs exactly this command (CI's script)."""

    test: str
    how: str


@frozen
class NotHere:
    """Cannot run on a test machine, for ``reason``; ``checked`` names the test that checks what
    can be checked of it, if one does."""

    reason: str
    checked: str | None = None


How = RunHere | ExercisedBy | NotHere

_ROOT_ONLY = "needs root and changes the machine"
_SYSTEMD = "needs root and systemd as PID 1, with the unit installed"
_VERIFY = "tests/test_systemd_unit.py::test_systemd_analyze_verify_finds_nothing_wrong"
_RELOAD = "tests/test_systemd_unit.py::test_reload_is_sighup_to_the_main_process"
_FREE = "each fixed port (the demo's) replaced by a free one, against simulated nodes"

_LAN = (
    "in the fleet file's directory, with the proxy in fleet mode over simulated nodes; "
    "192.168.1.10 is the address a second network namespace reaches this machine at, where "
    "gpu-host.lan resolves to it; curl and the Python scripts (the page's, as written) run "
    "in that namespace; each fixed port (the facades' defaults) is a free one"
)

#: How each documented command is exercised, by its text as the page shows it.
COMMANDS: dict[str, How] = {
    # README.md, "Quick start"
    "make demo": ExercisedBy(
        "tests/integration/test_demo.py::test_demo_streams_through_every_facade",
        "runs the recipe, python -m nvpair.demo, asks every facade and fails a node over",
    ),
    "make test": ExercisedBy(".ci/run", "CI's script runs exactly this"),
    # README.md, "Installed" and "Running it"
    "nvpair-proxy --fleet fleet.toml": RunHere(
        "test_the_console_script_serves_a_fleet_file",
        "fleet.toml in the working directory: a simulated node, a free port",
    ),
    "nvpair-proxy --version": RunHere("test_version"),
    "nvpair-proxy --example-fleet > fleet.toml": RunHere("test_the_example_fleet_file"),
    "twistd -n nvpair-proxy --fleet fleet.toml": RunHere(
        "test_the_example_fleet_file",
        "fleet.toml: the example as printed, its LAN URLs pointed at simulated nodes on "
        "loopback and its fixed ports at free ones",
    ),
    "twistd -n nvpair-proxy": RunHere("test_twistd_is_driven_by_a_broker_on_stdio"),
    "twistd -r uvloop -n nvpair-proxy --fleet FILE": RunHere(
        "test_the_uvloop_reactor_serves_a_fleet_file", "FILE: a fleet file of a simulated node"
    ),
    "nvpair-proxy --reactor uvloop --fleet FILE": RunHere(
        "test_the_uvloop_reactor_serves_a_fleet_file", "FILE: a fleet file of a simulated node"
    ),
    # README.md, "As a systemd service"
    "sudo python3 -m venv /opt/nvpair": NotHere(
        f"{_ROOT_ONLY} (/opt); `make` creates .venv with the same module"
    ),
    "sudo /opt/nvpair/bin/pip install nvpair-proxy": NotHere(
        f"{_ROOT_ONLY}, and the package index; `make` installs the checkout with pip, and the "
        "console script that puts on the PATH is run throughout",
        "tests/integration/test_console_script.py::test_console_script_serves_a_fleet_and_writes_no_pid_file",
    ),
    "sudo ln -sf /opt/nvpair/bin/nvpair-proxy /usr/local/bin/nvpair-proxy": NotHere(
        f"{_ROOT_ONLY} (/usr/local/bin); the unit runs the path this link makes",
        "tests/test_systemd_unit.py::test_it_runs_the_console_script_on_the_fleet_file",
    ),
    "sudo nvpair-proxy --version": NotHere(
        f"{_ROOT_ONLY} (writes Twisted's plugin cache in the installed package); the same "
        "without sudo is run (nvpair-proxy --version)",
        f"{RUNS}::test_version",
    ),
    "nvpair-proxy --example-fleet | sudo install -D -m 0644 /dev/stdin /etc/nvpair/fleet.toml": (
        RunHere(
            "test_the_service_files_install_where_the_unit_reads_them",
            "without sudo, into a temporary directory standing for /",
        )
    ),
    "nvpair-proxy --systemd-unit | sudo install -m 0644 /dev/stdin "
    "/etc/systemd/system/nvpair-proxy.service": RunHere(
        "test_the_service_files_install_where_the_unit_reads_them",
        "without sudo, into a temporary directory standing for /",
    ),
    "sudo systemctl daemon-reload": NotHere(_SYSTEMD, _VERIFY),
    "sudo systemctl enable --now nvpair-proxy": NotHere(_SYSTEMD, _VERIFY),
    "sudo systemctl reload nvpair-proxy": NotHere(
        f"{_SYSTEMD}; the unit's ExecReload is kill -HUP $MAINPID, and kill -HUP PID is run",
        _RELOAD,
    ),
    "journalctl -u nvpair-proxy -f": NotHere(
        "needs the unit running under systemd's journal; what it shows, the JSON lines on "
        "stderr, is read by every integration test",
        "tests/integration/test_console_script.py::test_console_script_serves_a_fleet_and_writes_no_pid_file",
    ),
    # README.md, "Development"
    "make lint": NotHere(
        "the gate beside make test, not a test: inside the suite it would fail a test on any "
        "file's formatting, and make first reinstalls the venv when pyproject.toml changed"
    ),
    "make bench": NotHere(
        "minutes of load, and installs nginx, wrk and LiteLLM when missing; its parts are "
        "tested in bench/tests",
        "bench/tests/test_report.py::test_console_prints_pass_and_miss",
    ),
    "make test-fast": ExercisedBy(
        "tests/test_directory_marks.py::test_the_unit_selection_leaves_out_every_integration_and_real_test",
        "its recipe is pytest -m 'not integration and not real', a part of what make test runs; "
        "the test holds that the selection leaves out tests/integration and tests/real",
    ),
    "make test-real": ExercisedBy(
        "tests/real/test_llama_server.py::test_model_list_and_cors_of_the_real_engine",
        "its recipe is pytest on tests/real, which make test runs as part of the suite",
    ),
    # docs/engine-suite.md
    "make test-engine-suite": NotHere(
        "minutes of llama.cpp's own server tests, twice, from a venv it installs; its comparison "
        "of the two runs and the fleet file it writes are tested",
        "tests/fleet/test_engine_suite.py::test_a_test_whose_outcome_changed_is_listed_with_both_outcomes_and_why",
    ),
    "make soak": NotHere(
        "ten minutes of mixed traffic with faults; its pure parts are tested",
        "tests/test_soak.py::test_a_clean_run_passes_every_criterion",
    ),
    # docs/operations.md, "Troubleshooting"
    "nvpair-proxy --fleet fleet.toml --admin-port 21500": RunHere("fleet", _FREE),
    "curl -si http://127.0.0.1:21500/healthz": RunHere("test_is_it_healthy", _FREE),
    "curl -si http://127.0.0.1:21500/readyz": RunHere("test_is_it_healthy", _FREE),
    "curl -si http://127.0.0.1:11435/api/generate -d "
    """'{"model":"llama3","prompt":"hi","stream":false}' | grep -i '^x-nvpair'""": RunHere(
        "test_where_did_my_request_go", _FREE
    ),
    "curl -s http://127.0.0.1:21500/status | python3 -m json.tool": RunHere(
        "test_where_did_my_request_go", _FREE
    ),
    "curl -s http://127.0.0.1:21500/metrics | grep '^nvpair_attempts_total'": RunHere(
        "test_where_did_my_request_go", _FREE
    ),
    """nvpair-proxy --fleet fleet.toml --log-level debug 2>&1 | grep '"workloadId":"3"'""": (
        RunHere("test_the_debug_log_follows_one_workload", "fleet.toml: a simulated node")
    ),
    "curl -s http://127.0.0.1:21500/status | python3 -c 'import json, sys; "
    """[print(e, n["id"], n["state"], n["inFlight"], n["why"] or "") """
    """for e, ns in json.load(sys.stdin)["nodes"].items() for n in ns]'""": RunHere(
        "test_what_is_the_fleet_doing", _FREE
    ),
    "curl -s http://127.0.0.1:11435/api/tags": RunHere("test_why_502_for_my_model_name", _FREE),
    "curl -s http://127.0.0.1:8080/v1/models": RunHere("test_why_502_for_my_model_name", _FREE),
    """curl -si http://127.0.0.1:11435/api/generate -d '{"model":"nope","prompt":"hi"}'""": (
        RunHere("test_why_502_for_my_model_name", _FREE)
    ),
    """nvpair-proxy --fleet fleet.toml 2>&1 | grep '"level":"warn"'""": RunHere(
        "test_a_wrong_port_is_one_warning_naming_the_url",
        "fleet.toml: a simulated node and one at a closed port",
    ),
    "kill -HUP PID": RunHere("test_kill_hup_rereads_the_fleet_file", "PID: the proxy's"),
    # docs/lan.md
    **dict.fromkeys(
        [
            "nvpair-proxy --new-key laptop > laptop.txt",
            "tail -n +2 laptop.txt >> keys.toml",
            "head -n 1 laptop.txt",
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 "
            '-subj "/CN=nvpair LAN CA" -keyout ca.key -out ca.crt',
            "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            '-subj "/CN=gpu-host.lan" -keyout lan.key -out lan.csr',
            "printf 'subjectAltName = DNS:gpu-host.lan, IP:192.168.1.10\\nextendedKeyUsage = "
            "serverAuth\\n' > lan.ext",
            "openssl x509 -req -in lan.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 "
            "-extfile lan.ext -out lan.crt",
            'curl --cacert ca.crt -H "Authorization: Bearer $NVPAIR_KEY" https://gpu-host.lan:11435/api/tags',
            "SSL_CERT_FILE=ca.crt python3 chat.py",
            "SSL_CERT_FILE=ca.crt python3 ollama_chat.py",
        ],
        RunHere("test_serving_a_lan", _LAN),
    ),
}
