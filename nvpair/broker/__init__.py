"""Broker mode: the JSON-RPC line protocol on stdio (framing, envelope, matching answers), the
broker's methods applied to the process, and the outboxes (the broker link, or the log in fleet
mode).

May import :mod:`nvpair.common`, :mod:`nvpair.engines`, :mod:`nvpair.control`,
:mod:`nvpair.wire`, :mod:`nvpair.facades` and :mod:`nvpair.dispatch`
(docs/architecture.md#layers).
"""
