"""The facade's HTTP/1.1 server: one connection (:mod:`.channel`), llhttp's callbacks and the
bounds on what they hold (:mod:`.reader`), HTTP's rules for a request head (:mod:`.head`), one
request and its answer (:mod:`.request`), the head, idle, linger and abort bounds
(:mod:`.timeouts`), and the :class:`~.types.Gate` a facade is to the wire (:mod:`.types`).
The listener's factory is :class:`.site.FacadeSite`.
"""
