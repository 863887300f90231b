"""Pure browser-policy intersection for multi-target requests (docs/browser-policy.md).

One job: given what each responding node answered to a fanned-out preflight or inventory
request, decide whether the fleet as a whole grants the request's ``Origin`` and which
``Access-Control-*`` headers the proxy's one answer carries (docs/browser-policy.md,
"Browser policy"). The answer never grants more than any single responder did.

Header names are lower-case bytes. Single-valued headers (``Access-Control-Allow-Origin``,
``-Allow-Credentials``, ``-Max-Age``) are read the way a browser reads them (Fetch, "get a
header value"): every field line combined with ``", "``, outer whitespace removed. A repeated
header therefore never parses as one value, and a responder that repeats one grants what a
browser would grant it: nothing. List headers (``-Allow-Methods``, ``-Allow-Headers``,
``-Expose-Headers``) are the union of every line's comma-separated tokens, compared
case-insensitively.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

__all__ = [
    "ALLOW_CREDENTIALS",
    "ALLOW_HEADERS",
    "ALLOW_METHODS",
    "ALLOW_ORIGIN",
    "EXPOSE_HEADERS",
    "MAX_AGE",
    "VARY",
    "Decision",
    "Reply",
    "inventory_grant",
    "preflight",
]

ALLOW_ORIGIN = b"access-control-allow-origin"
ALLOW_METHODS = b"access-control-allow-methods"
ALLOW_HEADERS = b"access-control-allow-headers"
ALLOW_CREDENTIALS = b"access-control-allow-credentials"
MAX_AGE = b"access-control-max-age"
EXPOSE_HEADERS = b"access-control-expose-headers"
VARY = b"vary"

_OWS = b" \t"
_WILDCARD = b"*"

# Fetch: a "*" in Access-Control-Allow-Headers never covers Authorization, which must be
# listed by name. Without this, "*" from one node and "Authorization" from another would
# grant Authorization although the first node never did.
_NOT_COVERED_BY_WILDCARD: Mapping[bytes, frozenset[bytes]] = {
    ALLOW_HEADERS: frozenset({b"authorization"}),
}


@frozen
class Reply:
    """What one responding node answered.

    :ivar status: its HTTP status.
    :ivar headers: lower-case header names to their raw values, one per field line, as
        received (a comma-joined line and repeated lines are both fine).
    """

    status: int
    headers: Mapping[bytes, Sequence[bytes]]


@frozen
class Decision:
    """The fleet's combined answer.

    :ivar status: the status to answer with (see :func:`preflight` and
        :func:`inventory_grant` for what it means in each case).
    :ivar headers: the ``Access-Control-*`` and ``Vary`` headers to send, lower-case names,
        in a fixed order; empty whenever ``granted`` is False.
    :ivar granted: whether every responder granted the request's ``Origin``.
    """

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    granted: bool


class _Origin(enum.Enum):
    """How one responder granted the Origin."""

    ANY = "*"
    ECHOED = "origin"


def preflight(origin: bytes, replies: Sequence[Reply]) -> Decision:
    """Combine the answers to a fanned-out preflight
    (docs/browser-policy.md#preflight-intersection).

    A responder grants when its status is 2xx and its ``Access-Control-Allow-Origin`` is
    ``*`` or exactly *origin* (byte for byte, as browsers compare). If one does not, the
    answer is the first non-granting responder's status with no headers: a denial passes
    through as a denial (Ollama's 403; LM Studio's 200 without CORS headers stays that).

    When every responder grants, the answer is 204 with, in this order:

    - ``Access-Control-Allow-Origin``: ``*`` if every responder said ``*``, else *origin*;
    - ``Access-Control-Allow-Methods`` and ``-Allow-Headers``: what every responder allows,
      ``*`` meaning any (except ``Authorization`` for headers, which ``*`` never covers);
      omitted when that is nothing or when any responder omitted the header. Tokens keep
      the spelling and order of the first responder that listed them, so the answer is
      deterministic for a given node order;
    - ``Access-Control-Allow-Credentials: true`` only if every responder sent ``true``
      (compared case-insensitively);
    - ``Access-Control-Max-Age``: the smallest valid (all-digit) value any responder sent,
      leading zeros dropped; omitted when none sent a valid one;
    - ``Vary: Origin`` when the Origin is echoed rather than ``*``.

    :param origin: the request's ``Origin`` value.
    :param replies: every responder's answer, in node order.
    :raises ValueError: when *replies* is empty (no responders is the caller's 502).
    """
    if not replies:
        raise ValueError("preflight needs at least one responder")
    grants: list[_Origin] = []
    for reply in replies:
        grant = _origin_grant(reply, origin) if 200 <= reply.status < 300 else None
        if grant is None:
            return Decision(status=reply.status, headers=(), granted=False)
        grants.append(grant)
    headers = [_allow_origin(origin, grants)]
    headers += _token_header(ALLOW_METHODS, replies)
    headers += _token_header(ALLOW_HEADERS, replies)
    headers += _credentials(replies)
    headers += _max_age(replies)
    headers += _vary(grants)
    return Decision(status=204, headers=tuple(headers), granted=True)


def inventory_grant(origin: bytes, replies: Sequence[Reply]) -> Decision:
    """Combine the CORS side of a fanned-out inventory GET
    (docs/browser-policy.md#inventory-grants).

    A responder grants when its ``Access-Control-Allow-Origin`` is ``*`` or exactly
    *origin*, whatever its status: validity of a granting responder's status and body is
    the caller's separate question. ``granted`` is True when every responder grants.

    ``status`` is 200 when granted and 403 otherwise; it is only a suggestion, because the
    caller ranks an invalid inventory (502) above a denial (403) and above success, and
    sends :attr:`Decision.headers` with a 502 only when ``granted`` is True.

    When granted, the headers are, in this order: ``Access-Control-Allow-Origin`` (``*`` if
    every responder said ``*``, else *origin*), ``Access-Control-Allow-Credentials: true``
    only if every responder sent it, ``Access-Control-Expose-Headers`` intersected as
    :func:`preflight` intersects methods, and ``Vary: Origin`` when the Origin is echoed.

    :param origin: the request's ``Origin`` value.
    :param replies: every responder's answer, in node order.
    :raises ValueError: when *replies* is empty (no responders is the caller's 502).
    """
    if not replies:
        raise ValueError("an inventory grant needs at least one responder")
    grants: list[_Origin] = []
    for reply in replies:
        grant = _origin_grant(reply, origin)
        if grant is None:
            return Decision(status=403, headers=(), granted=False)
        grants.append(grant)
    headers = [_allow_origin(origin, grants)]
    headers += _credentials(replies)
    headers += _token_header(EXPOSE_HEADERS, replies)
    headers += _vary(grants)
    return Decision(status=200, headers=tuple(headers), granted=True)


def _lines(reply: Reply, name: bytes) -> list[bytes] | None:
    """Every field line of header *name*, or None when the responder did not send it."""
    # The caller promises lower-case names; folding here as well costs nothing and keeps a
    # mixed-case mapping from silently reading as "header absent".
    found = [
        value for key, values in reply.headers.items() if key.lower() == name for value in values
    ]
    return found if found else None


def _single(reply: Reply, name: bytes) -> bytes | None:
    """A single-valued header as Fetch reads it: lines combined with ", ", outer OWS trimmed."""
    lines = _lines(reply, name)
    if lines is None:
        return None
    return b", ".join(line.strip(_OWS) for line in lines)


def _origin_grant(reply: Reply, origin: bytes) -> _Origin | None:
    value = _single(reply, ALLOW_ORIGIN)
    if value == _WILDCARD:
        return _Origin.ANY
    # llama.cpp reflects an absent Origin as an empty value: never a grant, even when the
    # caller's origin is itself empty.
    if value and value == origin:
        return _Origin.ECHOED
    return None


def _allow_origin(origin: bytes, grants: Iterable[_Origin]) -> tuple[bytes, bytes]:
    if all(grant is _Origin.ANY for grant in grants):
        return (ALLOW_ORIGIN, _WILDCARD)
    return (ALLOW_ORIGIN, origin)


def _vary(grants: Iterable[_Origin]) -> list[tuple[bytes, bytes]]:
    # An echoed Origin makes the answer depend on the request's Origin: caches must know.
    if all(grant is _Origin.ANY for grant in grants):
        return []
    return [(VARY, b"Origin")]


def _credentials(replies: Iterable[Reply]) -> list[tuple[bytes, bytes]]:
    if all((_single(r, ALLOW_CREDENTIALS) or b"").lower() == b"true" for r in replies):
        return [(ALLOW_CREDENTIALS, b"true")]
    return []


def _max_age(replies: Iterable[Reply]) -> list[tuple[bytes, bytes]]:
    ages: list[bytes] = []
    for reply in replies:
        value = _single(reply, MAX_AGE)
        # delta-seconds is 1*DIGIT: "-1", "1.5", "10s" and a repeated header are not valid and
        # constrain nothing, as if not sent (docs/browser-policy.md#preflight-intersection: "the
        # smallest value sent").
        if value and value.isdigit():
            ages.append(value.lstrip(b"0") or b"0")
    if not ages:
        return []
    # Compared as (length, digits) so no integer conversion limit applies to huge values.
    return [(MAX_AGE, min(ages, key=lambda age: (len(age), age)))]


@frozen
class _Tokens:
    """What one list header allows.

    :ivar wildcard: whether ``*`` was listed.
    :ivar named: folded token -> spelling, in first-listed order.
    :ivar uncovered: folded tokens ``*`` does not cover for this header.
    """

    wildcard: bool
    named: dict[bytes, bytes]
    uncovered: frozenset[bytes]

    def allows(self, folded: bytes) -> bool:
        return folded in self.named or (self.wildcard and folded not in self.uncovered)

    def meet(self, other: _Tokens) -> _Tokens:
        """What both allow; self's tokens first, in self's spelling."""
        named = {f: s for f, s in self.named.items() if other.allows(f)}
        for folded, spelling in other.named.items():
            if folded not in named and self.allows(folded):
                named[folded] = spelling
        return _Tokens(self.wildcard and other.wildcard, named, self.uncovered)

    def render(self) -> bytes | None:
        if self.wildcard:
            # Names "*" already covers are redundant; the uncovered ones must stay listed.
            extra = [s for f, s in self.named.items() if f in self.uncovered]
            return b", ".join([_WILDCARD, *extra])
        return b", ".join(self.named.values()) or None


def _tokens(reply: Reply, name: bytes) -> _Tokens | None:
    lines = _lines(reply, name)
    if lines is None:
        return None
    wildcard = False
    named: dict[bytes, bytes] = {}
    for line in lines:
        for raw in line.split(b","):
            token = raw.strip(_OWS)
            if token == _WILDCARD:
                wildcard = True
            elif token:
                named.setdefault(token.lower(), token)
    return _Tokens(wildcard, named, _NOT_COVERED_BY_WILDCARD.get(name, frozenset()))


def _token_header(name: bytes, replies: Iterable[Reply]) -> list[tuple[bytes, bytes]]:
    combined: _Tokens | None = None
    for reply in replies:
        tokens = _tokens(reply, name)
        if tokens is None:
            # One responder that never sent the header allows none of it.
            return []
        combined = tokens if combined is None else combined.meet(tokens)
    value = None if combined is None else combined.render()
    return [] if value is None else [(name, value)]
