"""One listener per engine in that engine's dialect: the gate that admits or refuses a request at
its head (loopback, Host guard, route class, model) in two personalities, loopback/LAN callers'
and pinned cluster peers', the proxy's own answers and their reasons, the ports facades listen on
and the manager that enables, moves and stops them.

May import :mod:`nvpair.common`, :mod:`nvpair.engines`, :mod:`nvpair.control` and
:mod:`nvpair.wire` (docs/architecture.md#layers).
"""
