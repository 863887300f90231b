"""HTTP/1.1 on both hops, knowing no engine: the facade's server connection on llhttp and the seam
it asks admission through, the upstream client with its pools, first-byte sniffing, connection
bounds, pinned mutual TLS and the cluster membership it trusts, hop-by-hop headers, bounded bodies
and fan-out.

May import :mod:`nvpair.common` only; an engine is a :mod:`nvpair.facades` matter
(docs/architecture.md#layers).
"""
