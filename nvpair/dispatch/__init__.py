"""The request path: an admitted request becomes a job with a budget; candidates are planned and
reserved, attempts dispatched with failover until the answer commits, the body relayed with
backpressure, workload events and activity reported. Route classes other than inference (other,
peer, inventory, preflight) are served here too.

Mode-blind: broker or fleet mode reaches it only through the scheduling seam it declares
(:mod:`nvpair.dispatch.seams`). May import :mod:`nvpair.common`, :mod:`nvpair.engines`,
:mod:`nvpair.control`, :mod:`nvpair.wire` and :mod:`nvpair.facades`
(docs/architecture.md#layers).
"""
