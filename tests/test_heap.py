"""The collector's settings for a long-running process (nvpair/common/heap.py).

Each check runs in a fresh interpreter: freezing and thresholds are process-wide, and the test
process's own collector must stay as pytest set it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settle_freezes_the_startup_and_collects_the_young_less_often() -> None:
    out = _run(
        """
        import gc
        from nvpair.common import heap
        before = gc.get_threshold()
        heap.settle()
        after = gc.get_threshold()
        assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
        assert after == (heap.YOUNG, before[1], before[2]), (before, after)
        # A frozen object is in no generation a collection traverses.
        assert len(gc.get_objects()) < gc.get_freeze_count() / 10
        print("ok")
        """
    )
    assert out == "ok"


def test_a_cycle_made_after_settling_is_still_collected_without_being_asked() -> None:
    out = _run(
        """
        import gc, weakref
        from nvpair.common import heap
        heap.settle()

        class Node:
            pass

        cycle = Node()
        cycle.me = cycle
        gone = []
        ref = weakref.ref(cycle, lambda _: gone.append(True))
        del cycle
        kept = []
        # Net allocations of containers: past the threshold, a collection runs by itself.
        for _ in range(heap.YOUNG * 2):
            kept.append([])
            if gone:
                break
        assert gone, "the cycle outlived twice the young threshold"
        print("ok")
        """
    )
    assert out == "ok"


def test_the_process_settles_once_the_reactor_runs(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[facades.llamacpp]\nport = 0\n[[nodes]]\nid = "n0"\n'
        '[nodes.engines]\nllamacpp = "http://127.0.0.1:9"\n'
    )
    out = _run(
        f"""
        from twisted.internet import reactor
        calls = []
        reactor.callWhenRunning = lambda f, *a, **k: calls.append(f)
        from nvpair.common import heap
        from nvpair import tap
        options = tap.Options()
        options.parseOptions(["--fleet", {str(fleet)!r}, "--state-dir", {str(tmp_path)!r}])
        options.returns_status = True
        tap.makeService(options)
        assert heap.settle in calls, calls
        print("ok")
        """,
        cwd=tmp_path,
    )
    assert out == "ok"
