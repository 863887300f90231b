"""Ctrl-C and SIGTERM end the test run (README.md, "Development": what `make test` does).

pytest-twisted runs the reactor in a greenlet beside the tests. The reactor takes SIGTERM for
itself (it stops), and a KeyboardInterrupt raised while the reactor greenlet runs is caught and
logged by the reactor's main loop: either way the test that was running failed and every test
after it ran on and failed too. Here both signals end the run as pytest's own Ctrl-C does: the
processes the tests started are sent SIGTERM, no further test starts, and the interrupt reaches
the test itself, which pytest reports as interrupted (exit status 2).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import FrameType

import greenlet
import pytest


def _children() -> list[int]:
    """This process's direct children (proxies, simulated engines, llama-servers)."""
    mine = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name is in parentheses and may hold spaces: fields follow its end.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == mine:
                found.append(int(stat.parent.name))
    return found


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    main = greenlet.getcurrent()
    stopping = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:  # a second signal while the run winds down: leave at once
            os._exit(128 + signum)
        stopping = True
        name = signal.Signals(signum).name
        session = getattr(config, "_nvpair_session", None)
        if session is not None:
            session.shouldstop = f"interrupted by {name}"
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        current = greenlet.getcurrent()
        if current is main:
            raise KeyboardInterrupt(name)
        # In the reactor's greenlet the interrupt would be caught by its main loop: raise it
        # where the test waits on the reactor instead.
        main.throw(KeyboardInterrupt(name))

    def install() -> None:
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)

    install()
    # The reactor installs its own SIGTERM handler as it starts (in the first test that uses it).
    from twisted.internet import reactor

    reactor.addSystemEventTrigger("after", "startup", install)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._nvpair_session = session  # type: ignore[attr-defined]
