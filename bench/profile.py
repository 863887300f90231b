"""A py-spy profile of a running proxy, and its summary: where the samples were spent.

``py-spy`` (from PyPI, into ``.venv-bench``) samples the process from outside, so the proxy runs
unmodified. Its collapsed stacks (``--format raw``: ``frame;frame;frame count`` per line) are
kept next to the table; :func:`summarize` turns them into two short lists — own time per function
and inclusive time per nvpair function — for bench/README.md's "Profiles".
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

from bench.procs import ROOT

PY_SPY = ROOT / ".venv-bench" / "bin" / "py-spy"
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def available() -> bool:
    return PY_SPY.exists()


def record(pid: int, seconds: float, out: Path) -> None:
    """Sample ``pid`` for ``seconds`` into ``out`` (collapsed stacks)."""
    argv = [str(PY_SPY), "record", "--pid", str(pid), "--duration", str(round(seconds))]
    argv += ["--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed: {done.stderr.strip()[-300:]}")


def frame_label(frame: str) -> str:
    """``handle (nvpair/dispatch.py:149)`` -> ``nvpair/dispatch.py:handle`` (site-packages and
    the interpreter's own paths shortened to the package path)."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match.group("file")
    for marker in ("site-packages/", "/lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{match.group('name')}"


def parse(collapsed: str) -> list[tuple[list[str], int]]:
    """Stacks (outermost first) with their sample counts; malformed lines are skipped."""
    stacks = []
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks.append(([frame_label(f) for f in stack.split(";") if f], int(count)))
    return stacks


def summarize(collapsed: str, top: int = 15) -> str:
    """Markdown: the functions with the most own samples, and the nvpair functions with the
    most inclusive samples, each as a share of all samples."""
    stacks = parse(collapsed)
    total = sum(count for _, count in stacks)
    if not total:
        return "(no samples)"
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        if frames:
            own[frames[-1]] += count
        for label in set(frames):
            if label.startswith("nvpair/"):
                inclusive[label] += count
    lines = [f"{total:,} samples.", "", "Own time (the frame on top of the stack):", ""]
    lines += [f"- {share(n, total)} `{label}`" for label, n in own.most_common(top)]
    lines += ["", "Inclusive time of nvpair's own functions:", ""]
    lines += [f"- {share(n, total)} `{label}`" for label, n in inclusive.most_common(top)]
    return "\n".join(lines)


def share(count: int, total: int) -> str:
    return f"{count / total * 100:5.1f} %"
