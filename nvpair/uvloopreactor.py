"""Installs Twisted's asyncio reactor running on uvloop (``twistd -r uvloop``).

Twisted's own epoll reactor spends a large share of a proxy's time toggling read and write
interest and dispatching through Python; uvloop (libuv) does that loop in C. Measured side by
side in ``make bench`` (bench/README.md); the protocols, transports and producers are Twisted's
either way, so nothing above the reactor changes.
"""

from __future__ import annotations

import asyncio


def install() -> None:
    """Install the reactor; uvloop missing is an error that says so, not a silent fallback."""
    try:
        import uvloop
    except ImportError as missing:
        raise ImportError(
            "the uvloop reactor needs the uvloop package (pip install 'nvpair-proxy[uvloop]')"
        ) from missing
    from twisted.internet import asyncioreactor

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
