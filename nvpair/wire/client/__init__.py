"""The upstream HTTP/1.1 client: :class:`.upstream.Upstream` dials and sends, its pool keeps
idle connections (:mod:`.pool`; a connection knows nothing of it), one connection carries one
exchange at a time (:mod:`.connection`, :mod:`.reading`, :mod:`.framing`), and an answer's body
is a source (:mod:`.body`). :mod:`.bodies` reads a body within bounds, :mod:`.fanout` asks every
node at once.
"""
