"""What the request path reads about the fleet, and how it speaks back: the control state (discovery
snapshots, the scheduler's priority list, pins, local backends), the process-wide reservation map
held against it, the candidate order it implies (pure), and the outbox the proxy's own messages go
to (a broker link or the log, chosen by the process).

May import :mod:`nvpair.common` and :mod:`nvpair.engines` (docs/architecture.md#layers).
"""
