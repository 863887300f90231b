"""The installed ``nvpair-proxy`` console script, run as an operator runs it (issue 12, "Operator's
view"): the same process as ``twistd -n nvpair-proxy``, behaving like a server on the PATH."""

from __future__ import annotations

import json
import os
import pty
import select
import socket
import subprocess
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq

from nvpair import examples
from nvpair.fleet.file import load_fleet
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import NVPAIR_PROXY, TWISTD, free_port, write_fleet
from tests.integration.test_fleet import eventually

#: How each runner is started: the console script, and plain twistd (which takes the plugin's
#: options after ``-n nvpair-proxy``).
RUNNERS = {
    "console-script": [NVPAIR_PROXY],
    "twistd": [TWISTD, "--pidfile=", "-n", "nvpair-proxy"],
}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}


def run(command: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        timeout=timeout,
    )


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_version_is_nvpair_proxys(tmp_path: Path, runner: str) -> None:
    """``--version`` prints nvpair-proxy's version from its package metadata, not Twisted's."""
    result = run([*RUNNERS[runner], "--version"], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"nvpair-proxy {version('nvpair-proxy')}\n"


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--dial-timeout", "abc"],
            "nvpair-proxy: --dial-timeout: invalid duration 'abc': expected a number",
        ),
        (["--max-dispatch-attempts", "0"], "nvpair-proxy: --max-dispatch-attempts: '0' is not"),
        (["--bogus"], "nvpair-proxy: option --bogus not recognized"),
        (
            ["--bind", "nosuchhost.invalid"],
            "nvpair-proxy: --bind: cannot resolve host 'nosuchhost.invalid': Name or service "
            "not known",
        ),
        (
            ["--reactor", "bogus"],
            "nvpair-proxy: --reactor: no reactor named 'bogus' (twistd --help-reactors lists them)",
        ),
        (["--log-format", "yaml"], "nvpair-proxy: --log-format: unknown log format 'yaml'"),
    ],
)
def test_usage_error_is_one_line_naming_the_option(
    tmp_path: Path, runner: str, args: list[str], line: str
) -> None:
    """A malformed value is a usage error (docs/README.md#command-line): non-zero, one line
    naming the option, on stderr; not twistd's whole help, and nothing on stdout (the
    broker's)."""
    result = run([*RUNNERS[runner], *args], tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(line)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            "[facades.ollama]\nport = 18080\n[facades.llamacpp]\nport = 18080\n",
            "facades.llamacpp.port: port 18080 is also facades.ollama's: each facade needs its own",
        ),
        (
            '[facades.llamacpp]\n[[nodes]]\nid = "a"\n'
            '[nodes.engines]\nllamacpp = "http://127.0.0.1:99999"\n',
            "nodes[0].engines.llamacpp: port 99999 is out of range (1-65535)",
        ),
        (
            '[facades.llamacpp]\n[[nodes]]\nid = "a"\n'
            '[nodes.engines]\nllama = "http://127.0.0.1:8081"\n',
            "nodes[0].engines.llama: unknown engine 'llama'; expected one of ollama, lmstudio, "
            "llamacpp",
        ),
        (
            '[facades.llamacpp]\n[[nodes]]\nid = "a"\n'
            '[nodes.engines]\nllamacpp = "http://127.0.0.1:8081"\n'
            '[nodes.credentials]\nllamacpp = "env:NVPAIR_TEST_NO_SUCH_KEY"\n',
            "nodes[0].credentials.llamacpp: environment variable NVPAIR_TEST_NO_SUCH_KEY is not "
            "set",
        ),
    ],
)
def test_a_fleet_file_mistake_is_one_line_saying_what_it_is(
    tmp_path: Path, runner: str, text: str, why: str
) -> None:
    """Issue 20 item 2: two facades on one port, a port out of range, an engine misnamed (and
    issue 22 item 2: a node credential's variable not set): each a usage error (exit 2), one
    line that says which and what, nothing started."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(text)
    result = run([*RUNNERS[runner], "--fleet", str(fleet)], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"nvpair-proxy: --fleet: {fleet}: {why}\n"


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_fleet_facade_that_cannot_bind_ends_the_process(tmp_path: Path, runner: str) -> None:
    """In fleet mode a facade that cannot bind ends the process (docs/ports.md#bind-failures)
    with a non-zero status and the reason on stderr, after an ordered shutdown (the facade that
    did bind is closed, and twistd's own epilogue runs: no pid file is left behind)."""
    with socket.socket(socket.AF_INET6) as squatter:
        squatter.bind(("::", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        fleet = tmp_path / "fleet.toml"
        fleet.write_text(
            f"[facades.ollama]\nport = {free_port()}\n"
            f"[facades.llamacpp]\nport = {taken}\n"
            '[[nodes]]\nid = "a"\n[nodes.engines]\nllamacpp = "http://127.0.0.1:9"\n'
        )
        # twistd itself writes its pid file here: the end still removes it.
        command = [c for c in RUNNERS[runner] if c != "--pidfile="]
        started = time.monotonic()
        result = run([*command, "--fleet", str(fleet), "--state-dir", str(tmp_path)], tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert result.stdout == ""
    records = [json.loads(line) for line in result.stderr.splitlines()]
    errors = [r["msg"] for r in records if r["level"] == "error"]
    assert errors == [
        f"llama.cpp facade not enabled: cannot listen on port {taken}: "
        "[Errno 98] Address already in use: ending the process"
    ]
    assert records[-1]["msg"] == "nvpair-proxy stopped"  # stopped in order, not killed
    assert not (tmp_path / "twistd.pid").exists()


def _said(stderr: str) -> list[tuple[str, str]]:
    """What the process said at warn level and above: (level, message) per line; every line
    of ``stderr`` must be a JSON record (a traceback's lines are not)."""
    records = [json.loads(line) for line in stderr.splitlines()]
    return [(r["level"], r["msg"]) for r in records if r["level"] in ("warn", "error")]


@pytest.mark.parametrize(
    ("runner", "mode"),
    [("console-script", "fleet"), ("twistd", "fleet"), ("console-script", "broker")],
)
def test_an_admin_port_in_use_ends_the_process_in_two_lines(
    tmp_path: Path, runner: str, mode: str
) -> None:
    """``--admin-port`` on a port already taken is said as a facade's port is (docs/operations.md
    #the-admin-listener): a warning naming the address, the error that ends the process, exit
    status 1 after the ordered shutdown; never a traceback (it was 36 lines of one)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        args = ["--state-dir", str(tmp_path), "--admin-port", str(taken)]
        if mode == "fleet":
            fleet = tmp_path / "fleet.toml"
            fleet.write_text(
                f"[facades.llamacpp]\nport = {free_port()}\n"
                '[[nodes]]\nid = "a"\n[nodes.engines]\nllamacpp = "http://127.0.0.1:9"\n'
            )
            args += ["--fleet", str(fleet)]
        # stdin a pipe kept open, as a broker's: the process must end by itself.
        out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
        with out_file.open("wb") as out_sink, err_file.open("wb") as err_sink:
            proxy = subprocess.Popen(
                [*RUNNERS[runner], *args],
                stdin=subprocess.PIPE,
                stdout=out_sink,
                stderr=err_sink,
                cwd=tmp_path,
                env=clean_env(),
            )
            try:
                proxy.wait(timeout=30)
            finally:
                if proxy.poll() is None:
                    proxy.kill()
                    proxy.wait()
                assert proxy.stdin is not None
                proxy.stdin.close()
        out, err = out_file.read_text(), err_file.read_text()
    assert proxy.returncode == 1, err[-2000:]
    why = f"cannot listen on 127.0.0.1:{taken}: [Errno 98] Address already in use"
    assert _said(err) == [
        ("warn", why),
        ("error", f"admin listener not started: {why}: ending the process"),
    ]
    assert "Traceback" not in err
    assert '"msg":"nvpair-proxy stopped"' in err  # stopped, not crashed
    assert out == ""


@pytest_twisted.ensureDeferred
async def test_console_script_serves_a_fleet_and_writes_no_pid_file(tmp_path: Path) -> None:
    """``nvpair-proxy --fleet FILE`` is the standalone server: in the foreground, JSON logs on
    stderr, nothing on stdout, and no ``twistd.pid`` in its working directory."""
    run_dir = tmp_path / "run"
    async with sims(("ollama", ["llama3:latest"], "a")) as (a,):
        port = free_port()
        fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
        async with running_proxy(run_dir, "--fleet", str(fleet), console_script=True) as proxy:
            url = f"http://127.0.0.1:{port}"

            async def answers() -> bool:
                try:
                    response = await treq.post(
                        url + "/api/generate",
                        json.dumps({"model": "llama3", "prompt": "x", "stream": False}).encode(),
                        timeout=5,
                    )
                    await response.content()
                except Exception:
                    return False
                return bool(response.headers.getRawHeaders(b"x-nvpair-node") == [b"a"])

            await eventually(answers, proxy.logs)
            tags = json.loads(await (await treq.get(url + "/api/tags")).content())
            assert [m["name"] for m in tags["models"]] == ["llama3:latest"]
            assert not (run_dir / "twistd.pid").exists()
            assert [p.name for p in run_dir.iterdir() if p.suffix == ".pid"] == []
            assert proxy.raw_stdout == b"" and proxy.bad_log_lines == []
            assert any(r.get("msg", "").startswith("nvpair-proxy ") for r in proxy.logs)


#: The files the package ships, by the option that prints each (docs/README.md#command-line).
SHIPPED = {"--example-fleet": examples.FLEET, "--systemd-unit": examples.SYSTEMD_UNIT}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
@pytest.mark.parametrize("flag", sorted(SHIPPED))
def test_a_shipped_file_is_printed(tmp_path: Path, runner: str, flag: str) -> None:
    """``--example-fleet`` and ``--systemd-unit`` print the package's own copy on stdout and
    exit 0, starting nothing: a ``pip install`` needs no source tree."""
    result = run([*RUNNERS[runner], flag], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == examples.text(SHIPPED[flag])
    assert list(tmp_path.iterdir()) == []


def test_the_printed_example_is_a_fleet_file(tmp_path: Path) -> None:
    """What ``nvpair-proxy --example-fleet > fleet.toml`` writes is read by the fleet-file
    loader as it stands: two facades, two nodes."""
    result = run([NVPAIR_PROXY, "--example-fleet"], tmp_path)
    path = tmp_path / "fleet.toml"
    path.write_text(result.stdout)
    fleet = load_fleet(path)
    assert sorted(fleet.facades) == ["llamacpp", "ollama"]
    assert [node.id for node in fleet.nodes] == ["gpu-box-1", "gpu-box-2"]


def _printed_into(flag: str, stdout: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NVPAIR_PROXY, flag],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
        timeout=60,
    )


def test_a_shipped_file_to_a_stdout_that_cannot_take_it() -> None:
    """A full disk is one line and exit 1, not a traceback; a reader that is gone (``| head``)
    is exit 1 and nothing said."""
    with open("/dev/full", "w") as full:
        result = _printed_into("--example-fleet", full)
    assert (result.returncode, result.stderr) == (
        1,
        "nvpair-proxy: cannot write fleet.example.toml to stdout: No space left on device\n",
    )
    reader, writer = os.pipe()
    os.close(reader)
    try:
        result = _printed_into("--systemd-unit", writer)
    finally:
        os.close(writer)
    assert (result.returncode, result.stderr) == (1, "")


def read_until(stream: Any, marker: bytes, timeout: float = 30) -> bytes:
    """What ``stream`` (a pipe) gives until ``marker`` appears or ``timeout`` passes."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    return seen


def test_on_a_terminal_it_says_it_waits_for_a_broker(tmp_path: Path) -> None:
    """Started without --fleet with stdin a terminal, the process says on stderr that it waits
    for a broker on stdin, and how to run standalone; stdout (the broker's) stays empty."""
    controller, terminal = pty.openpty()
    proxy = subprocess.Popen(
        [NVPAIR_PROXY, "--state-dir", str(tmp_path)],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=clean_env(),
    )
    os.close(terminal)
    try:
        assert proxy.stderr is not None
        said = read_until(proxy.stderr, b"make demo").decode()
    finally:
        proxy.terminate()
        out, _ = proxy.communicate(timeout=30)
        os.close(controller)
    assert "nvpair-proxy: waiting for a broker on stdin" in said
    assert "nvpair-proxy --fleet FILE" in said and "make demo" in said
    # An installed copy has no source tree: the example is a command, not a path in one.
    assert "nvpair-proxy --example-fleet" in said and "etc/" not in said
    assert out == b""


def test_a_brokers_pipe_gets_no_terminal_hint(tmp_path: Path) -> None:
    """With stdin a pipe (a broker), nothing but JSON log lines reaches stderr."""
    proxy = subprocess.Popen(
        [NVPAIR_PROXY, "--state-dir", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=clean_env(),
    )
    try:
        assert proxy.stderr is not None
        said = read_until(proxy.stderr, b"event loop")
    finally:
        proxy.terminate()
        out, rest = proxy.communicate(timeout=30)
    assert b"event loop" in said
    assert out == b""
    for line in (said + rest).splitlines():
        assert json.loads(line)["component"] == "nvpair-proxy"


def test_help_names_the_console_script(tmp_path: Path) -> None:
    """``nvpair-proxy --help`` is the plugin's options under the program's own name."""
    result = run([NVPAIR_PROXY, "--help"], tmp_path)
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == "Usage: nvpair-proxy [options]"
    assert "--fleet=" in result.stdout and "Display nvpair-proxy's version" in result.stdout


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_new_key_prints_a_secret_and_its_block(tmp_path: Path, runner: str) -> None:
    """``--new-key NAME`` (docs/lan.md#keys): the secret on one line, then the ``[[keys]]``
    block whose digest is the secret's; exit 0, no file read or written, nothing started."""
    import hashlib

    from nvpair.fleet.lanconfig import parse_keys

    result = run([*RUNNERS[runner], "--new-key", "laptop"], tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    secret, block = result.stdout.split("\n", 1)
    assert secret.startswith("nvp_") and len(secret) >= 4 + 43
    (key,) = parse_keys(block.encode(), "stdout")
    assert key.name == "laptop" and key.digest == hashlib.sha256(secret.encode()).digest()
    assert list(tmp_path.iterdir()) == []
    again = run([*RUNNERS[runner], "--new-key", "laptop"], tmp_path)
    assert again.stdout.split("\n", 1)[0] != secret


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_new_key_with_a_bad_name_is_a_usage_error(tmp_path: Path, runner: str) -> None:
    result = run([*RUNNERS[runner], "--new-key", "my laptop"], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "nvpair-proxy: --new-key: 'my laptop' must be 1-64 letters, digits, '.', '_' or '-', "
        "starting with a letter or digit\n"
    )
