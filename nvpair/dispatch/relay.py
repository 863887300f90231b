"""The response body relay: the first-body gate, then streaming with backpressure.

An engine's answer's body goes to a :class:`BodyRelay`, a body sink. Until the attempt commits,
the relay holds the first chunk and pauses the upstream (docs/request-path.md#the-commit-point:
the first body byte, never the headers, is evidence that generation has begun). After
:meth:`BodyRelay.attach` it splices that chunk back onto the front and streams the rest to the
client with the upstream body's flow registered as the client's producer, so a slow client slows
the engine instead of growing this process's memory.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from typing import NamedTuple

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.wire.message import End, Ended, Flow
from nvpair.wire.web import ProxiedRequest


class First(enum.Enum):
    """What ended the wait for the first body byte."""

    #: A body byte arrived: generation has begun.
    BYTE = "byte"
    #: The body ended with no bytes. Counts as a commit (docs/request-path.md#the-commit-point): an
    #: engine that answered an empty body considers the request answered.
    EMPTY = "empty"


class BodyEnd(NamedTuple):
    """How a relayed body ended (a NamedTuple: made for every answer, it is immutable for a
    fraction of a frozen attrs class's cost; docs/performance.md#per-dispatch-overheads).

    :ivar complete: the upstream finished the body cleanly.
    :ivar reason: how it ended when it did not (upstream died, client left).
    :ivar cut: the engine's connection ended before the body's end (no final chunk, a reset,
        fewer bytes than ``Content-Length``) while the client was still there: the answer
        was truncated by its node, not by its reader.
    """

    complete: bool
    reason: Ended | None = None
    cut: bool = False


class _State(enum.Enum):
    WAITING = "waiting"
    HELD = "held"
    RELAYING = "relaying"
    ABANDONED = "abandoned"


def _ignored(_: Failure) -> None:
    return None


class WriteDeadline:
    """The upstream body's flow as the client's producer, with a deadline on how long the
    client may stall (a :class:`~nvpair.wire.message.Flow` itself).

    The client's connection pauses its producer when the client stops reading; a client that
    accepts nothing for ``timeout`` seconds is dropped (``--client-write-timeout``), so a dead
    reader cannot hold an engine's stream, and the request ends as cancelled.
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_clock",
        "_expired",
        "_timeout",
        "_timer",
        "_upstream",
    )

    def __init__(
        self,
        upstream: Flow,
        clock: IReactorTime,
        timeout: float,
        expired: Callable[[], None],
    ) -> None:
        self._upstream = upstream
        self._clock = clock
        self._timeout = timeout
        self._expired = expired
        self._timer: IDelayedCall | None = None

    def pause(self) -> None:
        self._upstream.pause()
        if self._timer is None and self._timeout > 0:
            self._timer = self._clock.callLater(self._timeout, self._expire)

    def resume(self) -> None:
        self._disarm()
        self._upstream.resume()

    def stop(self, abort: bool = False) -> None:
        self._disarm()
        self._upstream.stop(abort)

    def disarm(self) -> None:
        """The body ended: a client that stopped reading can no longer hold anything."""
        self._disarm()

    def _disarm(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._expired()


class BodyRelay:
    """Receives one engine's answer's body (a :class:`~nvpair.wire.message.BodySink`:
    ``answer.body.connect(relay)``), ``source`` being that body.

    :ivar first: what opened the gate (:class:`First`), or the transport error that ended the
        body before any byte; None until one of them came. :meth:`gate` waits for it.
    :ivar done: fires with :class:`BodyEnd` once the relayed body has ended (only after
        :meth:`attach`).
    """

    # One per stream in flight: no per-instance dictionary (docs/performance.md#held-streams).
    __slots__ = (
        "_client_gone",
        "_deadline",
        "_ended",
        "_gate",
        "_guard",
        "_held",
        "_request",
        "_source",
        "_state",
        "_tap",
        "done",
        "first",
    )

    log = Logger()

    def __init__(self, source: Flow) -> None:
        self._source = source
        self._deadline: Callable[[Flow], WriteDeadline] | None = None
        self._guard: WriteDeadline | None = None
        self._tap: Callable[[bytes], None] | None = None
        self.first: First | Failure | None = None
        # Made only for a wait: most answers bring their first byte with their head, and nobody
        # waits (docs/performance.md#one-wake-per-answer).
        self._gate: Deferred[First] | None = None
        self.done: Deferred[BodyEnd] = Deferred()
        self._state = _State.WAITING
        self._held = b""
        self._ended: Ended | None = None
        self._request: ProxiedRequest | None = None
        self._client_gone = False

    # -- the body's sink -------------------------------------------------------------------

    def data(self, data: bytes) -> None:
        if self._state is _State.RELAYING:
            request = self._request
            if not self._client_gone and request is not None:
                if self._tap is not None:
                    self._tap(data)
                try:
                    request.data(data)
                except Exception:
                    self._copy_failed(Failure())
        elif self._state is _State.WAITING:
            self._held = data
            self._state = _State.HELD
            # Hold the engine where it is until the attempt decides: commit or abandon.
            self._source.pause()
            self._open(First.BYTE)
        elif self._state is _State.HELD:
            # A read being handled may deliver the rest of its bytes despite the pause.
            self._held += data

    def end(self, ended: Ended) -> None:
        if self._state is _State.WAITING:
            self._state = _State.HELD
            self._ended = ended
            self._open(First.EMPTY if ended.complete else _failure(ended))
        elif self._state is _State.HELD:
            self._ended = ended
        elif self._state is _State.RELAYING:
            self._finish(ended)

    # -- the attempt's side ----------------------------------------------------------------

    def gate(self) -> Deferred[First]:
        """Fires with :attr:`first` once it came (at once if it has), or fails with it;
        cancelling the wait (first-body timeout, watcher, requester gone) abandons the body."""
        gate = self._gate
        if gate is None:
            gate = self._gate = Deferred(self._wait_cancelled)
            if self.first is not None:
                self._fire(gate, self.first)
        return gate

    def set_deadline(self, wrap: Callable[[Flow], WriteDeadline]) -> None:
        """Wrap the upstream before it is registered as the client's producer (for a
        :class:`WriteDeadline`)."""
        self._deadline = wrap

    def set_tap(self, tap: Callable[[bytes], None]) -> None:
        """See every relayed chunk as it goes by (stats measurement); never buffers it."""
        self._tap = tap

    def attach(self, request: ProxiedRequest) -> None:
        """Commit: splice the held bytes to ``request`` and stream the rest into it.

        The caller has already written the status line and headers.
        """
        # HELD: the gate committed it. WAITING: an answer served at its head (an event feed),
        # so nothing was held and the upstream was never paused.
        assert self._state in (_State.HELD, _State.WAITING)
        if self._state is _State.WAITING:
            # Its head goes now, not with its first event (docs/request-path.md#event-feeds).
            request.data(b"")
        self._state = _State.RELAYING
        # Nobody waits on the gate once the body is being relayed; a failure it holds (the
        # body ended badly before attach) is reported by ``done`` instead.
        if self._gate is not None:
            self._gate.addErrback(_ignored)
        self._request = request
        if self._held:
            if self._tap is not None:
                self._tap(self._held)
            request.data(self._held)
            self._held = b""
        if self._ended is not None:
            self._finish(self._ended)
            return
        flow: Flow = self._source
        if self._deadline is not None:
            flow = self._guard = self._deadline(flow)
        request.follow(flow)
        self._source.resume()

    def abandon(self) -> None:
        """Drop this body without relaying it: close the upstream connection.

        Used when an attempt loses (first-body timeout, cancellation): the engine may keep
        generating (docs/request-path.md#known-limits), but nothing here waits on it.
        """
        if self._state is _State.RELAYING:
            self.client_gone()
            return
        self._state = _State.ABANDONED
        self._source.stop()

    def client_gone(self) -> None:
        """The client disconnected: stop writing, and stop the upstream (it has no reader)."""
        if self._client_gone:
            return
        self._client_gone = True
        self._source.stop()

    # -- internals -------------------------------------------------------------------------

    def _open(self, first: First | Failure) -> None:
        self.first = first
        if self._gate is not None:
            self._fire(self._gate, first)

    @staticmethod
    def _fire(gate: Deferred[First], first: First | Failure) -> None:
        if gate.called:
            return  # the wait was cancelled
        if isinstance(first, Failure):
            gate.errback(first)
        else:
            gate.callback(first)

    def _wait_cancelled(self, _: Deferred[First]) -> None:
        self.abandon()

    def _copy_failed(self, failure: Failure) -> None:
        """Copying to the client failed: close the client, stop the upstream
        (docs/request-path.md#admission).

        The upstream's end then settles :attr:`done` as incomplete, so the request's terminal
        reporting and reservation release still run.
        """
        self.log.failure("copying a response body to the client failed", failure)
        request = self._request
        assert request is not None
        self.client_gone()
        with contextlib.suppress(AttributeError, RuntimeError):
            request.follow(None)
        request.end(Ended(End.BROKEN, failure.value))

    def _finish(self, ended: Ended) -> None:
        if self.done.called:
            return
        if self._guard is not None:
            # Paused by the client when the body ended, the deadline would otherwise fire
            # on a finished request.
            self._guard.disarm()
        clean = ended.complete
        complete = clean and not self._client_gone
        request = self._request
        if not self._client_gone and request is not None:
            # The client may already be gone in ways on_lost has not reported yet; these
            # calls raise after a disconnect.
            try:
                request.follow(None)
                # The engine's end is the answer's: not whole, the answer's connection closes
                # without its end, and the client sees the truncation.
                request.end(ended)
            except (AttributeError, RuntimeError):
                pass
        cut = not clean and not self._client_gone
        self.done.callback(BodyEnd(complete, None if complete else ended, cut))


def _failure(ended: Ended) -> Failure:
    """What a body that ended before its first byte, not whole, fails the gate with."""
    error = ended.error
    return Failure(error if error is not None else ConnectionError(f"body {ended.how.value}"))
