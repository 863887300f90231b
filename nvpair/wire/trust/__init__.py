"""What the wire checks per connection before HTTP: the first byte (:mod:`.sniffing`), pinned
mutual TLS for peers and TLS for LAN callers (:mod:`.tls`, :mod:`.lantls`), the cluster
membership it trusts (:mod:`.cluster`), and the bounds on connections per caller
(:mod:`.connbounds`).
"""
