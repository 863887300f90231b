# -*- test-case-name: tests.wire.test_fields -*-
"""Header fields on the hot path: a dictionary the wire reads and writes directly, which is
also a Twisted ``Headers`` for everyone else.

Every request's head and every engine answer's head used to be read into a ``Headers`` one
field at a time and judged a name at a time: each call canonicalizes the name through a method
of its own and splits each value into lines and joins them again, some 4,000 instructions for an
``addRawHeader`` and 1,800 for a ``getRawHeaders``, and a proxied request made some 25 of them.
The wire now keeps a head as :data:`Fields` (the shape ``Headers`` keeps internally: canonical
name -> values, in the order the names first came) and reads and writes that dictionary in
place; :class:`LeanHeaders` is the ``Headers`` over it that the request path, the facades and the
tests use as before (docs/performance.md#headers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import AnyStr, TypeVar, overload

from twisted.web.http_headers import Headers

from nvpair.wire.message import Fields as Fields

_T = TypeVar("_T")

# A head's fields (nvpair.wire.message.Fields): each name as ``Headers`` spells it, values in
# order; a value set through ``Headers``' API here has its line breaks replaced, as ``Headers``
# does.

#: Names seen before, as given, and their canonical form. Read directly where a name is looked up
#: per field (a dictionary lookup, where a call would cost several).
CANONICAL: dict[bytes | str, bytes] = {}
#: Past this many names the cache starts again: a client inventing names cannot grow it.
_MAX_NAMES = 1024


def canonical(name: bytes | str) -> bytes:
    """``name`` as ``Headers`` stores it (``content-type`` -> ``Content-Type``, ``te`` ->
    ``TE``); ``InvalidHeaderName`` when it is not a token, as ``Headers`` raises."""
    found = CANONICAL.get(name)
    if found is not None:
        return found
    # Twisted's own rule, asked through its public API: the same capitalization and the same
    # exceptions, whatever Twisted version is installed.
    probe = Headers()
    probe.addRawHeader(name, b"")
    ((found, _),) = probe.getAllRawHeaders()
    if len(CANONICAL) >= _MAX_NAMES:
        CANONICAL.clear()
    CANONICAL[name] = found
    return found


def _value(value: bytes | str) -> bytes:
    """A value as ``Headers`` keeps it: UTF-8, each line break a space."""
    data = value.encode("utf8") if isinstance(value, str) else value
    return b" ".join(data.splitlines())


class LeanHeaders(Headers):
    """A ``Headers`` whose storage is :attr:`fields`, a :data:`Fields` the wire may read and
    write directly.

    Every public method of ``Headers`` is its own here (``tests/wire/test_fields.py`` fails on one
    that is not, and holds each to ``Headers``' answers): the base class's storage is never set.
    """

    __slots__ = ("fields",)

    def __init__(self, rawHeaders: Mapping[AnyStr, Sequence[AnyStr]] | None = None) -> None:
        self.fields: Fields = Fields()
        if rawHeaders is not None:
            for name, values in rawHeaders.items():
                self.setRawHeaders(name, values)

    @classmethod
    def over(cls, fields: Fields) -> LeanHeaders:
        """The ``Headers`` over ``fields`` itself (not a copy)."""
        headers = cls()
        headers.fields = fields
        return headers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fields!r})"

    def __cmp__(self, other: object) -> int:
        # ``Headers``' comparisons (its __eq__, __lt__...) come here, from either side.
        if not isinstance(other, Headers):
            return NotImplemented  # type: ignore[no-any-return]
        mine = sorted((name, list(values)) for name, values in self.fields.items())
        theirs = sorted((name, list(values)) for name, values in other.getAllRawHeaders())
        return (mine > theirs) - (mine < theirs)

    def copy(self) -> LeanHeaders:
        return LeanHeaders.over(self.fields.copy())

    def hasHeader(self, name: AnyStr) -> bool:
        key = CANONICAL.get(name)
        return (key if key is not None else canonical(name)) in self.fields

    def removeHeader(self, name: AnyStr) -> None:
        key = CANONICAL.get(name)
        self.fields.pop(key if key is not None else canonical(name), None)

    def setRawHeaders(self, name: str | bytes, values: Sequence[str | bytes]) -> None:
        key = CANONICAL.get(name)
        self.fields[key if key is not None else canonical(name)] = [_value(v) for v in values]

    def addRawHeader(self, name: str | bytes, value: str | bytes) -> None:
        key = CANONICAL.get(name)
        if key is None:
            key = canonical(name)
        values = self.fields.get(key)
        if values is None:
            self.fields[key] = [_value(value)]
        else:
            values.append(_value(value))

    @overload
    def getRawHeaders(self, name: AnyStr) -> Sequence[AnyStr] | None: ...

    @overload
    def getRawHeaders(self, name: AnyStr, default: _T) -> Sequence[AnyStr] | _T: ...

    def getRawHeaders(
        self, name: AnyStr, default: _T | None = None
    ) -> Sequence[AnyStr] | _T | None:
        key = CANONICAL.get(name)
        values = self.fields.get(key if key is not None else canonical(name))
        if not values:
            return default
        if isinstance(name, str):
            return [v.decode("utf8") for v in values]
        return values

    def getAllRawHeaders(self) -> Iterator[tuple[bytes, Sequence[bytes]]]:
        return iter(self.fields.items())
