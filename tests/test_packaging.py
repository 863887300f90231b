"""What ``pip install`` ships: the package as setuptools lays it out from pyproject.toml holds
the example fleet file and the systemd unit, and the console script prints them from there.

The layout is setuptools' ``build_py``, the step that fills a wheel with the package's modules
and data, run on a copy of the checkout with the venv's setuptools (no index needed); the copy
it builds is then imported ahead of the checkout's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvpair import examples

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package tree a wheel would hold, built from a copy of the checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for tree in ("nvpair", "twisted"):
        shutil.copytree(
            ROOT / tree,
            source / tree,
            ignore=shutil.ignore_patterns("__pycache__", "dropin.cache"),
        )
    lib = tmp_path_factory.mktemp("lib")
    setup = "from setuptools import setup; setup()"
    result = subprocess.run(
        [sys.executable, "-c", setup, "-q", "build_py", "--build-lib", str(lib)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return lib


def test_the_shipped_files_are_package_data(built: Path) -> None:
    """Both files are in the built package, byte for byte the checkout's (their one copy)."""
    for name in (examples.FLEET, examples.SYSTEMD_UNIT):
        shipped = built / "nvpair" / "examples" / name
        assert shipped.read_bytes() == (ROOT / "nvpair" / "examples" / name).read_bytes()


@pytest.mark.parametrize(
    ("flag", "name"),
    [("--example-fleet", examples.FLEET), ("--systemd-unit", examples.SYSTEMD_UNIT)],
)
def test_the_built_package_prints_them(built: Path, tmp_path: Path, flag: str, name: str) -> None:
    """The console script's module, imported from the built package rather than the
    checkout, prints each file: what an installed copy does with no source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = str(built)
    where = subprocess.run(
        [sys.executable, "-c", "import nvpair.examples as e; print(e.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(built)
    result = subprocess.run(
        [sys.executable, "-m", "nvpair.cli", flag],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (built / "nvpair" / "examples" / name).read_text()


#: How setuptools (84, the newest pyproject.toml allows) begins the warning it prints when asked
#: for a compat-mode editable install: a summary line, then a starred banner of twelve lines.
COMPAT_WARNING = (
    "Compat editable installs\n!!\n\n" + "*" * 80 + "\nThe 'compat' editable mode is transitional"
)


def test_the_first_make_installs_without_the_setuptools_banner(tmp_path: Path) -> None:
    """``make demo``'s first install asks for compat mode (twisted/plugins stays visible); the
    warning setuptools gives for it is filtered out of that one command, nothing else."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch()
    shown = subprocess.run(
        ["make", "--no-print-directory", "-n", ".venv/.installed"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (install,) = [line for line in shown.splitlines() if "editable_mode=compat" in line]
    words = shlex.split(install)
    settings = dict(word.split("=", 1) for word in words[: words.index(".venv/bin/pip")])
    warn = (
        "import warnings\n"
        "class SetuptoolsDeprecationWarning(UserWarning): pass\n"
        f"warnings.warn({COMPAT_WARNING!r}, SetuptoolsDeprecationWarning)\n"
        "warnings.warn('anything else', SetuptoolsDeprecationWarning)\n"
    )
    plain = subprocess.run([sys.executable, "-c", warn], capture_output=True, text=True)
    assert "Compat editable installs" in plain.stderr
    filtered = subprocess.run(
        [sys.executable, "-c", warn], capture_output=True, text=True, env={**os.environ, **settings}
    )
    assert "Compat editable installs" not in filtered.stderr
    assert "anything else" in filtered.stderr
