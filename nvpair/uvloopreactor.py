"""Installs Twisted's asyncio reactor running on uvloop (``twistd -r uvloop``, ``nvpair-proxy
--reactor uvloop``).

Twisted's own epoll reactor spends a large share of a proxy's time toggling read and write
interest and dispatching through Python; uvloop (libuv) does that loop in C. Measured side by
side in ``make bench`` (bench/README.md); the protocols, transports and producers are Twisted's
either way, so nothing above the reactor changes.
"""

from __future__ import annotations

import asyncio

from twisted.python import usage

from nvpair.tap import usage_exit

#: Said when uvloop is not installed: the package extra that brings it (pyproject.toml).
MISSING = "the uvloop reactor needs the uvloop package: pip install 'nvpair-proxy[uvloop]'"


def install() -> None:
    """Install the reactor; uvloop missing ends the process with a usage error that says what
    to install, never a silent fallback to another reactor."""
    try:
        import uvloop
    except ImportError:
        # Ended here, not raised: twistd would answer an exception from its -r with its whole
        # help on stdout and then the message; a person needs the one line.
        usage_exit(usage.UsageError(MISSING))
    from twisted.internet import asyncioreactor

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
