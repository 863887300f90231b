# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""What llhttp's callbacks record of an upstream answer: its head as it arrives, the final
answer built from it, body pieces, and anything that came after its end.

The callbacks only record, so nothing re-enters the parser: the connection
(:class:`~nvpair.wire.client.connection.UpstreamConnection`) acts on what they recorded once llhttp
has returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from httptools.parser.parser import HttpResponseParser
from twisted.internet.protocol import Protocol

from nvpair.wire.client.body import ReadFlow, UpstreamBody, final_answer
from nvpair.wire.client.framing import BadResponse
from nvpair.wire.client.types import Phase
from nvpair.wire.message import Answer

# A member looked up through its class costs 45 ns on 3.11, a module global 5.
_READING_BODY, _BODY_DONE = Phase.READING_BODY, Phase.BODY_DONE


class AnswerReader(Protocol):
    """The llhttp side of an upstream connection: the parser's callbacks and what they record.

    :ivar _pending: the final answer, built from its head in this read, not yet handed on.
    :ivar _body: the body of the answer handed on, still being read.
    :ivar _chunks: body bytes of this read, not yet delivered.
    :ivar _extra: bytes came after the answer's end (or another message): no reuse.
    :ivar _failure: why the head was refused, kept across llhttp's own error.
    """

    __slots__ = ("_body", "_chunks", "_extra", "_failure", "_fields", "_pending", "_phrase")

    # The connection's, read here.
    phase: Phase
    _parser: HttpResponseParser | None
    _head: bool
    _flow: ReadFlow

    if TYPE_CHECKING:
        # The body stops the connection (a BodyOwner): the subclass's.
        def stop_body(self, abort: bool = False) -> None: ...

    def __init__(self) -> None:
        # Head in progress (reset at each message's start).
        self._fields: list[tuple[bytes, bytes]] = []
        self._phrase = b""
        self._pending: Answer | None = None
        self._body: UpstreamBody | None = None
        self._chunks: list[bytes] = []
        self._extra = False
        self._failure: Exception | None = None

    def on_message_begin(self) -> None:
        if self._pending is not None or self._body is not None:
            self._extra = True
            return
        self._fields.clear()
        self._phrase = b""

    def on_status(self, status: bytes) -> None:
        if self._pending is None and self._body is None:
            self._phrase += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._pending is not None or self._body is not None:
            # Trailer fields of a chunked body (Twisted drops them too), or another message.
            return
        self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        if self._pending is not None or self._body is not None:
            return
        parser = self._parser
        assert parser is not None
        code = parser.get_status_code()
        if 100 <= code < 200 and code != 101:
            # Informational (100, 103): not the answer, which is still to come.
            return
        try:
            pending = final_answer(
                code,
                parser.get_http_version(),
                self._phrase,
                self._fields,
                self._head,
                UpstreamBody(self, self._flow),
            )
        except BadResponse as refused:
            # llhttp stops, and raises its own error: the reason is kept here.
            self._failure = refused
            raise
        self._pending = pending
        # Nothing follows a head with no body (a HEAD answer, 204, 304, Content-Length: 0).
        self.phase = _BODY_DONE if pending.head.length == 0 else _READING_BODY
        # Now in the response's headers: a stream held open should not keep both copies.
        self._fields.clear()

    def on_body(self, body: bytes) -> None:
        if self.phase is _BODY_DONE:
            self._extra = True
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        # Only a final answer's body ends here: an interim answer's end leaves the head awaited,
        # and a stopped reader's connection is closing already.
        if self.phase is _READING_BODY:
            self.phase = _BODY_DONE
