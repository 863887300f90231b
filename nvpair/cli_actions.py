"""What the command line does while it is parsed, before any service exists: print a file the
package ships and exit, or install the reactor the process runs on (docs/README.md#command-line).

Options of :class:`nvpair.tap.Options`, the same under ``nvpair-proxy`` and ``twistd -n
nvpair-proxy``; here so that the process's own settings stay in one place there.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import IO, NoReturn

from twisted.application import reactors
from twisted.internet.error import ReactorAlreadyInstalledError
from twisted.python import usage

from nvpair import examples
from nvpair.fleet.lanconfig import AccessError, new_key

#: The program's name in its own messages (usage errors, the terminal hint).
PROG = "nvpair-proxy"

#: Where ``pip install`` puts the pages of docs/, under the environment's prefix
#: (pyproject.toml's data-files): there is no public web copy to link to.
INSTALLED_DOCS = Path("share", "doc", PROG)


def version() -> str:
    """nvpair-proxy's version, from the installed package's metadata."""
    try:
        return metadata.version("nvpair-proxy")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def docs_dir(prefix: str = sys.prefix) -> Path:
    """The pages ``docs/...`` names in ``--help``: the installed copy, else (a checkout, whose
    editable install ships none) the checkout's own docs/."""
    installed = Path(prefix) / INSTALLED_DOCS
    if (installed / "README.md").is_file():
        return installed
    return Path(__file__).resolve().parents[1] / "docs"


def print_and_exit(name: str, out: IO[str] | None = None) -> NoReturn:
    """Write a shipped file to stdout, then end the process (:func:`write_and_exit`)."""
    write_and_exit(examples.text(name), name, out)


def write_and_exit(text: str, name: str, out: IO[str] | None = None) -> NoReturn:
    """Write ``text`` to stdout, then end the process: status 0 (as ``--help``), or 1 with one
    line on stderr naming ``name`` when stdout cannot take it (closed, a full disk; a reader
    gone, as ``| head`` goes, is told nothing)."""
    out = out if out is not None else sys.stdout
    if out is None:  # started with stdout closed
        raise SystemExit(f"{PROG}: cannot write {name}: stdout is closed")
    try:
        out.write(text)
        out.flush()
    except OSError as error:
        # What is still buffered would fail again in the interpreter's own flush at exit, as
        # a second message: stdout is pointed at nothing first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        if isinstance(error, BrokenPipeError):
            raise SystemExit(1) from None
        raise SystemExit(f"{PROG}: cannot write {name} to stdout: {error.strerror}") from None
    raise SystemExit(0)


def install_reactor(name: str) -> None:
    """Install twistd's reactor called ``name``, as twistd's own ``-r`` does.

    :raises usage.UsageError: one line saying why not; twistd's ``-r`` would print its whole
        help before it.
    """
    try:
        reactors.installReactor(name)
    except reactors.NoSuchReactor:
        raise usage.UsageError(
            f"--reactor: no reactor named {name!r} (twistd --help-reactors lists them)"
        ) from None
    except ReactorAlreadyInstalledError:
        raise usage.UsageError(
            "--reactor: a reactor is installed already (twistd's -r, or --reactor twice)"
        ) from None
    except Exception as error:  # an installer's own failure: platform, missing module
        raise usage.UsageError(f"--reactor: {name} cannot run here: {error}") from None


class ActionOptions(usage.Options):
    """The options that act as they are parsed; the plugin's options derive from these."""

    def opt_example_fleet(self) -> NoReturn:
        """Print a commented example fleet file and exit
        (nvpair-proxy --example-fleet > fleet.toml)."""
        print_and_exit(examples.FLEET)

    def opt_systemd_unit(self) -> NoReturn:
        """Print the systemd unit that serves /etc/nvpair/fleet.toml, and exit."""
        print_and_exit(examples.SYSTEMD_UNIT)

    def opt_new_key(self, name: str) -> NoReturn:
        """Print a new random key for LAN callers, then the [[keys]] block naming it for the
        key file, and exit (docs/lan.md#keys)."""
        try:
            secret, block = new_key(name)
        except AccessError as error:
            raise usage.UsageError(str(error)) from None
        write_and_exit(f"{secret}\n{block}", "the new key")

    def opt_reactor(self, name: str) -> None:
        """The event loop: uvloop (the uvloop extra), or any of twistd --help-reactors
        [default: Twisted's own for this platform]."""
        install_reactor(name)

    opt_r = opt_reactor
