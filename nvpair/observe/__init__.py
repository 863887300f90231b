"""What an operator sees: the admin listener (loopback, and ``[admin]``'s LAN address), the
status document and page, Prometheus metrics, and the recent workloads with their attempts.

Reads every package below it and is read by none; the request path reports to it through the
observer seam it declares (:mod:`nvpair.dispatch.seams`). May import :mod:`nvpair.common`,
:mod:`nvpair.engines`, :mod:`nvpair.control`, :mod:`nvpair.wire`, :mod:`nvpair.facades`,
:mod:`nvpair.dispatch`, :mod:`nvpair.fleet` and :mod:`nvpair.broker`
(docs/architecture.md#layers).
"""
