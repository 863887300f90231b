"""The simulated nodes and the proxies put in front of them, each a process of its own.

- **direct** — the simulated engine itself: what a client gets with no proxy at all;
- **nvpair** — ``twistd -n nvpair-proxy`` in standalone fleet mode;
- **nvpair+metrics** — the same with an admin listener, so every request is counted for
  ``/metrics`` (what counting costs);
- **floor** — :mod:`bench.floor`, the minimal Twisted proxy (the floor of our own stack);
- **nginx** — ``proxy_pass`` to an upstream block with ``proxy_next_upstream``;
- **litellm** — LiteLLM's proxy (router) with the nodes as deployments of one model.

Each contender is a context manager over a :class:`Setup` yielding a :class:`Running`. With
``Setup.ordered`` every proxy tries the first node first and the others only when it fails, and
never benches it, so a failover run meets its fault on every request.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from http.client import HTTPConnection
from pathlib import Path

import attrs

from bench.procs import PYTHON, ROOT, TWISTD, free_port, process, wait_for

LITELLM = ROOT / ".venv-bench" / "bin" / "litellm"
PATH = "/v1/chat/completions"
#: LiteLLM refuses to start without a master key; every contender gets the same header.
KEY = "sk-nvpair-bench-0123456789abcdef"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "hello there"}]
BODY = json.dumps({"model": "tiny", "messages": MESSAGES}).encode()
#: Streamed with the usage chunk, so nvpair's token statistics run on every stream.
STREAM_BODY = json.dumps(
    {
        "model": "tiny",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": MESSAGES,
    }
).encode()
#: A streamed answer is the role chunk, one chunk per token, the finish and usage chunks, [DONE].
FRAMING_EVENTS = 4


class Skip(Exception):
    """A contender that cannot run here: reported, not dropped."""


@attrs.frozen
class Node:
    """A simulated node: its engine port, its control port, its process."""

    port: int
    control: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def counts(self) -> tuple[int, int]:
        """(inference POSTs, other requests) the engine has received so far."""
        data = self._control()
        return int(data["count"]), int(data["other"])

    def abandoned(self) -> int:
        """Answers whose client went away before they were complete."""
        return int(self._control()["abandoned"])

    def loads(self) -> int:
        """Model loads (cold starts) the engine has started so far."""
        return int(self._control()["loads"])

    def evictions(self) -> int:
        """Models the engine unloaded to make room for another so far."""
        return int(self._control().get("evictions", 0))

    def places(self) -> tuple[int, int]:
        """(answers holding one of the engine's places, answers waiting for one) now."""
        data = self._control()
        return int(data.get("running", 0)), int(data.get("waiting", 0))

    def _control(self) -> dict[str, int]:
        connection = HTTPConnection("127.0.0.1", self.control, timeout=10)
        try:
            connection.request("GET", "/count")
            data = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        return {str(k): int(v) for k, v in data.items()}


@attrs.frozen
class Cold:
    """Cold-start knobs of a simulated Ollama node (:mod:`bench.simnode`): it starts with no
    model in memory, a load takes ``load_delay`` seconds, a model idle for ``keep_alive``
    seconds is unloaded, at most ``max_loaded`` models are in memory at once (None: any number;
    one more evicts one first), and a non-streamed answer takes as long as its tokens would
    stream."""

    models: tuple[str, ...]
    load_delay: float
    keep_alive: float
    max_loaded: int | None = None


@contextmanager
def node(
    tokens: int = 4,
    interval: float = 0.0,
    fault: str = "none",
    cold: Cold | None = None,
    parallel: int | None = None,
) -> Iterator[Node]:
    """A simulated node (:mod:`bench.simnode`) answering ``tokens`` tokens: llama.cpp serving
    ``tiny``, or with ``cold`` an Ollama node serving its models; ``parallel`` places per model
    (None: the engine's default), past which it queues as its engine does."""
    port, control = free_port(), free_port()
    argv = [PYTHON, "-m", "bench.simnode", str(port), str(control), f"--node=node-{port}"]
    argv += [f"--tokens={tokens}", f"--interval={interval}", f"--fault={fault}"]
    if cold is not None:
        argv += ["--dialect=ollama", f"--models={','.join(cold.models)}", "--cold", "--paced"]
        argv += [f"--load-delay={cold.load_delay}", f"--keep-alive={cold.keep_alive}"]
        if cold.max_loaded is not None:
            argv.append(f"--max-loaded={cold.max_loaded}")
    if parallel is not None:
        argv.append(f"--parallel={parallel}")
    with process(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        wait_for(control)
        yield Node(port, control, child.pid)


@attrs.frozen
class Setup:
    """What a contender fronts and how.

    :param nodes: the simulated nodes, in order.
    :param ordered: try ``nodes[0]`` first on every request, the rest only after it failed.
    :param first_byte_timeout: seconds a proxy that can waits for the first body byte before
        failing over (nvpair's ``--response-header-timeout``); None: its default.
    """

    nodes: tuple[Node, ...]
    ordered: bool = False
    first_byte_timeout: float | None = None


@attrs.frozen
class Running:
    """A contender serving: where, its process (for CPU and RSS), whether it polls inventories."""

    port: int
    pid: int
    polls: bool = False


Contender = Callable[[Setup, Path], AbstractContextManager[Running]]


@contextmanager
def direct(setup: Setup, work: Path) -> Iterator[Running]:
    """No proxy: the first node itself."""
    yield Running(setup.nodes[0].port, setup.nodes[0].pid)


def nvpair_argv(setup: Setup, work: Path, port: int, metrics: bool = False) -> list[str]:
    """The command line of nvpair in fleet mode in front of ``setup``'s nodes on ``port``;
    with ``metrics``, an admin listener too, so the request path counts for ``/metrics``."""
    fleet = work / "fleet.toml"
    # Polled once at start: a node the failover run takes down later must stay in discovery.
    fleet.write_text(
        f'inventory-interval = "1h"\n[facades.llamacpp]\nport = {port}\n'
        + "".join(
            f'[[nodes]]\nid = "n{i}"\n[nodes.engines]\nllamacpp = "{n.url}"\n'
            for i, n in enumerate(setup.nodes)
        )
    )
    argv = [TWISTD, "--pidfile=", "-n", "nvpair-proxy", "--fleet", str(fleet)]
    argv += ["--state-dir", str(work / "state"), "--log-level", "warn", "--retry-backoff", "50ms"]
    if setup.first_byte_timeout is not None:
        argv += ["--response-header-timeout", f"{round(setup.first_byte_timeout * 1000)}ms"]
    if setup.ordered:
        # Never benched, as the other proxies are told: passive health would otherwise hold
        # the faulty node back after three failures and no request would meet the fault.
        argv += ["--cooldown", "0"]
    if metrics:
        argv += ["--admin-port", str(free_port())]
    return argv


def floor_argv(setup: Setup, port: int) -> list[str]:
    argv = [PYTHON, "-m", "bench.floor", str(port), *(n.url for n in setup.nodes)]
    if setup.ordered:
        argv.append("--ordered")
    return argv


@contextmanager
def nvpair(setup: Setup, work: Path, metrics: bool = False) -> Iterator[Running]:
    port = free_port()
    argv = nvpair_argv(setup, work, port, metrics)
    with process(argv, cwd=work, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        yield Running(port, child.pid, polls=True)


@contextmanager
def nvpair_metrics(setup: Setup, work: Path) -> Iterator[Running]:
    """nvpair with an admin listener: the same requests, counted for ``/metrics``."""
    with nvpair(setup, work, metrics=True) as running:
        yield running


@contextmanager
def floor(setup: Setup, work: Path) -> Iterator[Running]:
    port = free_port()
    argv = floor_argv(setup, port)
    with process(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        yield Running(port, child.pid)


def nginx_binary() -> str | None:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    return binary if Path(binary).exists() else None


@contextmanager
def nginx(setup: Setup, work: Path) -> Iterator[Running]:
    binary = nginx_binary()
    if binary is None:
        raise Skip("nginx is not installed (Debian package nginx)")
    port = free_port()
    first, *rest = setup.nodes
    if setup.ordered:
        # max_fails=0: never benched, so every request meets the first node's fault.
        servers = f"server {first.url[7:]} max_fails=0;" + "".join(
            f"server {n.url[7:]} backup;" for n in rest
        )
    else:
        servers = "".join(f"server {n.url[7:]};" for n in setup.nodes)
    conf = work / "nginx.conf"
    conf.write_text(
        textwrap.dedent(f"""
        worker_processes 1; daemon off; master_process off; worker_rlimit_nofile 20000;
        error_log stderr error; pid {work}/nginx.pid;
        events {{ worker_connections 10000; }}
        http {{
          access_log off;
          client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;
          fastcgi_temp_path {work}/fcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
          upstream engines {{ {servers} keepalive 64; }}
          server {{
            listen 127.0.0.1:{port} backlog=4096;
            location / {{
              proxy_pass http://engines;
              proxy_http_version 1.1;
              proxy_set_header Connection "";
              proxy_buffering off;
              proxy_next_upstream error timeout http_503 non_idempotent;
            }}
          }}
        }}
    """)
    )
    argv = [binary, "-p", str(work), "-c", str(conf)]
    with process(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        yield Running(port, child.pid)


@contextmanager
def litellm(setup: Setup, work: Path) -> Iterator[Running]:
    if not LITELLM.exists():
        raise Skip("LiteLLM is not installed (make bench installs it into .venv-bench)")
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        + "".join(
            f"  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
            f"      api_base: {n.url}/v1\n      api_key: none\n"
            for n in setup.nodes
        )
        + "router_settings:\n  num_retries: 2\n  routing_strategy: simple-shuffle\n"
        + "litellm_settings:\n  telemetry: false\n"
    )
    env = {
        **os.environ,
        # Loopback only: no model-cost-map download, no telemetry.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "LITELLM_MASTER_KEY": KEY,
        "NO_PROXY": "*",
    }
    argv = [str(LITELLM), "--config", str(config), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--num_workers", "1"]
    with process(
        argv,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as child:
        wait_for(port, 180)
        yield Running(port, child.pid)


CONTENDERS: dict[str, Contender] = {
    "direct": direct,
    "nvpair": nvpair,
    "nvpair+metrics": nvpair_metrics,
    "floor": floor,
    "nginx": nginx,
    "litellm": litellm,
}


def ready(port: int, seconds: float = 60) -> None:
    """Until a non-streaming request through ``port`` is answered 200 (first poll done)."""
    deadline = time.monotonic() + seconds
    last = "no answer"
    while time.monotonic() < deadline:
        connection = HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("POST", PATH, BODY, HEADERS)
            response = connection.getresponse()
            response.read()
            if response.status == 200:
                return
            last = f"status {response.status}"
        except OSError as error:
            last = repr(error)
        finally:
            connection.close()
        time.sleep(0.1)
    raise RuntimeError(f"port {port} not serving after {seconds}s ({last})")
