"""The commands README.md and docs/*.md show that can run on a test machine, run as the pages
show them (issue 12 item 10; the table of every command is tests/documented_commands.py).

Each runs in a subprocess on loopback with bounded waits: the proxy as ``nvpair-proxy`` or
``twistd`` from this venv (first on the PATH), ``curl`` and pipelines through ``bash -c``, the
engines simulated by ``python -m nvpair.sim`` processes. Where a page shows a fixed port (the
demo's), a placeholder (``FILE``, ``PID``) or a system path, the test puts a free port, a file of
its own or a temporary directory in its place, and the table says so; nothing else in a command
changes. Every process started here is ended here, by its id.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from email.message import Message
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any

import pytest
from attrs import frozen

from nvpair.demo import ADMIN_PORT, CHECKS, FACADES
from nvpair.fleet.file import load_fleet
from tests.documented_commands import COMMANDS, ROOT, RunHere
from tests.integration.harness import free_port

pytestmark = pytest.mark.integration

#: The venv's scripts (nvpair-proxy, twistd) come first on the children's PATH.
BIN = Path(sys.executable).parent

#: The bound on every wait of this module, in seconds.
WAIT = 20.0

EXAMPLE = ROOT / "nvpair" / "examples" / "fleet.example.toml"
UNIT = ROOT / "nvpair" / "examples" / "nvpair-proxy.service"

_GENERATE = {"model": "llama3", "prompt": "hi", "stream": False}


def documented(command: str) -> str:
    """``command``, checked against the table: run here, by the calling test (or fixture)."""
    frame = inspect.currentframe()
    caller = frame.f_back.f_code.co_name if frame is not None and frame.f_back else "?"
    how = COMMANDS.get(command)
    assert isinstance(how, RunHere) and how.test == caller, (command, how, caller)
    return command


def environ(state: Path) -> dict[str, str]:
    """The children's environment: no NVPAIR_ settings of the caller's, this venv first on
    the PATH, persisted ports in ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["NVPAIR_STATE_DIR"] = str(state)
    return env


def at_ports(command: str, ports: Mapping[int, int]) -> str:
    """``command`` with each documented port (a loopback URL's, ``--admin-port``'s) replaced by
    the test's; a port the test does not know fails."""

    def swap(found: re.Match[str]) -> str:
        port = int(found[0])
        assert port in ports, f"port {port} of {command!r} is none this test knows"
        return str(ports[port])

    return re.sub(r"(?<=127\.0\.0\.1:)\d+|(?<=--admin-port )\d+", swap, command)


def replaced(command: str, **words: str) -> str:
    """``command`` with each placeholder word (``FILE``, ``PID``) replaced; each must be there."""
    for word, value in words.items():
        assert re.search(rf"\b{word}\b", command), (word, command)
        command = re.sub(rf"\b{word}\b", value, command)
    return command


def shell(command: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` run to its end by bash, as a reader's shell runs it."""
    return subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        timeout=WAIT,
        check=False,
    )


def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def text_of(path: Path, marker: str, after: int = 0) -> str:
    """``path``'s text once ``marker`` is in it past offset ``after``."""
    found = ""

    def there() -> bool:
        nonlocal found
        found = path.read_text(errors="replace")
        return marker in found[after:]

    eventually(there, f"{marker!r} in {path.name}")
    return found


def http(url: str, body: object = None) -> tuple[int, Message, bytes]:
    """A GET, or a POST of ``body`` as JSON: the status, headers and body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def lists(port: int, path: str, field: str, key: str, model: str) -> Callable[[], bool]:
    """Whether the facade on ``port`` lists ``model`` (its nodes were polled)."""

    def check() -> bool:
        status, _, body = http(f"http://127.0.0.1:{port}{path}")
        return status == 200 and model in [m[key] for m in json.loads(body)[field]]

    return check


def ollama_lists_llama3(port: int) -> Callable[[], bool]:
    return lists(port, "/api/tags", "models", "name", "llama3:latest")


def answered_by(port: int) -> tuple[int, str | None]:
    """An Ollama inference through the facade on ``port``: its status and X-Nvpair-Node."""
    status, headers, _ = http(f"http://127.0.0.1:{port}/api/generate", _GENERATE)
    return status, headers.get("X-Nvpair-Node")


def split_answer(curl_i: str) -> tuple[str, str]:
    """``curl -si`` output: the status line and headers, and the body."""
    head, _, body = curl_i.partition("\n\n")  # text mode: CRLF read as LF
    return head, body


def fleet_toml(
    facades: Mapping[str, int], nodes: Mapping[str, Mapping[str, str]], interval: str = "200ms"
) -> str:
    text = f'inventory-interval = "{interval}"\n'
    for engine, port in facades.items():
        text += f"[facades.{engine}]\nport = {port}\n"
    for node, engines in nodes.items():
        text += f'[[nodes]]\nid = "{node}"\n[nodes.engines]\n'
        text += "".join(f'{engine} = "{url}"\n' for engine, url in engines.items())
    return text


# -- children -------------------------------------------------------------------------------------


@frozen
class Child:
    """A process this module started: its stdout and stderr go to files."""

    process: subprocess.Popen[bytes]
    out: Path
    err: Path


_CHILDREN = itertools.count(1)


def _children_of(pid: int) -> list[int]:
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat_file.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                found.append(int(stat_file.parent.name))
    return found


def _is_proxy(pid: int) -> bool:
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return Path(argv[0].decode()).name != "grep" and any(
            Path(arg.decode()).name in ("nvpair-proxy", "twistd") for arg in argv[:2]
        )
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a child of this module by its id. In a pipeline (``bash -c "proxy | grep"``) the
    proxy is ended, not the shell, so the commands after it read to the end and flush."""
    if process.poll() is None:
        proxies = [pid for pid in _children_of(process.pid) if _is_proxy(pid)]
        for pid in proxies or [process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        # Its own session (start_new_session): the group is this child and its pipeline.
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


@contextlib.contextmanager
def child(
    argv: list[str], cwd: Path, env: Mapping[str, str], stdin: int | IO[bytes] | None = None
) -> Iterator[Child]:
    """``argv`` running for the body of a ``with``, then ended (:func:`stop`)."""
    name = f"{next(_CHILDREN)}-{Path(argv[0]).name}"
    out, err = cwd / f"{name}.out", cwd / f"{name}.err"
    with out.open("wb") as out_file, err.open("wb") as err_file:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,
        )
    try:
        yield Child(process, out, err)
    finally:
        stop(process)


# -- simulated nodes ------------------------------------------------------------------------------


@frozen
class Sim:
    """One ``python -m nvpair.sim`` process: one node's engines."""

    child: Child
    urls: dict[str, str]

    def toggle(self, signum: signal.Signals, said: str) -> None:
        """Work a fault knob by signal, and wait until the simulator says it took effect."""
        mark = len(self.child.err.read_text())
        self.child.process.send_signal(signum)
        text_of(self.child.err, said, after=mark)


_LISTENING = re.compile(r"nvpair\.sim: (\w+) node \S+ on (http://\S+) \(port")

#: The simulated fleet: node -> (engine, models) it serves.
NODES = {
    "node-a": [("ollama", "llama3:latest"), ("llamacpp", "tiny")],
    "node-b": [("ollama", "llama3:latest")],
}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sim]]:
    where = tmp_path_factory.mktemp("sims")
    with contextlib.ExitStack() as stack:
        started = {}
        for node, serves in NODES.items():
            argv = [sys.executable, "-m", "nvpair.sim"]
            for engine, models in serves:
                argv += ["--serve", engine, "0", node, models]
            started[node] = stack.enter_context(child(argv, where, environ(where)))
        sims = {}
        for node, sim in started.items():

            def listening(sim: Child = sim, count: int = len(NODES[node])) -> bool:
                return len(_LISTENING.findall(sim.err.read_text())) == count

            eventually(listening, f"{node} listening")
            sims[node] = Sim(sim, dict(_LISTENING.findall(sim.err.read_text())))
        yield sims


# -- the troubleshooting fleet --------------------------------------------------------------------


@frozen
class Fleet:
    """The proxy of docs/operations.md's troubleshooting, at free ports, over both nodes."""

    where: Path
    ports: dict[int, int]
    proxy: Child
    env: dict[str, str]

    def run(self, command: str, **words: str) -> subprocess.CompletedProcess[str]:
        command = at_ports(replaced(command, **words) if words else command, self.ports)
        return shell(command, self.where, self.env)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, sims: dict[str, Sim]) -> Iterator[Fleet]:
    if shutil.which("curl") is None:
        pytest.skip("no curl here (Debian's curl package): the troubleshooting commands use it")
    where = tmp_path_factory.mktemp("fleet")
    ports = {port: free_port() for port in (ADMIN_PORT, FACADES["ollama"], FACADES["llamacpp"])}
    (where / "fleet.toml").write_text(
        fleet_toml(
            {"ollama": ports[FACADES["ollama"]], "llamacpp": ports[FACADES["llamacpp"]]},
            {node: sim.urls for node, sim in sims.items()},
        )
    )
    command = at_ports(documented("nvpair-proxy --fleet fleet.toml --admin-port 21500"), ports)
    env = environ(where / "state")
    with child(shlex.split(command), where, env) as proxy:
        ready = f"http://127.0.0.1:{ports[ADMIN_PORT]}/readyz"
        eventually(lambda: http(ready)[0] == 200, "/readyz 200")
        yield Fleet(where, ports, proxy, env)


# -- README.md: installed, running it -------------------------------------------------------------


def test_version(tmp_path: Path) -> None:
    result = shell(documented("nvpair-proxy --version"), tmp_path, environ(tmp_path))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"nvpair-proxy {version('nvpair-proxy')}\n"


def test_the_console_script_serves_a_fleet_file(tmp_path: Path, sims: dict[str, Sim]) -> None:
    port = free_port()
    (tmp_path / "fleet.toml").write_text(
        fleet_toml({"ollama": port}, {"node-a": {"ollama": sims["node-a"].urls["ollama"]}})
    )
    argv = shlex.split(documented("nvpair-proxy --fleet fleet.toml"))
    with child(argv, tmp_path, environ(tmp_path)) as proxy:
        eventually(ollama_lists_llama3(port), "the facade lists llama3")
        assert answered_by(port) == (200, "node-a")
    # Ended as twistd ends on SIGTERM: an ordered shutdown, then the signal's own status.
    assert proxy.process.returncode == -signal.SIGTERM
    assert proxy.err.read_text().endswith('"msg":"nvpair-proxy stopped"}\n')
    assert proxy.out.read_bytes() == b""


def loopback_example(text: str, sims: Mapping[str, Sim]) -> tuple[str, dict[str, int]]:
    """The example fleet file ``text``, but its nodes' LAN URLs pointing at the simulated
    nodes (its first node at the first simulator, ...) and each facade at a free port."""
    example = tomllib.loads(text)
    for node, sim in zip(example["nodes"], sims.values(), strict=True):
        for engine, url in node["engines"].items():
            assert text.count(f'"{url}"') == 1, url
            text = text.replace(f'"{url}"', f'"{sim.urls[engine]}"')
    ports = {engine: free_port() for engine in example["facades"]}
    for engine, facade in example["facades"].items():
        if "port" in facade:
            text, count = re.subn(
                rf"^port = {facade['port']}\b", f"port = {ports[engine]}", text, flags=re.M
            )
        else:
            header = f"[facades.{engine}]\n"
            count = text.count(header)
            text = text.replace(header, f"{header}port = {ports[engine]}\n")
        assert count == 1, engine
    derived = tomllib.loads(text)
    assert {e: f["port"] for e, f in derived["facades"].items()} == ports
    urls = [url for node in derived["nodes"] for url in node["engines"].values()]
    assert all(url.startswith("http://127.0.0.1:") for url in urls), urls
    return text, ports


def test_the_example_fleet_file(tmp_path: Path, sims: dict[str, Sim]) -> None:
    """The example file as the console script prints it: its facades listen and answer, each
    one's model list and an inference served by one of the file's nodes."""
    env = environ(tmp_path / "state")
    printed = shell(documented("nvpair-proxy --example-fleet > fleet.toml"), tmp_path, env)
    assert (printed.returncode, printed.stderr) == (0, "")
    fleet = tmp_path / "fleet.toml"
    assert fleet.read_text() == EXAMPLE.read_text()
    text, ports = loopback_example(fleet.read_text(), sims)
    fleet.write_text(text)
    nodes = {node["id"] for node in tomllib.loads(text)["nodes"]}
    command = documented("twistd -n nvpair-proxy --fleet fleet.toml")
    with child(shlex.split(command), tmp_path, env):
        for engine, port in ports.items():
            check = CHECKS[engine]
            base = f"http://127.0.0.1:{port}"

            def listed(base: str = base, check: Any = check) -> bool:
                status, _, body = http(base + check.models_path)
                return status == 200 and bool(check.models(json.loads(body)))

            eventually(listed, f"{engine}'s model list")
            status, headers, _ = http(base + check.inference_path, check.inference)
            assert status == 200 and headers.get("X-Nvpair-Node") in nodes, engine


def _frames(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_twistd_is_driven_by_a_broker_on_stdio(tmp_path: Path, sims: dict[str, Sim]) -> None:
    """With no --fleet the process waits for a broker on stdin: this test plays it, enables a
    facade, gives it a node, and the node answers through it; closing stdin ends the process."""
    port = free_port()
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb") as to_proxy:
        argv = shlex.split(documented("twistd -n nvpair-proxy"))
        with child(argv, tmp_path, environ(tmp_path), stdin=reader) as proxy:
            os.close(reader)

            def send(frame: dict[str, object]) -> None:
                to_proxy.write(json.dumps({"jsonrpc": "2.0", **frame}).encode() + b"\n")
                to_proxy.flush()

            def frame(predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
                found: list[dict[str, Any]] = []

                def written() -> bool:
                    found[:] = [f for f in _frames(proxy.out) if predicate(f)]
                    return bool(found)

                eventually(written, "a frame from the proxy")
                return found[0]

            enable = {"engine": "ollama", "port": port}
            send({"id": "enable", "method": "facade/enable", "params": enable})
            answer = frame(lambda f: f.get("id") == "enable" and "method" not in f)
            assert answer["result"]["port"] == port
            subscribe = frame(lambda f: f.get("method") == "ollama:discovery:subscribe")
            send({"id": subscribe["id"], "result": {}})
            node = {"id": "node-a", "url": sims["node-a"].urls["ollama"], "models": ["llama3"]}
            send({"method": "ollama:discovery:nodes", "params": {"nodes": [node]}})
            eventually(lambda: answered_by(port) == (200, "node-a"), "node-a answers")
            to_proxy.close()
            proxy.process.wait(timeout=WAIT)
    assert proxy.process.returncode == 0
    assert "broker link closed: shutting down" in proxy.err.read_text()


@pytest.mark.parametrize(
    "line",
    [
        "twistd -r uvloop -n nvpair-proxy --fleet FILE",
        "nvpair-proxy --reactor uvloop --fleet FILE",
    ],
)
def test_the_uvloop_reactor_serves_a_fleet_file(
    tmp_path: Path, sims: dict[str, Sim], line: str
) -> None:
    port = free_port()
    path = tmp_path / "fleet.toml"
    path.write_text(
        fleet_toml({"ollama": port}, {"node-a": {"ollama": sims["node-a"].urls["ollama"]}})
    )
    command = replaced(documented(line), FILE=str(path))
    with child(shlex.split(command), tmp_path, environ(tmp_path)) as proxy:
        eventually(ollama_lists_llama3(port), "the facade lists llama3")
        assert answered_by(port) == (200, "node-a")
    assert '"msg":"event loop: asyncio on uvloop"' in proxy.err.read_text()


# -- README.md: as a systemd service --------------------------------------------------------------


def test_the_service_files_install_where_the_unit_reads_them(tmp_path: Path) -> None:
    """The two install lines, as this user into a directory standing for ``/``: the files are
    what the console script prints (the package's), the modes are 0644, and the fleet file
    lands where the unit's ExecStart reads it."""
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    env = environ(tmp_path)
    for line in (
        documented(
            "nvpair-proxy --example-fleet | sudo install -D -m 0644 /dev/stdin "
            "/etc/nvpair/fleet.toml"
        ),
        documented(
            "nvpair-proxy --systemd-unit | sudo install -m 0644 /dev/stdin "
            "/etc/systemd/system/nvpair-proxy.service"
        ),
    ):
        assert line.count(" | sudo ") == 1
        command = line.replace(" | sudo ", " | ").replace(" /etc/", f" {root}/etc/")
        result = shell(command, tmp_path, env)
        assert result.returncode == 0, result.stderr
    fleet_file = root / "etc" / "nvpair" / "fleet.toml"
    unit = root / "etc" / "systemd" / "system" / "nvpair-proxy.service"
    for installed in (fleet_file, unit):
        assert stat.S_IMODE(installed.stat().st_mode) == 0o644, installed
    assert fleet_file.read_text() == EXAMPLE.read_text()
    assert unit.read_text() == UNIT.read_text()
    assert load_fleet(fleet_file).nodes
    (exec_start,) = [
        line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")
    ]
    words = shlex.split(exec_start.removeprefix("ExecStart="))
    assert words[words.index("--fleet") + 1] == "/" + str(fleet_file.relative_to(root))


# -- docs/operations.md: troubleshooting ----------------------------------------------------------


def test_is_it_healthy(fleet: Fleet) -> None:
    head, body = split_answer(
        fleet.run(documented("curl -si http://127.0.0.1:21500/healthz")).stdout
    )
    assert head.startswith("HTTP/1.1 200 ") and json.loads(body) == {"status": "ok"}
    head, body = split_answer(
        fleet.run(documented("curl -si http://127.0.0.1:21500/readyz")).stdout
    )
    assert head.startswith("HTTP/1.1 200 ")
    assert json.loads(body) == {"ready": True, "waitingFor": [], "enginesWithoutNodes": []}


def test_where_did_my_request_go(fleet: Fleet, sims: dict[str, Sim]) -> None:
    """The answer's header, then a failover as ``recent`` and ``nvpair_attempts_total`` show
    it: node-a answers 503 (the simulator's SIGUSR1 knob), node-b serves."""
    ask = documented(
        "curl -si http://127.0.0.1:11435/api/generate -d "
        """'{"model":"llama3","prompt":"hi","stream":false}' | grep -i '^x-nvpair'"""
    )
    assert fleet.run(ask).stdout.strip() == "X-Nvpair-Node: node-a"
    node_a = sims["node-a"]
    node_a.toggle(signal.SIGUSR1, "failing")
    try:
        assert fleet.run(ask).stdout.strip() == "X-Nvpair-Node: node-b"
    finally:
        node_a.toggle(signal.SIGUSR1, "healthy")

    status = json.loads(
        fleet.run(documented("curl -s http://127.0.0.1:21500/status | python3 -m json.tool")).stdout
    )
    newest = status["recent"][0]
    assert newest["state"] == "completed" and newest["model"] == "llama3:latest"
    assert [(a["node"], a["result"], a["status"]) for a in newest["attempts"]] == [
        ("node-a", "status", 503),
        ("node-b", "served", 200),
    ]
    metrics = fleet.run(
        documented("curl -s http://127.0.0.1:21500/metrics | grep '^nvpair_attempts_total'")
    ).stdout.splitlines()
    assert all(line.startswith("nvpair_attempts_total{") for line in metrics)
    assert 'nvpair_attempts_total{engine="ollama",node="node-a",result="status"} 1.0' in metrics
    assert 'nvpair_attempts_total{engine="ollama",node="node-b",result="served"} 1.0' in metrics


def test_what_is_the_fleet_doing(fleet: Fleet) -> None:
    one_line_per_node = documented(
        "curl -s http://127.0.0.1:21500/status | python3 -c 'import json, sys; "
        """[print(e, n["id"], n["state"], n["inFlight"], n["why"] or "") """
        """for e, ns in json.load(sys.stdin)["nodes"].items() for n in ns]'"""
    )
    result = fleet.run(one_line_per_node)
    assert result.stderr == ""
    assert [line.rstrip() for line in result.stdout.splitlines()] == [
        "llamacpp node-a up 0",
        "ollama node-a up 0",
        "ollama node-b up 0",
    ]


def test_why_502_for_my_model_name(fleet: Fleet) -> None:
    tags = json.loads(fleet.run(documented("curl -s http://127.0.0.1:11435/api/tags")).stdout)
    assert [m["name"] for m in tags["models"]] == ["llama3:latest"]
    models = json.loads(fleet.run(documented("curl -s http://127.0.0.1:8080/v1/models")).stdout)
    assert [m["id"] for m in models["data"]] == ["tiny"]
    nobody = documented(
        """curl -si http://127.0.0.1:11435/api/generate -d '{"model":"nope","prompt":"hi"}'"""
    )
    head, body = split_answer(fleet.run(nobody).stdout)
    assert head.startswith("HTTP/1.1 502 ") and "\nX-Nvpair-Error: no-owner" in head
    assert json.loads(body) == {"error": 'no node advertises model "nope"'}


def test_the_debug_log_follows_one_workload(tmp_path: Path, sims: dict[str, Sim]) -> None:
    """At debug level each workload event is a record; grep on one ``workloadId`` gives that
    request's path, from admission to its end on the node that served it."""
    port = free_port()
    (tmp_path / "fleet.toml").write_text(
        fleet_toml({"ollama": port}, {"node-a": {"ollama": sims["node-a"].urls["ollama"]}})
    )
    pipeline = documented(
        """nvpair-proxy --fleet fleet.toml --log-level debug 2>&1 | grep '"workloadId":"3"'"""
    )
    with child(["bash", "-c", pipeline], tmp_path, environ(tmp_path)) as grep:
        eventually(ollama_lists_llama3(port), "the facade lists llama3")
        for _ in range(3):
            assert answered_by(port) == (200, "node-a")
    records = _frames(grep.out)
    assert records and {r["workloadId"] for r in records} == {"3"}
    path = [(r["method"], r.get("scheduledOn")) for r in records]
    assert path[0] == ("workload:submitted", None)
    assert ("workload:submitted", "node-a") in path and ("workload:started", "node-a") in path
    assert path[-1] == ("workload:completed", "node-a")


def test_a_wrong_port_is_one_warning_naming_the_url(tmp_path: Path, sims: dict[str, Sim]) -> None:
    """A node at a closed port: its first failed poll is the one warning, naming its URL; the
    polls after it (every 100 ms here) are not logged again."""
    port, typo = free_port(), f"http://127.0.0.1:{free_port()}"
    nodes = {"node-a": {"ollama": sims["node-a"].urls["ollama"]}, "typo": {"ollama": typo}}
    (tmp_path / "fleet.toml").write_text(fleet_toml({"ollama": port}, nodes, "100ms"))
    pipeline = documented("""nvpair-proxy --fleet fleet.toml 2>&1 | grep '"level":"warn"'""")
    with child(["bash", "-c", pipeline], tmp_path, environ(tmp_path)) as grep:
        eventually(ollama_lists_llama3(port), "the facade lists llama3")
        time.sleep(0.5)
    (warning,) = _frames(grep.out)
    assert (warning["level"], warning["node"], warning["url"]) == ("warn", "typo", typo)
    assert warning["msg"].startswith(f"typo's ollama at {typo} does not answer its poll: ")


def test_kill_hup_rereads_the_fleet_file(fleet: Fleet) -> None:
    """SIGHUP re-reads the file: logged, and a facade's port change logged as needing a
    restart, not applied."""
    path = fleet.where / "fleet.toml"
    original = path.read_text()
    port = fleet.ports[FACADES["ollama"]]
    mark = len(fleet.proxy.err.read_text())
    assert f"port = {port}\n" in original
    path.write_text(original.replace(f"port = {port}\n", f"port = {port + 1}\n"))
    try:
        result = fleet.run(documented("kill -HUP PID"), PID=str(fleet.proxy.process.pid))
        assert result.returncode == 0, result.stderr
        text_of(fleet.proxy.err, "fleet file reloaded: fleet.toml", after=mark)
        text_of(fleet.proxy.err, f"facades.ollama.port {port} -> {port + 1} needs", after=mark)
        assert answered_by(port)[0] == 200
    finally:
        path.write_text(original)


# -- docs/lan.md ----------------------------------------------------------------------------------

LAN_PAGE = ROOT / "docs" / "lan.md"


def _sim(where: Path, serves: list[tuple[str, str]]) -> Iterator[Sim]:
    argv = [sys.executable, "-m", "nvpair.sim"]
    for engine, model in serves:
        argv += ["--serve", engine, "0", "node-a", model]
    with child(argv, where, environ(where)) as started:
        eventually(
            lambda: len(_LISTENING.findall(started.err.read_text())) == len(serves),
            "node-a listening",
        )
        yield Sim(started, dict(_LISTENING.findall(started.err.read_text())))


def test_serving_a_lan(tmp_path: Path) -> None:
    """docs/lan.md from key to answer: a key made and filed, a CA and a certificate made with
    openssl, the proxy serving them, and from another machine (a network namespace) curl and
    the page's two Python scripts over TLS with that key."""
    from tests.documented_commands import code_blocks
    from tests.integration.netns import lan_namespace

    if shutil.which("openssl") is None or shutil.which("curl") is None:
        pytest.skip("docs/lan.md's commands need openssl and curl (Debian's packages)")
    env = environ(tmp_path / "state")

    def run(command: str, where: str = "") -> str:
        done = shell(command.replace("192.168.1.10", where) if where else command, tmp_path, env)
        assert done.returncode == 0, (command, done.stderr)
        return done.stdout

    run(documented("nvpair-proxy --new-key laptop > laptop.txt"))
    run(documented("tail -n +2 laptop.txt >> keys.toml"))
    secret = run(documented("head -n 1 laptop.txt")).strip()
    assert secret.startswith("nvp_") and "[[keys]]" in (tmp_path / "keys.toml").read_text()
    with (
        contextlib.ExitStack() as stack,
        lan_namespace(["gpu-host.lan"]) as lan,
    ):
        run(
            documented(
                "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 "
                '-subj "/CN=nvpair LAN CA" -keyout ca.key -out ca.crt'
            )
        )
        run(
            documented(
                "openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                '-subj "/CN=gpu-host.lan" -keyout lan.key -out lan.csr'
            )
        )
        run(
            documented(
                "printf 'subjectAltName = DNS:gpu-host.lan, IP:192.168.1.10\\nextendedKeyUsage = "
                "serverAuth\\n' > lan.ext"
            ),
            lan.host_ip,
        )
        run(
            documented(
                "openssl x509 -req -in lan.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 "
                "-extfile lan.ext -out lan.crt"
            )
        )
        sim = stack.enter_context(
            contextlib.contextmanager(_sim)(
                tmp_path, [("ollama", "llama3:latest"), ("llamacpp", "qwen2.5-7b-q4")]
            )
        )
        ports = {8080: free_port(), 11435: free_port()}
        (tmp_path / "fleet.toml").write_text(
            fleet_toml({"ollama": ports[11435], "llamacpp": ports[8080]}, {"node-a": sim.urls})
            + f'[access]\nnetworks = ["{lan.network}"]\nkeys = "keys.toml"\n'
            'tls-cert = "lan.crt"\ntls-key = "lan.key"\n'
        )
        stack.enter_context(child(shlex.split("nvpair-proxy --fleet fleet.toml"), tmp_path, env))
        eventually(ollama_lists_llama3(ports[11435]), "the Ollama facade lists llama3")
        eventually(
            lists(ports[8080], "/v1/models", "data", "id", "qwen2.5-7b-q4"), "llama.cpp's model"
        )

        def at_free_ports(text: str) -> str:
            for documented_port, port in ports.items():
                text = text.replace(f"gpu-host.lan:{documented_port}", f"gpu-host.lan:{port}")
            return text

        def on_the_lan(command: str) -> str:
            command = at_free_ports(command)
            done = subprocess.run(
                lan.command("bash", "-c", command),
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env={**env, "NVPAIR_KEY": secret},
                timeout=WAIT,
                check=False,
            )
            assert done.returncode == 0, (command, done.stderr)
            return done.stdout

        tags = on_the_lan(
            documented(
                'curl --cacert ca.crt -H "Authorization: Bearer $NVPAIR_KEY" '
                "https://gpu-host.lan:11435/api/tags"
            )
        )
        assert [m["name"] for m in json.loads(tags)["models"]] == ["llama3:latest"]
        page = LAN_PAGE.read_text()
        (openai_script,) = [b for b in code_blocks(page, "python") if "from openai" in b]
        (ollama_script,) = [b for b in code_blocks(page, "python") if "import ollama" in b]
        (tmp_path / "chat.py").write_text(at_free_ports(openai_script))
        (tmp_path / "ollama_chat.py").write_text(at_free_ports(ollama_script))
        said = "Hello from node-a.\n"  # the simulated engine's answer
        assert on_the_lan(documented("SSL_CERT_FILE=ca.crt python3 chat.py")) == said
        assert on_the_lan(documented("SSL_CERT_FILE=ca.crt python3 ollama_chat.py")) == said
