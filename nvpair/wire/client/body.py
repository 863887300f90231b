# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""An engine's answer as the rest of the proxy sees it: a :class:`~nvpair.wire.message.Answer`,
its head and its body's :class:`~nvpair.wire.message.BodySource` (:class:`UpstreamBody`).

What reads the bytes off the socket is :mod:`nvpair.wire.client.connection`; it reaches the body
only through :meth:`UpstreamBody.data` and :meth:`UpstreamBody.end`, and a reader reaches the
connection only through the body's :class:`~nvpair.wire.message.Flow` (pause, resume, stop),
which lets go of the connection once the body has ended: a late ``stop`` never closes a
connection that went back to its pool.
"""

from __future__ import annotations

import enum

from twisted.internet.error import ConnectionDone
from twisted.python.failure import Failure

from nvpair.wire.client.framing import BadResponse, answer_head
from nvpair.wire.client.types import BodyOwner, Wire
from nvpair.wire.message import (
    AT_CLOSE,
    COMPLETE,
    Answer,
    BodySink,
    End,
    Ended,
    ResponseHead,
)


class ReadFlow:
    """Whether a connection reads its socket: a body's reader pauses and resumes it.

    A pause asked for while a read is being handled is applied once it has been: a body that
    ends in that very read needs none, and an idle connection must keep reading, or a server's
    close would go unnoticed. One per connection, for all its exchanges.

    :ivar feeding: a read is being handled now.
    :ivar paused: the socket is not being read.
    :ivar want_pause: a pause was asked for during this read.
    """

    __slots__ = ("_wire", "feeding", "paused", "want_pause")

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self.feeding = False
        self.want_pause = False
        self.paused = False

    def pause(self) -> None:
        if self.feeding:
            self.want_pause = True
        elif not self.paused:
            self.paused = True
            self._wire.pauseProducing()

    def resume(self) -> None:
        self.want_pause = False
        if self.paused:
            self.paused = False
            self._wire.resumeProducing()

    def settle(self, body_open: bool) -> None:
        """A read has been handled: apply the pause asked for during it, if a body is still
        being read."""
        if self.want_pause:
            self.want_pause = False
            if body_open and not self.paused:
                self.paused = True
                self._wire.pauseProducing()

    def hold(self) -> None:
        """Nobody reads the body yet: pause once this read is handled (as Twisted does)."""
        self.want_pause = True


class _Body(enum.Enum):
    """Where a body stands."""

    #: No sink yet: pieces are held, and the connection pauses once the read is handled.
    UNREAD = "unread"
    #: A sink is connected: pieces go to it as they come.
    FLOWING = "flowing"
    #: It ended, and a sink was told, or will be told as it connects.
    ENDED = "ended"


class UpstreamBody:
    """An engine's answer's body: the source a sink connects to (:class:`BodySource`).

    :ivar to_close: the body runs to the connection's close.
    :ivar keep_alive: the connection may carry another exchange once the body has ended.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_connection",
        "_ended",
        "_flow",
        "_held",
        "_sink",
        "_state",
        "keep_alive",
        "to_close",
    )

    def __init__(self, connection: BodyOwner, flow: ReadFlow) -> None:
        self._connection: BodyOwner | None = connection
        self._flow = flow
        self._state = _Body.UNREAD
        self._held: list[bytes] = []
        self._sink: BodySink | None = None
        self._ended: Ended | None = None
        self.to_close = False
        self.keep_alive = False

    # -- the reader's side (BodySource) ----------------------------------------------------

    def connect(self, sink: BodySink) -> None:
        """Send the body to ``sink``: what was held, and its end if it has ended, at once; the
        rest as it comes.

        :raises RuntimeError: when a sink was connected already.
        """
        ended = self._ended
        if self._state is _Body.FLOWING or (self._state is _Body.ENDED and ended is None):
            raise RuntimeError("the body has a sink already")
        held, self._held = self._held, []
        if ended is not None:
            self._ended = None
            for data in held:
                sink.data(data)
            sink.end(ended)
            return
        self._sink = sink
        self._state = _Body.FLOWING
        for data in held:
            if self._sink is not sink:
                return  # the sink stopped the body on a held piece
            sink.data(data)
        # Resuming may deliver more, or end the body, at once.
        self.resume()

    def pause(self) -> None:
        if self._connection is not None:
            self._flow.pause()

    def resume(self) -> None:
        if self._connection is not None:
            self._flow.resume()

    def stop(self, abort: bool = False) -> None:
        if self._connection is not None:
            self._connection.stop_body(abort)

    # -- the connection's side -------------------------------------------------------------

    def connected(self) -> bool:
        """Whether a sink reads the body now."""
        return self._state is _Body.FLOWING

    def data(self, data: bytes) -> None:
        """The body bytes of one read; dropped once the body has ended."""
        if self._state is _Body.FLOWING:
            assert self._sink is not None
            self._sink.data(data)
        elif self._state is _Body.UNREAD:
            self._held.append(data)

    def failed(self, error: BaseException) -> None:
        """The body cannot be read to its end (bad framing, a sink that raised)."""
        self.end(Ended(End.BROKEN, error))

    def lost(self, reason: Failure) -> None:
        """The connection went before the body's framing ended it."""
        if self.to_close and isinstance(reason.value, ConnectionDone):
            # The body ran to the close, as its framing said; only the close tells.
            self.end(AT_CLOSE)
        else:
            self.end(Ended(End.CUT, reason.value))

    def end(self, ended: Ended = COMPLETE) -> None:
        """The body ended (by its framing, unless ``ended`` says otherwise); told once."""
        if self._state is _Body.ENDED:
            return
        self._connection = None
        sink = self._sink
        self._state = _Body.ENDED
        if sink is None:
            # Nobody reads it yet: the sink that connects is told.
            self._ended = ended
            return
        self._sink = None
        sink.end(ended)


def final_answer(
    code: int,
    http: str,
    phrase: bytes,
    fields: list[tuple[bytes, bytes]],
    head: bool,
    body: UpstreamBody,
) -> Answer:
    """The answer a final (non-1xx) head makes, its body still to come.

    :param http: the version llhttp read (``"1.1"``).
    :param head: the request was a HEAD.
    :raises BadResponse: for a 101 (nothing here switches protocols), a status outside
        200-599, or a version other than HTTP/1.0 and 1.1.
    """
    if code == 101 or not 200 <= code <= 599:
        raise BadResponse(f"status {code} is not supported")
    if http != "1.1" and http != "1.0":
        raise BadResponse(f"HTTP/{http} is not supported")
    exposed, length, to_close, keep_alive = answer_head(
        fields, head, code == 204 or code == 304, http == "1.0"
    )
    body.to_close = to_close
    body.keep_alive = keep_alive
    return Answer(ResponseHead(code, phrase, exposed, length), body)
