"""What ``pip install`` ships: the package as setuptools lays it out from pyproject.toml holds
the example fleet file and the systemd unit, and the console script prints them from there.

The layout is setuptools' ``build_py``, the step that fills a wheel with the package's modules
and data, run on a copy of the checkout with the venv's setuptools (no index needed); the copy
it builds is then imported ahead of the checkout's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nvpair import cli_actions, examples

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


@pytest.fixture(scope="module")
def installed_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment prefix ``pip install`` would fill with pyproject.toml's data-files."""
    source = tmp_path_factory.mktemp("docs-source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "docs", source / "docs")
    prefix = tmp_path_factory.mktemp("prefix")
    setup = "from setuptools import setup; setup()"
    result = subprocess.run(
        [sys.executable, "-c", setup, "-q", "install_data", "--install-dir", str(prefix)],
        cwd=source, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return prefix


def test_help_says_where_the_docs_it_cites_are_installed(
    built: Path, installed_docs: Path, tmp_path: Path
) -> None:
    """No public copy of docs/ exists to link to, so ``pip install`` installs the pages and
    ``--help`` names the directory: every ``docs/<page>`` it (or a file it prints) cites is
    there, images included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPAIR_")}
    env["PYTHONPATH"] = str(built)
    show = (
        "import sys; sys.prefix = sys.argv[1]\n"
        "from nvpair import examples; from nvpair.tap import Options\n"
        "print(Options()); print(examples.text(examples.FLEET))\n"
        "print(examples.text(examples.SYSTEMD_UNIT))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", show, str(installed_docs)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    docs = installed_docs / "share" / "doc" / "nvpair-proxy"
    # --help wraps its text, breaking a long path at a hyphen too.
    said = "".join(f"The docs/ pages named above are in {docs}.".split())
    assert said in "".join(shown.split())
    cited = set(re.findall(r"docs/([\w-]+\.md)", shown))
    assert "lan.md" in cited
    for page in cited | {"README.md"}:
        assert (docs / page).read_bytes() == (ROOT / "docs" / page).read_bytes(), page
    for image in (ROOT / "docs" / "images").glob("*.png"):
        assert (docs / "images" / image.name).is_file()


def test_help_in_a_checkout_names_its_docs() -> None:
    """An editable install has no installed pages: --help names the checkout's docs/."""
    assert cli_actions.docs_dir("/nonexistent") == ROOT / "docs"


def test_no_project_url_is_made_up() -> None:
    """The project has no public home to point [project.urls] at; its documentation is the
    installed pages --help names. A URL belongs here once one exists, not before."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    assert "urls" not in project
