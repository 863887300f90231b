"""Real ``llama-server`` processes for the multi-turn bench, and the model they serve.

- **The binary** is the one ``make test`` builds (``tests/real/llama_build.py``, cached per
  machine; ``make llama-server`` waits for or makes it), or ``NVPAIR_LLAMA_SERVER``.
- **The model** is a random-weight llama GGUF written by ``tests/real/tiny_gguf.py`` at
  :data:`SHAPE`, large enough that reading a 2,000-token conversation takes a single thread
  of this machine's CPU about a second (the bench measures it and prints it). It is written once
  into the same cache as the build and reused; an interrupted write never leaves a file there.
- **A node** is one server: one thread (``-t 1 -tb 1``), ``-np`` slots each with room for a
  whole conversation, ``--metrics`` so that its own prompt-token counters can be read, and
  optionally ``--cache-ram`` (the RAM prompt cache, 8 GiB by default; 0 turns it off).

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

from bench.procs import free_port, process
from tests.real.llama_build import cache_root, installed_binary
from tests.real.tiny_gguf import Shape, write_gguf

#: Names the ``llama-server`` to run instead of the cached build (as tests/real does).
OVERRIDE = "NVPAIR_LLAMA_SERVER"
#: 6.3 M parameters (25 MB of F32). Measured on this machine's CPU with one thread, shared with
#: other work: 1.4-1.6 s to read 2,000 prompt tokens, 0.14-0.19 s for 32 generated ones. Four
#: layers instead of six read them in 0.54-2.0 s: too close to the 0.5 s the bench needs at least.
SHAPE = Shape(embed=256, ffn=1024, blocks=6, heads=4, context=4096)
#: Tokens of context per slot: a six-turn conversation of 300-token messages and 32-token
#: answers, with the chat template's markers, is under 2,400; an answer re-read as text can
#: be longer than its tokens (random bytes), hence the room.
SLOT_CONTEXT = 3072
#: The alias every node serves its model under.
MODEL = "mt"
READY_WITHIN = 120.0


def binary(environ: Mapping[str, str] = os.environ) -> Path:
    """The ``llama-server`` to run; RuntimeError, saying how to build it, when there is none."""
    override = environ.get(OVERRIDE)
    found = Path(override) if override else installed_binary(environ)
    if not found.exists():
        raise RuntimeError(f"no llama-server at {found}: `make llama-server` builds it")
    return found


def model_path(shape: Shape = SHAPE, environ: Mapping[str, str] = os.environ) -> Path:
    """The cached GGUF at ``shape``, written first when it is not there yet."""
    root = cache_root(environ)
    name = f"bench-llama-{shape.embed}x{shape.ffn}x{shape.blocks}x{shape.heads}-{shape.context}"
    target = root / f"{name}.gguf"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():  # another bench wrote it while this one waited
            handle, staging = tempfile.mkstemp(prefix=f".{name}.", suffix=".gguf", dir=root)
            os.close(handle)
            try:
                write_gguf(Path(staging), shape)
                # rename: the cached model appears whole or not at all.
                os.rename(staging, target)
            finally:
                Path(staging).unlink(missing_ok=True)
    return target


@attrs.frozen
class LlamaNode:
    """A running server: the node id the fleet file gives it, where it listens, its process."""

    name: str
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def llama_node(
    name: str,
    model: Path,
    slots: int = 2,
    cache_ram_mib: int | None = None,
    extra: Sequence[str] = (),
    slot_context: int = SLOT_CONTEXT,
) -> Iterator[LlamaNode]:
    """A fresh ``llama-server`` for ``model``, yielded once ``/health`` answers 200; ``extra``
    arguments go last."""
    port = free_port()
    argv = [str(binary()), "-m", str(model), "--alias", MODEL, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "-c", str(slot_context * slots), "-np", str(slots)]
    argv += ["-t", "1", "-tb", "1", "--seed", "7", "--metrics", "--no-warmup"]
    if cache_ram_mib is not None:
        argv += ["--cache-ram", str(cache_ram_mib)]
    argv += extra
    with process(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as child:
        node = LlamaNode(name, port, child.pid)
        deadline = time.monotonic() + READY_WITHIN
        while not _healthy(node.url):
            if child.poll() is not None:
                raise RuntimeError(f"llama-server {name} exited with {child.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server {name} not healthy after {READY_WITHIN:g} s")
            time.sleep(0.1)
        yield node


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def post_json(url: str, body: Mapping[str, object], timeout: float = 300) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        data = json.loads(answer.read())
    if not isinstance(data, dict):
        raise RuntimeError(f"{url}: not a JSON object")
    return data


def token_count(url: str, text: str) -> int:
    """How many tokens the server's tokenizer makes of ``text`` (no BOS)."""
    tokens = post_json(url + "/tokenize", {"content": text}).get("tokens")
    if not isinstance(tokens, list):
        raise RuntimeError(f"{url}/tokenize: no token list")
    return len(tokens)


def read_time_ms(url: str, text: str) -> tuple[int, float]:
    """The prompt tokens of ``text`` and the milliseconds the server took to read them, its
    cache bypassed (``cache_prompt`` false), as its own ``timings`` say."""
    answer = post_json(url + "/completion", {"prompt": text, "n_predict": 1, "cache_prompt": False})
    timings = answer.get("timings")
    if not isinstance(timings, dict):
        raise RuntimeError(f"{url}/completion: no timings")
    return int(timings["prompt_n"]), float(timings["prompt_ms"])


def prompt_counters(url: str) -> tuple[int, int]:
    """The server's own counters since it started (``/metrics``): prompt tokens evaluated and
    prompt tokens reused from its cache."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"):
            values[name] = round(float(value))
    return (
        values.get("llamacpp:prompt_tokens_total", 0),
        values.get("llamacpp:prompt_tokens_cached_total", 0),
    )
