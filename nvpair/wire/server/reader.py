# -*- test-case-name: tests.wire.server.test_facade_server -*-
"""Reading requests off a facade connection with llhttp: one parser, its callbacks, and the
request it is in the middle of.

llhttp calls back per head field and per piece of body; what those callbacks do is done here,
with no other object in between: bounding what a head and a chunked body's framing may take
(llhttp keeps partial names and values itself, across reads), dropping trailer fields, keeping
the body within the cap, counting a refused body's bytes while it is dropped, and reading the
body of an upgrade offer as HTTP/1.1. Once per request the reader tells its connection
(:class:`Channel`) that a request began, that its head or the whole of it is read, or that the
bytes cannot be read as HTTP: what becomes of the request is the connection's.
"""

from __future__ import annotations

from typing import Protocol

from httptools.parser.errors import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserInvalidMethodError,
    HttpParserUpgrade,
)
from httptools.parser.parser import HttpRequestParser
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.wire.message import CANONICAL, canonical
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.head import (
    CHUNKED,
    FRAMING_TOO_LARGE,
    HEAD_TOO_LARGE,
    INTERNAL,
    MAX_HEAD_BYTES,
    Refusal,
    http_refusal,
    parse_refusal,
)
from nvpair.wire.server.request import FacadeRequest
from nvpair.wire.server.types import Phase

#: After a refusal, the refused body is read and dropped, up to its declared end, for at most
#: this many bytes and seconds before the close, and until a read leaves the connection quiet
#: for LINGER_QUIET, as nginx's lingering close does: a client that writes a whole body at the
#: cap before it reads still reads the answer (docs/robustness.md#refusals-at-the-request-head).
LINGER_BYTES = 128 * 1024 * 1024
LINGER_SECONDS = 30.0
LINGER_QUIET = 5.0

# Module names for the phases read here (see nvpair.wire.server.channel).
_ANSWERING = Phase.ANSWERING
_FINISHING = Phase.FINISHING
_LINGERING = Phase.LINGERING
_CLOSING = Phase.CLOSING
_CLOSED = Phase.CLOSED


class Channel(Protocol):
    """The connection a reader reads for: what it is told once per request, and asked."""

    #: Where it is now.
    phase: Phase

    def begin(self) -> FacadeRequest:
        """A request's first byte is parsed: its request, in line behind any before it."""

    def head_parsed(self, request: FacadeRequest, refusal: Refusal | None) -> None:
        """``request``'s head is read; ``refusal``: HTTP's own reason to refuse it, if any."""

    def message_parsed(self, request: FacadeRequest) -> bool:
        """``request`` is read whole; True when nothing after it is to be parsed."""

    def unparsable(self, refusal: Refusal) -> None:
        """The bytes cannot be read as HTTP/1.1: nothing more is parsed."""

    def refuse(self, request: FacadeRequest, refusal: Refusal) -> None:
        """Answer ``refusal`` to ``request``, whose body is still arriving."""

    def close(self) -> None:
        """Close once what was written has gone out."""


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing: what follows is not read as HTTP."""


def _reframing_head(request: FacadeRequest) -> bytes:
    """A head that frames the body of ``request``, for llhttp to read after an upgrade offer."""
    if request.declared == CHUNKED:
        return b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    return b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % request.declared


class RequestReader:
    """llhttp's parser on one connection, and the request it is in the middle of.

    Made at a request's first byte and let go when nothing half-read is left in it
    (docs/performance.md#held-streams): :meth:`read` says when.

    :param channel: the connection read for.
    :param max_body: the body cap (``--max-request-body``).
    :param budget: the bodies held at once, all connections together (``--max-body-memory``).
    """

    # One per connection while a request is read: no per-instance dictionary.
    __slots__ = ("_budget", "_channel", "_llhttp", "_max_body", "parsing")

    log = Logger()

    def __init__(self, channel: Channel, max_body: int, budget: BodyBudget) -> None:
        self._channel = channel
        self._max_body = max_body
        self._budget = budget
        self._llhttp: HttpRequestParser | None = HttpRequestParser(self)
        #: The request llhttp is in the middle of (None: between requests, or none will be).
        self.parsing: FacadeRequest | None = None

    def read(self, data: bytes) -> bool:
        """Parse one read; False when this reader holds nothing to keep it for (between
        requests while one is answered, or once the last request is read).

        One method for the whole read, feeding and bounding alike: it runs on every read.
        """
        parsing = self.parsing
        between = parsing is None
        received = 0 if parsing is None else parsing.received
        parser = self._llhttp
        assert parser is not None
        fed = data
        while True:
            try:
                parser.feed_data(fed)
                if self.parsing is None and self._channel.phase is _ANSWERING:
                    # Between requests, one kept alive being answered: llhttp holds nothing a
                    # fresh parser would not, so a held stream keeps none.
                    self._llhttp = None
                    return False
                break
            except HttpParserUpgrade as upgrade:
                # An upgrade offer (h2c, websocket) is ignored, as nginx ignores it: llhttp
                # stopped where the other protocol would begin, taking the request as bodiless.
                # Its body, if it has one, is framed by a head made for it; then reading goes on
                # as HTTP/1.1.
                fed = fed[upgrade.args[0] :]
                between = False
                if self._ended:
                    return True
                request = self.parsing
                if request is not None:
                    # A fresh parser: the one that stopped would refuse anything after an offer
                    # that also said Connection: close.
                    parser = self._llhttp = HttpRequestParser(self)
                    fed = _reframing_head(request) + fed
            except HttpParserCallbackError as error:
                # Each way here leaves no request being parsed: nothing more to bound.
                if not isinstance(error.__context__, _Stop):
                    self.log.failure(
                        "reading a request failed", Failure(error.__context__ or error)
                    )
                    self._channel.unparsable(INTERNAL)
                elif self.parsing is None and self._channel.phase is _FINISHING:
                    # The last request is read: nothing more is ever parsed.
                    self._llhttp = None
                    return False
                return True
            except HttpParserError as error:
                self._note_method(error)
                # Only a read that began between requests shows the refused one's first word
                # (or, if requests came before it in the read, the first one's: a method).
                self._channel.unparsable(parse_refusal(error, fed if between else None))
                return True
        current = self.parsing
        if current is None or self._ended:
            return True
        # llhttp keeps a partial name or value itself, across reads: bound what it holds.
        if current is parsing:
            if current.received != received:
                current.stalled = 0
                return True
            current.stalled += len(data)
        elif current.received:
            return True
        else:
            # The request began in this read: llhttp holds at most what follows its last line end.
            current.stalled = len(data) - data.rfind(b"\n") - 1
        if current.stalled > MAX_HEAD_BYTES:
            self._channel.unparsable(FRAMING_TOO_LARGE if current.head.method else HEAD_TOO_LARGE)
        return True

    def stop(self) -> FacadeRequest | None:
        """Parse nothing more into the request in progress; it is returned, if there was one."""
        request, self.parsing = self.parsing, None
        return request

    def release(self) -> None:
        """The connection is gone: its callbacks are bound to this reader, a cycle left for the
        collector otherwise."""
        self.parsing = None
        self._llhttp = None

    @property
    def _ended(self) -> bool:
        phase = self._channel.phase
        return phase is _CLOSING or phase is _CLOSED

    def _parser(self) -> HttpRequestParser:
        """The parser whose callback is running."""
        parser = self._llhttp
        assert parser is not None
        return parser

    def _note_method(self, error: HttpParserError) -> None:
        """Keep the method of a request line llhttp stopped in: a refusal to a HEAD has no body,
        and a client would read one as the start of an answer."""
        request = self.parsing
        invalid_method = isinstance(error, HttpParserInvalidMethodError)
        if request is not None and not request.head.method and not invalid_method:
            # llhttp stores the method before it reads on.
            request.head.method = self._parser().get_method()

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.parsing is not None:
            # The head framing an upgrade offer's body (read): the request is the same.
            return
        self.parsing = self._channel.begin()

    def on_url(self, url: bytes) -> None:
        request = self.parsing
        assert request is not None
        head = request.head
        if head.method:
            return
        head.target += url
        if len(head.target) > MAX_HEAD_BYTES:
            self._channel.unparsable(HEAD_TOO_LARGE)
            raise _Stop()

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.parsing
        assert request is not None
        request.head_bytes += len(name) + len(value) + 4
        head = request.head
        if head.method:
            # A trailer field (or a field of the head framing an upgrade offer's body): dropped,
            # never merged into the headers sent on.
            if request.head_bytes > MAX_HEAD_BYTES:
                self._channel.unparsable(FRAMING_TOO_LARGE)
                raise _Stop()
            return
        if request.head_bytes + len(head.target) > MAX_HEAD_BYTES:
            self._channel.unparsable(HEAD_TOO_LARGE)
            raise _Stop()
        # RFC 9112 §5: whitespace after the value is not part of it (llhttp drops only what
        # precedes it). rstrip returns the value itself when there is none. Into the head's
        # fields directly: llhttp has refused a name that is no token and a CR or LF in a value.
        key = CANONICAL.get(name)
        if key is None:
            key = canonical(name)
        head.fields.setdefault(key, []).append(value.rstrip(b" \t"))

    def on_headers_complete(self) -> None:
        request = self.parsing
        assert request is not None
        if request.head.method:
            return
        parser = self._parser()
        request.head.method = parser.get_method()
        request.head_bytes = 0
        self._channel.head_parsed(request, http_refusal(request, parser))

    def on_body(self, data: bytes) -> None:
        request = self.parsing
        assert request is not None
        if request.refused is not None:
            request.received += len(data)
            if request.received > LINGER_BYTES and self._channel.phase is _LINGERING:
                self._channel.close()
                raise _Stop()
            return
        refusal = request.take_body(data, self._max_body, self._budget)
        if refusal is not None:
            self._channel.refuse(request, refusal)

    def on_message_complete(self) -> None:
        request = self.parsing
        assert request is not None
        if request.declared and self._parser().should_upgrade():
            # An upgrade offer with a body: llhttp took it as bodiless (see read).
            return
        self.parsing = None
        request.complete = True
        if self._channel.message_parsed(request):
            raise _Stop()
