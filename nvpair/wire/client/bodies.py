# -*- test-case-name: tests.wire.client.test_bodies -*-
"""Reading an engine's answer's body within a bound of time and of bytes.

An engine that stalls after its head, or sends without end, must not hold a reader and its
connection for ever. Every read here ends: with the body, with a failure once a bound is
passed, or on cancellation. In the last two cases the upstream connection is closed, never left
open: stopping the body's source closes it. Before the answer's head, cancelling the request's
Deferred is what closes it; :func:`fetch` bounds both phases as one.
"""

from __future__ import annotations

import math

from attrs import frozen
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from nvpair.wire.message import Answer, BodySource, Ended, ResponseHead


class BodyTooLarge(ValueError):
    """The body went past its byte bound; its connection was closed."""


class BodyTimeout(defer.TimeoutError):
    """The body did not end within its time bound; its connection was closed."""


class HeadersTimeout(defer.TimeoutError):
    """No headers within the exchange's time bound; the request was cancelled (closed)."""


@frozen
class Whole:
    """An answer read to its end: its head and its body."""

    head: ResponseHead
    body: bytes


def _delay(timeout: float | None) -> float | None:
    """A timer delay for ``timeout``; None: no time bound.

    An infinite delay would overflow the reactor's poll timeout, so it means "no bound"; NaN is
    a bug in the caller, not a bound.
    """
    if timeout is None or timeout == math.inf:
        return None
    if math.isnan(timeout):
        raise ValueError("timeout is NaN")
    return max(timeout, 0.0)


class _BoundedReader:
    """Collects (or only counts) one body, giving up past ``max_bytes`` or ``timeout``: a
    :class:`~nvpair.wire.message.BodySink`."""

    def __init__(
        self,
        source: BodySource,
        clock: IReactorTime,
        timeout: float | None,
        max_bytes: int,
        keep: bool,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative: {max_bytes}")
        delay = _delay(timeout)
        self.done: Deferred[bytes] = Deferred(self._cancelled)
        self._source = source
        self._max = max_bytes
        self._keep = keep
        self._parts: list[bytes] = []
        self._size = 0
        # Set before anything that can re-enter end (stopping the source), so the close's own
        # end of the body is never mistaken for a complete one: a body that runs to the close
        # would end "at the close", i.e. complete.
        self._settled = False
        self._timer: IDelayedCall | None = (
            clock.callLater(delay, self._expire) if delay is not None else None
        )

    # -- the body's sink -------------------------------------------------------------------

    def data(self, data: bytes) -> None:
        if self._settled:
            return
        self._size += len(data)
        if self._size > self._max:
            self._give_up(BodyTooLarge(f"body over {self._max} bytes"))
        elif self._keep:
            self._parts.append(data)

    def end(self, ended: Ended) -> None:
        if self._settled:
            return
        body = b"".join(self._parts)
        self._settle()
        if ended.complete:
            self.done.callback(body)
        else:
            error = ended.error
            self.done.errback(Failure(error if error is not None else ConnectionError(ended.how)))

    # -- ending early ----------------------------------------------------------------------

    def abort(self) -> None:
        """Close the connection without firing :attr:`done` (connecting to the body failed)."""
        self._settle()
        self._close()

    def _expire(self) -> None:
        self._timer = None
        if not self._settled:
            self._give_up(BodyTimeout("body not complete in time"))

    def _give_up(self, error: Exception) -> None:
        self._settle()
        self._close()
        self.done.errback(Failure(error))

    def _cancelled(self, _: Deferred[bytes]) -> None:
        # Deferred fails itself with CancelledError once this returns.
        self._settle()
        self._close()

    def _settle(self) -> None:
        self._settled = True
        self._parts = []
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        # A no-op once the body has ended: a connection already back in its pool is never
        # closed by a late stop.
        self._source.stop()


def _deliver(answer: Answer, reader: _BoundedReader) -> Deferred[bytes]:
    try:
        answer.body.connect(reader)
    except Exception:
        # Connected twice (a caller bug): nothing of this body will come to this reader.
        reader.abort()
        return defer.fail()
    return reader.done


def read_body(
    answer: Answer, clock: IReactorTime, timeout: float | None, max_bytes: int
) -> Deferred[bytes]:
    """The whole body of ``answer``, bounded in time and size.

    Fails with :class:`BodyTooLarge` past ``max_bytes``, :class:`BodyTimeout` after ``timeout``
    seconds (None: no time bound), or with the error that ended it; a body delimited by the
    connection's close counts as complete. Cancelling the Deferred, like either bound, closes
    the upstream connection.
    """
    return _deliver(answer, _BoundedReader(answer.body, clock, timeout, max_bytes, keep=True))


def discard_body(
    answer: Answer, clock: IReactorTime, timeout: float | None, max_bytes: int
) -> Deferred[None]:
    """Read ``answer``'s body to its end and drop it, so a keep-alive connection returns to
    the pool; past either bound (or on cancellation) close the connection instead.

    Nothing is kept in memory. Never fails: it is fire-and-forget for the caller.
    """
    d = _deliver(answer, _BoundedReader(answer.body, clock, timeout, max_bytes, keep=False))
    return d.addBoth(lambda _: None)


async def _fetch(
    sent: Deferred[Answer], clock: IReactorTime, timeout: float, max_bytes: int
) -> Whole:
    started = clock.seconds()
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        sent.cancel()

    delay = _delay(timeout)
    timer = clock.callLater(delay, expire) if delay is not None else None
    try:
        answer: Answer = await sent
    except Exception as error:
        # A cancelled request fails with CancelledError, ConnectingCancelledError or NoAnswer,
        # like other failures: expiry is recorded, not inferred.
        if expired:
            raise HeadersTimeout(f"no headers within {timeout}s") from error
        raise
    finally:
        if timer is not None and timer.active():
            timer.cancel()
    remaining = None if delay is None else delay - (clock.seconds() - started)
    body = await read_body(answer, clock, remaining, max_bytes)
    return Whole(answer.head, body)


def fetch(
    sent: Deferred[Answer], clock: IReactorTime, timeout: float, max_bytes: int
) -> Deferred[Whole]:
    """Await ``sent`` (a request's Deferred, already dispatched) and read its body, the two
    phases bounded together by ``timeout`` seconds and the body by ``max_bytes``.

    Fails with :class:`HeadersTimeout`, :class:`BodyTimeout`, :class:`BodyTooLarge` or the
    transport's error. Cancelling it, or either bound, closes the upstream connection
    whichever phase it is in (dial, awaiting headers, reading the body).
    """
    return Deferred.fromCoroutine(_fetch(sent, clock, timeout, max_bytes))
