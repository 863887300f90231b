"""``make demo``: simulated engines plus the proxy standalone on ``etc/demo-fleet.toml``.

Starts one simulator process per node the demo fleet names, then ``nvpair-proxy --fleet`` with
the admin listener, checks that every facade answers a real request (its model list and an
inference request, answered by a node), prints what to try — requests, the status page, and
how to make a node fail and watch the proxy route around it — and runs until interrupted.
Whichever way it ends (Ctrl-C, SIGTERM, a child that died), its children are stopped and its
temporary state directory is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "etc" / "demo-fleet.toml"

#: What each simulated node serves: engine, port, node, models (matches etc/demo-fleet.toml).
SIMULATED = [
    ("ollama", 21434, "node-a", "llama3:latest,qwen2:7b"),
    ("ollama", 21435, "node-b", "llama3:latest"),
    ("lmstudio", 21234, "node-a", "qwen2.5-7b-instruct"),
    ("llamacpp", 28080, "node-a", "tiny"),
]

FACADES = {"ollama": 11435, "lmstudio": 1234, "llamacpp": 8080}

#: The admin listener (loopback only): /status shows every node and the last workloads.
ADMIN_PORT = 21500

#: How long the whole start (simulators, proxy, first polls, checks) may take.
START_TIMEOUT = 20.0

_HI = [{"role": "user", "content": "hi"}]


@frozen
class Check:
    """What ``make demo`` asks one facade: its model list, and one inference request."""

    name: str
    models_path: str
    models: Callable[[object], list[str]]
    inference_path: str
    inference: dict[str, object]


def _listed(document: object, list_field: str, key: str) -> list[str]:
    entries = document.get(list_field) if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"not a model list (no {list_field!r} list)")
    return [str(entry.get(key)) for entry in entries]


def _ollama_models(document: object) -> list[str]:
    return _listed(document, "models", "name")


def _openai_models(document: object) -> list[str]:
    return _listed(document, "data", "id")


CHECKS = {
    "ollama": Check(
        "Ollama",
        "/api/tags",
        _ollama_models,
        "/api/generate",
        {"model": "llama3", "prompt": "hi", "stream": False},
    ),
    "lmstudio": Check(
        "LM Studio",
        "/v1/models",
        _openai_models,
        "/v1/chat/completions",
        {"model": "qwen2.5-7b-instruct", "messages": _HI, "stream": False},
    ),
    "llamacpp": Check(
        "llama.cpp",
        "/v1/models",
        _openai_models,
        "/v1/chat/completions",
        {"model": "tiny", "messages": _HI, "stream": False},
    ),
}


class CheckFailed(Exception):
    """A facade did not answer as it should (yet)."""


def check_facade(check: Check, port: int, timeout: float = 5.0) -> str:
    """Ask one facade for its model list and one inference; a line saying what answered.

    :raises CheckFailed: the facade refused, failed, or no node answered the inference.
    """
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(base + check.models_path, timeout=timeout) as response:
            models = check.models(json.loads(response.read()))
        request = urllib.request.Request(
            base + check.inference_path,
            data=json.dumps(check.inference).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status, node = response.status, response.headers.get("X-Nvpair-Node")
    except urllib.error.HTTPError as error:
        reason = error.headers.get("X-Nvpair-Error") or error.reason
        raise CheckFailed(f"{check.name} on {port}: {error.code} {reason}") from None
    except (OSError, ValueError) as error:
        raise CheckFailed(f"{check.name} on {port}: {error}") from None
    if not models:
        raise CheckFailed(f"{check.name} on {port}: the model list is empty")
    if node is None:
        raise CheckFailed(f"{check.name} on {port}: the answer names no node")
    model = check.inference["model"]
    return (
        f"  {check.name:<10} {base:<23} models: {', '.join(models)}\n"
        f"  {'':<10} {'':<23} {model}: {status} from {node} (X-Nvpair-Node)"
    )


def check_every_facade(deadline: float) -> list[str]:
    """Every facade checked, retried until ``deadline`` (the first polls may not have landed)."""
    lines = []
    for engine, port in FACADES.items():
        while True:
            try:
                lines.append(check_facade(CHECKS[engine], port))
                break
            except CheckFailed:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    return lines


_CHAT = '{{"model":"%s","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'

TRY = (
    """
nvpair-proxy is up, standalone, with three facades in front of simulated nodes. Each facade
answered just now:
{checked}

Try (each answer streams through the proxy from a simulated node):

  curl -sN http://127.0.0.1:11435/api/chat -d '"""
    + _CHAT % "llama3"
    + """'
  curl -s http://127.0.0.1:11435/api/tags
  curl -sN http://127.0.0.1:1234/v1/chat/completions -H 'content-type: application/json' \\
       -d '"""
    + _CHAT % "qwen2.5-7b-instruct"
    + """'
  curl -sN http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \\
       -d '"""
    + _CHAT % "tiny"
    + """'

The status page, live, in a browser on this machine (every node's state, the last requests
and the path each took):

  http://127.0.0.1:{admin}/

Routing and failover. llama3 is on node-a and node-b; both healthy, node-a answers. Every
answer relayed from a node names it in the X-Nvpair-Node header:

  curl -si http://127.0.0.1:11435/api/generate \\
       -d '{{"model":"llama3","prompt":"hi","stream":false}}' | grep -i x-nvpair-node

Make a node fail with the simulator's fault knobs (one process per node; the same signal again
undoes it; python -m nvpair.sim --help lists them):

  kill -USR1 {node_a}   node-a answers every inference 503: llama3 fails over to node-b
  kill -USR2 {node_a}   node-a is gone (connections refused): it leaves discovery at its next poll
  kill -USR1 {node_b}   the same for node-b

qwen2.5-7b-instruct and tiny are on node-a only: with node-a failing, their answer is node-a's
own 503 after the retries. Watch it happen in the X-Nvpair-Node header, in the proxy's log
below (a failed attempt, a node held back or leaving discovery), and on the admin listener:

  curl -s http://127.0.0.1:{admin}/status     (every node's state and health, the last workloads)

Proxy logs follow on stderr; state in {state} (removed at the end).
Ctrl-C stops everything.
"""
)


def _wait_for(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def _proxy_command(python: str) -> list[str]:
    """The installed console script, as an operator runs it (or its module, uninstalled)."""
    script = Path(python).parent / "nvpair-proxy"
    return [str(script)] if script.exists() else [python, "-m", "nvpair.cli"]


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


#: The signals that end the demo as Ctrl-C does.
_ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """Every child still running stopped: SIGTERM, then SIGKILL after 5 s."""
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children.values():
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main() -> int:
    python = sys.executable
    # A SIGTERM or a closed terminal ends the demo as Ctrl-C does: children stopped first.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    # One simulator per node, so that a fault knob (a signal) fails one node.
    serves: dict[str, list[str]] = {}
    for engine, port, node, models in SIMULATED:
        serves.setdefault(node, []).extend(["--serve", engine, str(port), node, models])
    # Each child in a process group of its own: a Ctrl-C reaches the demo alone, which then
    # stops every child once (a signal from the terminal as well would be a second stop).
    children: dict[str, subprocess.Popen[bytes]] = {}
    state: str | None = None
    try:
        # Made inside the try, as the children are started: a failed start or a signal
        # meanwhile still stops the ones already running and removes the directory.
        state = tempfile.mkdtemp(prefix="nvpair-demo-")
        for node, serve in serves.items():
            children[f"{node}'s simulator"] = subprocess.Popen(
                [python, "-m", "nvpair.sim", *serve], process_group=0
            )
        deadline = time.monotonic() + START_TIMEOUT
        if not all(_wait_for(port, deadline) for _, port, _, _ in SIMULATED):
            print("demo: the simulated engines did not start", file=sys.stderr)
            return 1
        children["the proxy"] = subprocess.Popen(
            [
                *_proxy_command(python),
                "--fleet",
                str(FLEET),
                "--state-dir",
                state,
                "--admin-port",
                str(ADMIN_PORT),
            ],
            stdin=subprocess.DEVNULL,
            cwd=state,
            process_group=0,
        )
        if not all(_wait_for(port, deadline) for port in FACADES.values()):
            ports = ", ".join(str(port) for port in FACADES.values())
            print(
                f"demo: the proxy's facades did not come up (ports {ports} free?)",
                file=sys.stderr,
            )
            return 1
        try:
            checked = check_every_facade(deadline)
        except CheckFailed as failed:
            print(f"demo: a facade does not answer as it should: {failed}", file=sys.stderr)
            return 1
        banner = TRY.format(
            checked="\n".join(checked),
            node_a=children["node-a's simulator"].pid,
            node_b=children["node-b's simulator"].pid,
            admin=ADMIN_PORT,
            state=state,
        )
        print(banner, flush=True)
        while True:
            for name, child in children.items():
                if child.poll() is not None:
                    print(
                        f"demo: {name} ended (exit status {child.returncode}): stopping",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C must not cut the clean-up short; it is bounded (5 s a child).
        for signum in _ENDING:
            signal.signal(signum, signal.SIG_IGN)
        _stop(children)
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
