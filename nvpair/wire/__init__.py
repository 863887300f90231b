"""HTTP/1.1 on both hops, knowing no engine. :mod:`.message` is read first: the heads, fields
and bodies both hops speak. :mod:`.server` is the facade's connection, reader, request and
timeouts; :mod:`.client` the upstream client (connection, pool, framing, an answer's body);
:mod:`.trust` what is checked per connection before HTTP (sniffing, TLS for peers and LAN
callers, membership, connection bounds). :mod:`.headers` (hop-by-hop rules), :mod:`.outlet`
(a connection's writes) and :mod:`.web` (the request path's seams) are shared.

May import :mod:`nvpair.common` only; an engine is a :mod:`nvpair.facades` matter
(docs/architecture.md#layers).
"""
