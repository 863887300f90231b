# -*- test-case-name: tests.broker.test_broker -*-
"""The broker link's wire form: one JSON value per line, both ways
(docs/broker-protocol.md#framing).

Incoming bytes are cut into lines by :class:`LineReader`, over-long ones cut off; a line's JSON
value is read by :func:`parse_line`, stricter than :func:`json.loads`; an outgoing message is
made one line by :func:`encode_frame`. What a value means as JSON-RPC is
:mod:`nvpair.broker.envelope`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from nvpair.common import strictjson

#: Longest line accepted; longer ones are answered -32600 and discarded (docs/broker-protocol.md).
MAX_LINE = 1024 * 1024


class LineReader:
    """Cuts a byte stream into newline-terminated lines of at most :data:`MAX_LINE` bytes.

    :param line: called with each whole line, without its newline, as soon as it is complete.
    :param too_long: called once per line over the limit, as soon as it is known to be; the
        rest of that line, up to its newline, is dropped.
    """

    def __init__(self, line: Callable[[bytes], None], too_long: Callable[[], None]) -> None:
        self._line = line
        self._too_long = too_long
        # The start of a line whose newline has not arrived yet, kept as pieces so a long line
        # read in many small chunks is joined once instead of re-copied per chunk.
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._discarding = False

    def feed(self, data: bytes) -> None:
        # Walk the chunk by index: slicing the rest of a buffer off per line would make one
        # read full of short lines cost quadratic time.
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            piece, start = data[start:end], end + 1
            if self._discarding:
                # The tail of an over-long line: already answered.
                self._discarding = False
                continue
            if self._partial:
                line = b"".join([*self._partial, piece])
                self._partial, self._partial_size = [], 0
            else:
                line = piece
            if len(line) > MAX_LINE:
                self._too_long()
                continue
            self._line(line)
        if self._discarding or start == len(data):
            return
        self._partial.append(data[start:])
        self._partial_size += len(data) - start
        if self._partial_size > MAX_LINE:
            self._partial, self._partial_size = [], 0
            self._discarding = True
            self._too_long()

    def drop_partial(self) -> int:
        """Forget the start of a line whose newline never came; how many bytes it had."""
        size = self._partial_size if self._partial else 0
        self._partial, self._partial_size = [], 0
        return size


def parse_line(line: bytes) -> object:
    """The JSON value of one line; ValueError when it is not JSON text this link accepts.

    Strict JSON (:func:`nvpair.common.strictjson.loads`: no ``NaN``/``Infinity`` literals, nesting
    past the recursion limit a parse error), and stricter still, on purpose:

    - UTF-8 only (``json.loads`` of bytes would also guess UTF-16 and UTF-32);
    - no lone surrogate escapes (``"\\ud800"``): such a string has no UTF-8 form, so it could
      be neither stored, logged nor echoed back as the text it claims to be.

    A number past a double's range (``1e400``) reads as an infinity: each field that takes a
    number refuses it there, with -32602 naming the field.
    """
    return strictjson.loads(line.decode("utf-8"), finite=False, lone_surrogates=False)


def encode_frame(message: Mapping[str, object]) -> bytes:
    """One line for ``message``.

    :raises ValueError, TypeError, RecursionError: it has no JSON form (NaN or Infinity,
        something unserializable, or absurd nesting).
    """
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; the ASCII form escapes it and is still JSON.
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
