"""``make demo``: simulated engines plus the proxy standalone on ``etc/demo-fleet.toml``.

Starts the simulated nodes the demo fleet names, then ``twistd -n nvpair-proxy --fleet``, waits
until every facade answers, prints ``curl`` lines to try, and runs until interrupted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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

_CHAT = '{{"model":"%s","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'

TRY = (
    """
nvpair-proxy is up, standalone, with three facades in front of simulated nodes.
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

Proxy logs (JSON lines) follow on stderr; state in {state}. Ctrl-C stops everything.
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


def main() -> int:
    python = sys.executable
    state = tempfile.mkdtemp(prefix="nvpair-demo-")
    serve: list[str] = []
    for engine, port, node, models in SIMULATED:
        serve += ["--serve", engine, str(port), node, models]
    children = [subprocess.Popen([python, "-m", "nvpair.sim", *serve])]
    twistd = str(Path(python).parent / "twistd")
    try:
        deadline = time.monotonic() + 15
        if not all(_wait_for(port, deadline) for _, port, _, _ in SIMULATED):
            print("demo: the simulated engines did not start", file=sys.stderr)
            return 1
        children.append(
            subprocess.Popen(
                [
                    twistd,
                    "--pidfile=",
                    "-n",
                    "nvpair-proxy",
                    "--fleet",
                    str(FLEET),
                    "--state-dir",
                    state,
                ],
                stdin=subprocess.DEVNULL,
                cwd=state,
            )
        )
        if not all(_wait_for(port, deadline) for port in FACADES.values()):
            print(
                "demo: the proxy's facades did not come up (ports 11435, 1234, 8080 free?)",
                file=sys.stderr,
            )
            return 1
        # One inventory poll has to land before the facades know who owns what.
        time.sleep(0.5)
        print(TRY.format(state=state), flush=True)
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
