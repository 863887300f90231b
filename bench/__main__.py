"""``make bench``: nvpair-proxy side by side with nginx and LiteLLM, against simulated engines.

Every contender fronts the same simulated llama.cpp nodes (separate processes) on loopback:

- **direct** — the simulated engine itself, the floor;
- **nvpair** — ``twistd -n nvpair-proxy`` in standalone fleet mode;
- **nginx** — ``proxy_pass`` to an upstream block with ``proxy_next_upstream`` on 503;
- **litellm** — LiteLLM's proxy (router) with both nodes as deployments of one model.

Scenarios: sequential latency of a non-streaming request (p50/p99 over N), throughput at a
fixed concurrency (``wrk``), CPU per streamed chunk (the proxy process's own CPU time over one
long SSE stream), and failover (first node answering 503). A contender that is not installed is
reported as skipped, never silently dropped. Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TWISTD = str(Path(PYTHON).parent / "twistd")
LITELLM = ROOT / ".venv-bench" / "bin" / "litellm"
BODY = json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
).encode()
STREAM_BODY = json.dumps(
    {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
).encode()
PATH = "/v1/chat/completions"
#: LiteLLM refuses to start without a master key; every contender gets the same header.
KEY = "sk-nvpair-bench-0123456789abcdef"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port} after {seconds}s")


@contextmanager
def process(argv: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    child: subprocess.Popen[bytes] = subprocess.Popen(argv, start_new_session=True, **kwargs)
    try:
        yield child
    finally:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- simulated nodes ----------------------------------------------------------------------------

SIM = textwrap.dedent(
    """
    import sys
    from twisted.internet import reactor
    from nvpair.sim import SimEngine
    port, node, status, tokens = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    engine = SimEngine(reactor, "llamacpp", models=["tiny"], node=node,
                       tokens=["tok"] * tokens)
    if status != "ok":
        engine.faults.status = int(status)
    engine.listen(port)
    reactor.run()
    """
)


@contextmanager
def sim(status: str = "ok", tokens: int = 4) -> Iterator[int]:
    port = free_port()
    with process(
        [PYTHON, "-c", SIM, str(port), f"node-{port}", status, str(tokens)],
        stderr=subprocess.DEVNULL,
    ):
        wait_for(port)
        yield port


# -- contenders --------------------------------------------------------------------------------


@contextmanager
def nvpair(nodes: list[int], work: Path) -> Iterator[tuple[int, int]]:
    port = free_port()
    fleet = work / "fleet.toml"
    fleet.write_text(
        f'inventory-interval = "30s"\n[facades.llamacpp]\nport = {port}\n'
        + "".join(
            f'[[nodes]]\nid = "n{i}"\n[nodes.engines]\nllamacpp = "http://127.0.0.1:{p}"\n'
            for i, p in enumerate(nodes)
        )
    )
    argv = [
        TWISTD,
        "--pidfile=",
        "-n",
        "nvpair-proxy",
        "--fleet",
        str(fleet),
        "--state-dir",
        str(work / "state"),
        "--log-level",
        "warn",
        "--retry-backoff",
        "50ms",
    ]
    with process(argv, cwd=work, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        time.sleep(1.0)  # the first inventory poll
        yield port, child.pid


@contextmanager
def nginx(nodes: list[int], work: Path) -> Iterator[tuple[int, int]]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        raise Skip("nginx is not installed (Debian package nginx)")
    port = free_port()
    servers = "".join(f"server 127.0.0.1:{p};" for p in nodes)
    conf = work / "nginx.conf"
    conf.write_text(
        textwrap.dedent(f"""
        worker_processes 1; daemon off; master_process off;
        error_log stderr error; pid {work}/nginx.pid;
        events {{ worker_connections 1024; }}
        http {{
          access_log off;
          client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;
          fastcgi_temp_path {work}/fcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
          upstream engines {{ {servers} keepalive 64; }}
          server {{
            listen 127.0.0.1:{port};
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
    with process([binary, "-p", str(work), "-c", str(conf)], stderr=subprocess.DEVNULL) as child:
        wait_for(port)
        yield port, child.pid


@contextmanager
def litellm(nodes: list[int], work: Path) -> Iterator[tuple[int, int]]:
    if not LITELLM.exists():
        raise Skip("LiteLLM is not installed (make bench installs it into .venv-bench)")
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        + "".join(
            f"  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
            f"      api_base: http://127.0.0.1:{p}/v1\n      api_key: none\n"
            for p in nodes
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
    argv = [
        str(LITELLM),
        "--config",
        str(config),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--num_workers",
        "1",
    ]
    with process(
        argv, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as child:
        wait_for(port, 120)
        time.sleep(2.0)
        yield port, child.pid


class Skip(Exception):
    """A contender that cannot run here: reported, not dropped."""


# -- scenarios ---------------------------------------------------------------------------------


def latency(port: int, count: int, body: bytes = BODY) -> list[float]:
    connection = HTTPConnection("127.0.0.1", port, timeout=30)
    headers = HEADERS
    samples = []
    for index in range(count + 50):
        started = time.perf_counter()
        connection.request("POST", PATH, body, headers)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        if index >= 50:  # warm-up excluded
            samples.append((time.perf_counter() - started) * 1000)
    connection.close()
    return samples


def ttfb(port: int, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        connection = HTTPConnection("127.0.0.1", port, timeout=30)
        started = time.perf_counter()
        connection.request("POST", PATH, STREAM_BODY, HEADERS)
        response = connection.getresponse()
        response.read(1)
        samples.append((time.perf_counter() - started) * 1000)
        response.read()
        connection.close()
    return samples


def throughput(port: int, seconds: int, connections: int, work: Path) -> float | None:
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
        f"wrk.body = {json.dumps(BODY.decode())}\n"
    )
    out = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{PATH}",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    return None


def stream_cpu(port: int, pid: int, chunks: int) -> float:
    """Proxy CPU microseconds per streamed chunk over one long stream."""
    connection = HTTPConnection("127.0.0.1", port, timeout=120)
    before = cpu_seconds(pid)
    connection.request("POST", PATH, STREAM_BODY, HEADERS)
    data = connection.getresponse().read()
    used = cpu_seconds(pid) - before
    if data.count(b"data:") < chunks:
        raise RuntimeError("stream cut short")
    return used / chunks * 1e6


Contender = Callable[[list[int], Path], AbstractContextManager[tuple[int, int]]]
CONTENDERS: dict[str, Contender] = {"nvpair": nvpair, "nginx": nginx, "litellm": litellm}


def run(args: argparse.Namespace) -> None:
    rows: dict[str, dict[str, str]] = {}

    def record(name: str, key: str, value: str) -> None:
        rows.setdefault(name, {})[key] = value

    with tempfile.TemporaryDirectory(prefix="nvpair-bench-") as tmp:
        work = Path(tmp)
        with sim() as a, sim() as b:
            direct = latency(a, args.requests)
            record("direct", "latency", fmt_pct(direct))
            record("direct", "rps", fmt_rps(throughput(a, args.seconds, args.connections, work)))
            for name, contender in CONTENDERS.items():
                sub = work / name
                sub.mkdir()
                try:
                    with contender([a, b], sub) as (port, _):
                        samples = latency(port, args.requests)
                        record(name, "latency", fmt_pct(samples))
                        record(name, "added", fmt_added(samples, direct))
                        rps = throughput(port, args.seconds, args.connections, sub)
                        record(name, "rps", fmt_rps(rps))
                except Skip as why:
                    record(name, "latency", f"skipped: {why}")
                except (RuntimeError, OSError) as error:
                    record(name, "latency", f"failed: {error}")
        with sim(tokens=args.chunks) as long_stream:
            for name, contender in CONTENDERS.items():
                sub = work / f"{name}-stream"
                sub.mkdir()
                try:
                    with contender([long_stream], sub) as (port, pid):
                        record(name, "cpu/chunk", f"{stream_cpu(port, pid, args.chunks):.1f} µs")
                except (Skip, RuntimeError, OSError) as why:
                    record(name, "cpu/chunk", f"n/a ({why})")
        with sim(status="503") as busy, sim() as healthy:
            for name, contender in CONTENDERS.items():
                sub = work / f"{name}-failover"
                sub.mkdir()
                try:
                    with contender([busy, healthy], sub) as (port, _):
                        record(name, "failover ttfb", fmt_pct(ttfb(port, args.failovers)))
                except (Skip, RuntimeError, OSError) as why:
                    record(name, "failover ttfb", f"n/a ({why})")
    print_table(rows, args)


def fmt_pct(samples: list[float]) -> str:
    return f"p50 {percentile(samples, 50):.2f} ms  p99 {percentile(samples, 99):.2f} ms"


def fmt_added(samples: list[float], direct: list[float]) -> str:
    return (
        f"+{percentile(samples, 50) - percentile(direct, 50):.2f} / "
        f"+{percentile(samples, 99) - percentile(direct, 99):.2f} ms"
    )


def fmt_rps(value: float | None) -> str:
    return "wrk not installed" if value is None else f"{value:,.0f} req/s"


def print_table(rows: dict[str, dict[str, str]], args: argparse.Namespace) -> None:
    columns = ["latency", "added", "rps", "cpu/chunk", "failover ttfb"]
    print(
        f"\nnon-streaming {PATH}, {args.requests} sequential requests; wrk -c{args.connections} "
        f"for {args.seconds}s; one {args.chunks}-chunk stream; {args.failovers} failovers\n"
    )
    for name, values in rows.items():
        print(f"{name}")
        for column in columns:
            if column in values:
                print(f"  {column:14} {values[column]}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--failovers", type=int, default=200)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
