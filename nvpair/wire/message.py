# -*- test-case-name: tests.wire.test_message -*-
"""HTTP as this proxy speaks it, on both hops: read this module first.

A message is a **head** and a **body**. A head is a request's method and target or an answer's
status, with its :class:`Fields`; a body passes from a :class:`BodySource` (what is read: an
engine's answer) to a :class:`BodySink` (what is written: the client's answer, a bounded
reader) piece by piece with :meth:`BodySink.data`, and ends once with :meth:`BodySink.end`,
whose :class:`Ended` says how. The facade's server (a request read, its answer written), the
upstream client (a request written, its answer read), the relay between the two and an
attempt speak only these (docs/architecture.md#the-wire).

Nothing here does I/O; everything is a value or a protocol.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

# -- fields -----------------------------------------------------------------------------------

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

#: Names whose usual spelling is not each part capitalized (as Twisted and most servers write
#: them: an answer's names go out as they are kept).
_SPELLED = {
    b"content-md5": b"Content-MD5",
    b"dnt": b"DNT",
    b"etag": b"ETag",
    b"p3p": b"P3P",
    b"te": b"TE",
    b"www-authenticate": b"WWW-Authenticate",
    b"x-xss-protection": b"X-XSS-Protection",
}

#: Names seen before, as given, and their canonical form: a dictionary lookup where a name is
#: looked up per field. Read directly by the parsers.
CANONICAL: dict[bytes | str, bytes] = {}
#: Past this many names the cache starts again: a client inventing names cannot grow it.
_MAX_NAMES = 1024


class InvalidName(ValueError):
    """A field name that is no token (RFC 9110 §5.1)."""


def canonical(name: bytes | str) -> bytes:
    """``name`` as a head keeps it: each ``-``-separated part capitalized (``content-type`` ->
    ``Content-Type``), a few names as they are conventionally spelled (``te`` -> ``TE``).

    :raises InvalidName: when ``name`` is not a token.
    """
    found = CANONICAL.get(name)
    if found is not None:
        return found
    # A token is ASCII: text that is not even Latin-1 is no token either.
    data = name.encode("latin-1", "replace") if isinstance(name, str) else name
    if _TOKEN.fullmatch(data) is None:
        raise InvalidName(f"invalid field name {data!r}")
    lowered = data.lower()
    found = _SPELLED.get(lowered)
    if found is None:
        found = b"-".join(part.capitalize() for part in lowered.split(b"-"))
    if len(CANONICAL) >= _MAX_NAMES:
        CANONICAL.clear()
    CANONICAL[name] = found
    return found


def _key(name: bytes | str) -> bytes:
    found = CANONICAL.get(name)
    return found if found is not None else canonical(name)


class Fields(dict[bytes, list[bytes]]):
    """A head's fields: each name canonical (:func:`canonical`), its values in the order they
    came, names in the order they first came.

    The parsers fill it as a dictionary, by canonical name, and the writers read it so; the
    methods take a name in any case. No value holds CR, LF or NUL: the parsers refuse them, and
    :meth:`put` and :meth:`add` refuse them too (a value is never silently changed).
    """

    __slots__ = ()

    @classmethod
    def of(
        cls,
        pairs: Mapping[bytes, Sequence[bytes]] | Iterable[tuple[bytes, bytes | Sequence[bytes]]],
    ) -> Fields:
        """Fields from ``(name, value)`` or ``(name, [values])`` pairs, or a mapping of names
        to lists of values; names in any case."""
        fields = cls()
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        for name, value in items:
            if isinstance(value, bytes | str):
                fields.add(name, value)
            else:
                for one in value:
                    fields.add(name, one)
        return fields

    def has(self, name: bytes | str) -> bool:
        return _key(name) in self

    def all_of(self, name: bytes | str) -> list[bytes]:
        """Every value of ``name``, in order (empty when it is absent)."""
        return self.get(_key(name)) or []

    def first(self, name: bytes | str) -> bytes | None:
        """The first value of ``name``, or None."""
        found = self.get(_key(name))
        return found[0] if found else None

    def last(self, name: bytes | str) -> bytes | None:
        """The last value of ``name``, or None."""
        found = self.get(_key(name))
        return found[-1] if found else None

    def put(self, name: bytes | str, value: bytes | str) -> None:
        """``name`` has ``value`` alone from now on."""
        self[_key(name)] = [_checked(value)]

    def add(self, name: bytes | str, value: bytes | str) -> None:
        """One more value of ``name``, after those it has."""
        checked = _checked(value)
        self.setdefault(_key(name), []).append(checked)

    def drop(self, name: bytes | str) -> None:
        """``name`` is absent from now on."""
        self.pop(_key(name), None)

    def copy(self) -> Fields:
        copied = Fields()
        for name, values in self.items():
            copied[name] = list(values)
        return copied

    def lowered(self) -> dict[bytes, list[bytes]]:
        """A copy keyed by lower-case names (what the pure decision modules read)."""
        return {name.lower(): list(values) for name, values in self.items()}


def _checked(value: bytes | str) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    if b"\r" in data or b"\n" in data or b"\0" in data:
        raise ValueError(f"a field value holds CR, LF or NUL: {data!r}")
    return data


# -- heads ------------------------------------------------------------------------------------


class RequestHead:
    """A request's head: method, target (as sent, origin or absolute form), version, fields.

    Filled in place by the server's parser as the head arrives, so not frozen.
    """

    __slots__ = ("fields", "method", "target", "version")

    def __init__(
        self,
        method: bytes = b"",
        target: bytes = b"",
        version: bytes = b"HTTP/1.1",
        fields: Fields | None = None,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.fields = fields if fields is not None else Fields()

    def __repr__(self) -> str:
        return f"RequestHead({self.method!r}, {self.target!r}, {self.version!r}, {self.fields!r})"


class ResponseHead:
    """An answer's head: status, reason phrase, fields, and its body's length where its framing
    states one (``Content-Length``; None: chunked, to the close, or not said).

    An engine's answer's fields hold no connection-control field (``Connection``,
    ``Transfer-Encoding``, ``Content-Length``...): the client read them as its framing, and
    the length is :attr:`length`.
    """

    __slots__ = ("fields", "length", "phrase", "status")

    def __init__(
        self,
        status: int,
        phrase: bytes = b"",
        fields: Fields | None = None,
        length: int | None = None,
    ) -> None:
        self.status = status
        self.phrase = phrase
        self.fields = fields if fields is not None else Fields()
        self.length = length

    def __repr__(self) -> str:
        return (
            f"ResponseHead({self.status}, {self.phrase!r}, {self.fields!r}, length={self.length})"
        )


# -- bodies -----------------------------------------------------------------------------------


class End(enum.Enum):
    """How a body ended."""

    #: Its framing ended it (its length read, its last chunk, or no body at all).
    COMPLETE = "complete"
    #: It ran to the connection's close, as its framing said it would: complete as far as
    #: anyone can tell.
    AT_CLOSE = "at-close"
    #: The connection went before its framing ended it (a reset, fewer bytes than its length,
    #: no last chunk), or its reader stopped it.
    CUT = "cut"
    #: It broke its framing, or a reader failed on a piece of it.
    BROKEN = "broken"


class Ended(NamedTuple):
    """Why a body ended (:class:`End`), with the error that ended it, if one did."""

    how: End
    error: BaseException | None = None

    @property
    def complete(self) -> bool:
        """The body is whole: ended by its framing, or by the close its framing named."""
        return self.how is End.COMPLETE or self.how is End.AT_CLOSE


#: Every body that ended by its framing ends with this one value.
COMPLETE = Ended(End.COMPLETE)
#: Every body that ran to its connection's close, as its framing said, ends with this one.
AT_CLOSE = Ended(End.AT_CLOSE)


class BodySink(Protocol):
    """Where a body goes: its pieces, then its end, once."""

    def data(self, chunk: bytes) -> None:
        """One piece of the body (never after :meth:`end`)."""

    def end(self, ended: Ended) -> None:
        """The body ended; nothing follows."""


class Flow(Protocol):
    """What a reader that cannot keep up controls of what it reads: an engine's answer, as the
    client's answer registers it (docs/request-path.md#streaming-with-backpressure)."""

    def pause(self) -> None:
        """Stop reading for now (the reader cannot take more)."""

    def resume(self) -> None:
        """Read again."""

    def stop(self, abort: bool = False) -> None:
        """Nobody wants the rest: close the connection it comes over (``abort``: at once, what
        was unsent dropped). A no-op once it has ended."""


class BodySource(Flow, Protocol):
    """Where a body comes from (an engine's answer over its connection): a :class:`Flow` that
    sends its body to one sink. Stopped, the sink is still told the end."""

    def connect(self, sink: BodySink) -> None:
        """Send the body to ``sink``: what has come already at once (and its end, if it has
        ended: the one way a body that ended before anyone read it is told), then the rest as
        it comes. Once per body.

        :raises RuntimeError: when a sink was connected already.
        """


class Answer(NamedTuple):
    """An engine's answer whose head has come; its body follows from :attr:`body`."""

    head: ResponseHead
    body: BodySource


# -- failures ---------------------------------------------------------------------------------


class NoAnswer(ConnectionError):
    """The exchange failed before the answer's head came (the connection went, or the bytes
    were no answer); :attr:`reason` says why."""

    def __init__(self, reason: BaseException | None) -> None:
        super().__init__(f"no answer: {reason}")
        self.reason = reason
