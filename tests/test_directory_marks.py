"""``-m "not integration and not real"`` (``make test-fast``) selects no test of tests/integration
or tests/real: their conftest hooks mark every test collected below them (tests/directory_marks.py).

Only those two directories are collected (3 s, not the whole suite's 10 s): the hooks that mark
their tests are theirs, and what is asked is that nothing there stays selected.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT_ONLY = "not integration and not real"
COLLECT = (sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider")


def test_the_unit_selection_leaves_out_every_integration_and_real_test() -> None:
    collected = subprocess.run(
        [*COLLECT, "-m", UNIT_ONLY, "tests/integration", "tests/real"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    selected = [line for line in collected.stdout.splitlines() if "::" in line]
    assert not selected, f"{len(selected)} selected, the first: {selected[:5]}"
    # Nothing selected, nothing failed to collect, and the directories' tests were all there.
    assert collected.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, collected.stdout
    deselected = re.search(r"\((\d+) deselected\)", collected.stdout)
    assert deselected is not None and int(deselected[1]) > 0, collected.stdout
