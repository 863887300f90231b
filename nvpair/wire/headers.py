"""Pure header handling for a reverse proxy: hop-by-hop removal (RFC 9110 §7.6.1)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from nvpair.wire.message import Fields, canonical

#: Connection-specific headers: they describe one hop and are never forwarded.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

#: Request headers the proxy sets itself for the upstream hop. Host names the upstream (an
#: engine's DNS-rebinding guard checks it), the body producer sets Content-Length, and the body
#: has already been read in full, so an Expect: 100-continue would only stall the upstream.
_REQUEST_OWNED = frozenset({b"host", b"content-length", b"expect"})


def connection_tokens(values: Iterable[bytes]) -> set[bytes]:
    """The header names a ``Connection`` header's values list, lower-cased."""
    tokens: set[bytes] = set()
    for value in values:
        tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _connection_tokens(headers: Iterable[tuple[bytes, Sequence[bytes]]]) -> set[bytes]:
    return connection_tokens(
        value for name, values in headers if name.lower() == b"connection" for value in values
    )


def _dropped(pairs: Iterable[tuple[bytes, Sequence[bytes]]], request: bool) -> frozenset[bytes]:
    """The lower-cased names not forwarded: hop-by-hop, named by ``Connection``, and for a
    request the ones the proxy sets itself."""
    drop = HOP_BY_HOP | _connection_tokens(pairs)
    return drop | _REQUEST_OWNED if request else drop


def end_to_end(
    headers: Iterable[tuple[bytes, Sequence[bytes]]], *, request: bool
) -> list[tuple[bytes, list[bytes]]]:
    """The headers worth forwarding, repeated values kept in order.

    Drops :data:`HOP_BY_HOP`, anything the ``Connection`` header names, and for a request the
    headers the proxy sets itself.

    :param headers: raw ``(name, values)`` pairs, as ``Fields.items()`` gives them.
    :param request: True for a client request going upstream, False for a response coming back.
    """
    pairs = [(name, list(values)) for name, values in headers]
    drop = _dropped(pairs, request)
    return [(name, values) for name, values in pairs if name.lower() not in drop]


#: What :func:`strip_hop_by_hop` drops by name, spelled canonically (``TE``): the names a head
#: keeps are compared as they are, with no lower-casing per name.
_HOP_NAMES = frozenset(canonical(name) for name in HOP_BY_HOP)
_REQUEST_HOP_NAMES = _HOP_NAMES | {canonical(name) for name in _REQUEST_OWNED}


def strip_hop_by_hop(fields: Fields, *, request: bool) -> Fields:
    """``fields`` less what :func:`end_to_end` drops, removed in place: one hop's fields
    handed on whole to the next, with no copy made.

    The names are judged as a head keeps them (canonical: a name is hop-by-hop in any case
    exactly when its canonical form is; docs/performance.md#headers).
    """
    for name in _hop_names(fields.items(), request):
        fields.pop(name, None)
    return fields


def _hop_names(pairs: Collection[tuple[bytes, Sequence[bytes]]], request: bool) -> list[bytes]:
    """The names of ``pairs`` (canonical, as a head keeps them) that are not forwarded."""
    hop = _REQUEST_HOP_NAMES if request else _HOP_NAMES
    dropped = []
    listed: set[bytes] = set()
    for name, values in pairs:
        if name in hop:
            dropped.append(name)
            if name == b"Connection":
                listed = connection_tokens(values)
    if listed:
        dropped += (name for name, _ in pairs if name.lower() in listed)
    return dropped


def framed_by_length(method: bytes, status: int) -> bool:
    """Whether a response to ``method`` with ``status`` is framed by ``Content-Length``.

    Not a HEAD answer (its Content-Length, if any, is the GET body's and passes through as
    the engine sent it), and not 1xx, 204 or 304, which have no body and, for 1xx and 204,
    must not carry Content-Length at all (RFC 9110 §8.6).
    """
    return method != b"HEAD" and status >= 200 and status not in (204, 304)


def is_event_stream(fields: Fields) -> bool:
    """Whether the answer's ``Content-Type`` is ``text/event-stream`` (parameters and case
    aside): an event feed, which may stay silent for minutes after its head
    (docs/request-path.md#event-feeds)."""
    values = fields.get(b"Content-Type")
    if not values:
        return False
    media = values[-1].split(b";", 1)[0].strip().lower()
    return media == b"text/event-stream"
