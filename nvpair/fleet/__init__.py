"""Standalone fleet mode: the fleet file, each node's polls on its own bounded schedule, load states
and passive health, and the scheduling it plays in the broker's place.

May import everything below it: :mod:`nvpair.common`, :mod:`nvpair.engines`,
:mod:`nvpair.control`, :mod:`nvpair.wire`, :mod:`nvpair.facades` and :mod:`nvpair.dispatch`
(docs/architecture.md#layers).
"""
