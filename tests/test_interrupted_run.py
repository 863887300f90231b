"""SIGTERM or Ctrl-C to a test run ends it (tests/conftest.py says how).

A pytest process runs two tests: the first starts a child process through the reactor and waits
on the reactor; it is signalled while it waits. The run must end within seconds, report the
interrupt, start no further test, and leave its child no longer running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WAITING_TEST = """
import os, sys
from pathlib import Path

import pytest_twisted
from twisted.internet import defer, protocol, reactor, task

MARK = Path(os.environ["MARK"])


@pytest_twisted.ensureDeferred
async def test_waits_on_the_reactor():
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    child = reactor.spawnProcess(protocol.ProcessProtocol(), sys.executable, sleeper, env=None)
    MARK.write_text(str(child.pid))
    await task.deferLater(reactor, 120, lambda: None)


def test_after():
    Path(os.environ["MARK"] + ".after").write_text("ran")
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_run_and_its_children(tmp_path: Path, signum: signal.Signals) -> None:
    (tmp_path / "test_waiting.py").write_text(WAITING_TEST)
    mark = tmp_path / "child.pid"
    env = {**os.environ, "MARK": str(mark), "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() or not mark.read_text():
            assert run.poll() is None, run.communicate()[0].decode()
            assert time.monotonic() < deadline, "the first test never started its child"
            time.sleep(0.1)
        child = int(mark.read_text())
        run.send_signal(signum)
        output, _ = run.communicate(timeout=15)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = output.decode()
    assert run.returncode == 2, text
    assert "KeyboardInterrupt" in text, text
    assert "test_after" not in text, text
    assert not (tmp_path / "child.pid.after").exists()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the test's child process outlived the run"


def test_make_test_passes_sigterm_to_pytest(tmp_path: Path) -> None:
    """make sends its child the SIGTERM it gets: that child must be pytest, not a shell that dies
    of it and leaves pytest running. A stand-in pytest records its pid and waits."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mark = tmp_path / "pytest.pid"
    stand_in = bin_dir / "pytest"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os, time\n"
        f"open({str(mark)!r}, 'w').write(str(os.getpid()) + ' ' + os.environ.get("
        "'NVPAIR_REQUIRE_LLAMA_SERVER', ''))\n"
        "time.sleep(120)\n"
    )
    stand_in.chmod(0o755)
    # The prerequisites (venv, Chromium, Prometheus, llama-server) are taken as made: -o.
    make = subprocess.Popen(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "-o", "chromium",
         "-o", "prometheus", "-o", "llama-server", f"BIN={bin_dir}", "test"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not mark.exists() or " " not in mark.read_text():
            assert make.poll() is None, make.communicate()[0].decode()
            assert time.monotonic() < deadline, "make never started pytest"
            time.sleep(0.1)
        pid, required = mark.read_text().split(" ")
        assert required == "1"
        make.send_signal(signal.SIGTERM)
        make.communicate(timeout=15)
        deadline = time.monotonic() + 5
        while alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(int(pid)), "pytest ran on after make was sent SIGTERM"
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
        if mark.exists() and alive(left := int(mark.read_text().split(" ")[0])):
            os.kill(left, signal.SIGKILL)
