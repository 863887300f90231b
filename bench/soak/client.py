"""One client exchange with a facade, bounded in time, classified by how it ended.

Raw :class:`~twisted.web.client.Agent`: the body arrives through a protocol of our own, so a client
can walk away after the first chunk, and nothing is buffered or decoded behind our back.
"""

from __future__ import annotations

import io
import json
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web._newclient import RequestNotSent
from twisted.web.client import (
    Agent,
    FileBodyProducer,
    HTTPConnectionPool,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from bench.soak.plan import Ending, RequestSpec

ANSWERED = "answered"
"""A status and the whole body."""
CUT = "cut mid-body"
"""A status, then the connection closed before the body ended (the proxy's clean close after
commit, e.g. when the engine died mid-stream)."""
CLOSED = "closed before status"
"""The connection closed before any status line."""
DROPPED = "client dropped mid-stream"
"""Ours: the client closed the connection after the first body bytes, as planned."""
GAVE_UP = "client gave up"
"""Ours: the client closed the connection at a random moment, as planned, before the end."""
TIMEOUT = "timeout (hang)"
"""No answer and no close within the client's timeout."""
ERROR = "client error"
"""Anything else on the client side (a refused connection to a facade, say)."""

KINDS = (ANSWERED, CUT, CLOSED, DROPPED, GAVE_UP, TIMEOUT, ERROR)


@attrs.frozen
class Outcome:
    """How one exchange ended.

    :param status: the answer's status, when one arrived.
    :param reason: its ``X-Nvpair-Error``, when it had one.
    :param detail: for failures before a status, what the client saw.
    """

    kind: str
    status: int | None = None
    reason: str | None = None
    detail: str = ""
    seconds: float = 0.0


class Clients:
    """The agents the workers share: one over a keep-alive pool, one opening a connection per
    request.

    :param reactor: IReactorTCP + IReactorTime.
    :param concurrency: idle connections kept per facade (one per worker at most).
    """

    def __init__(self, reactor: Any, concurrency: int) -> None:
        self._reactor = reactor
        self._pool = HTTPConnectionPool(reactor, persistent=True)
        self._pool.maxPersistentPerHost = concurrency
        # POSTs are never retried by the pool anyway; a GET retried behind our back would hide
        # a connection the proxy closed without an answer.
        self._pool.retryAutomatically = False
        self.pooled = Agent(reactor, pool=self._pool)
        self.fresh = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))

    def close_idle(self) -> Deferred[None]:
        """Close every idle pooled connection (before a quiet sample)."""
        d: Deferred[None] = self._pool.closeCachedConnections()
        return d


class _Reader(Protocol):
    """Reads (and counts, never keeps) a response body; can walk away after the first bytes."""

    def __init__(self, drop_after_first: bool) -> None:
        self._drop = drop_after_first
        self.done: Deferred[str] = Deferred(self._cancel)

    def dataReceived(self, data: bytes) -> None:
        if self._drop and not self.done.called:
            self.done.callback(DROPPED)
            self._stop()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.done.called:
            return
        # PotentialDataLoss: a body delimited by the connection's close, which is complete.
        self.done.callback(ANSWERED if reason.check(ResponseDone, PotentialDataLoss) else CUT)

    def _cancel(self, _: Deferred[str]) -> None:
        self._stop()

    def _stop(self) -> None:
        producer = IPushProducer(self.transport, None)
        if producer is not None:
            producer.stopProducing()  # closes the connection


_CLOSED_EARLY = (ResponseNeverReceived, RequestTransmissionFailed, RequestNotSent)


@attrs.define
class _Progress:
    status: int | None = None
    reason: str | None = None
    gave_up: bool = False
    timed_out: bool = False


async def _exchange(
    reactor: Any, agent: Agent, url: bytes, spec: RequestSpec, progress: _Progress
) -> tuple[str, str]:
    headers = Headers()
    for name, value in spec.headers:
        headers.addRawHeader(name.encode(), value.encode())
    body = FileBodyProducer(io.BytesIO(spec.body)) if spec.body is not None else None
    d: Deferred[IResponse] = agent.request(spec.method.encode(), url, headers, body)
    reader = _Reader(spec.ending is Ending.DROP_MID_STREAM)
    give_up = None
    if spec.ending is Ending.GIVE_UP:

        def walk_away() -> None:
            # Wherever the exchange is: waiting for headers (the Agent aborts the connection)
            # or reading the body (the reader closes it).
            progress.gave_up = True
            if progress.status is None:
                d.cancel()
            else:
                reader.done.cancel()

        give_up = reactor.callLater(spec.give_up_after, walk_away)
    try:
        try:
            response = await d
        except Exception as error:
            # A cancelled Agent request fails as CancelledError or wrapped in
            # ResponseNeverReceived, depending on how far it got: the flags say who cancelled.
            if progress.gave_up:
                return GAVE_UP, ""
            if progress.timed_out:
                raise
            if isinstance(error, _CLOSED_EARLY):
                return CLOSED, _reasons(error)
            if isinstance(error, ConnectError):
                return ERROR, type(error).__name__
            raise
        progress.status = response.code
        reasons = response.headers.getRawHeaders(b"x-nvpair-error")
        progress.reason = reasons[0].decode("latin-1") if reasons else None
        response.deliverBody(reader)
        try:
            return await reader.done, ""
        except CancelledError:
            if progress.gave_up:
                return GAVE_UP, ""
            raise
    finally:
        if give_up is not None and give_up.active():
            give_up.cancel()


def _reasons(error: Exception) -> str:
    inner = getattr(error, "reasons", None) or []
    names = sorted({type(f.value).__name__ for f in inner if isinstance(f, Failure)})
    return f"{type(error).__name__}({', '.join(names)})"


async def send(
    reactor: Any, clients: Clients, base: str, spec: RequestSpec, timeout: float
) -> Outcome:
    """Send ``spec`` to the facade at ``base`` and classify how it ended, within ``timeout``.

    On timeout the exchange is cancelled, which closes its connection: a hung exchange is
    counted, never left behind.
    """
    # Our own walk-aways go on a connection of their own: when the whole body arrived in one
    # read, the pool takes the connection back (the response did complete) before our close has
    # happened, and the next request handed that connection fails as if the proxy had closed it.
    walk_away = spec.ending is not Ending.READ
    agent = clients.fresh if spec.fresh_connection or walk_away else clients.pooled
    progress = _Progress()
    started = reactor.seconds()
    d = Deferred.fromCoroutine(
        _exchange(reactor, agent, (base + spec.path).encode(), spec, progress)
    )

    def expire() -> None:
        progress.timed_out = True
        d.cancel()

    # Not addTimeout: a cancelled coroutine may still return a value (the Agent's cancellation
    # surfaces as ResponseNeverReceived), so the flag, not the exception, says it timed out.
    timer = reactor.callLater(timeout, expire)
    try:
        kind, detail = await d
    except Exception as error:  # reported as a client error, never raised into the worker
        kind, detail = ERROR, repr(error)[:200]
    finally:
        if timer.active():
            timer.cancel()
    if progress.timed_out:
        kind, detail = TIMEOUT, "answer started" if progress.status is not None else "no status"
    return Outcome(kind, progress.status, progress.reason, detail, reactor.seconds() - started)


class _Collector(Protocol):
    """Keeps a small body (the admin's JSON); ``readBody`` warns on the Agent's transports."""

    def __init__(self) -> None:
        self.done: Deferred[bytes] = Deferred(lambda _: self._stop())
        self._parts: list[bytes] = []

    def dataReceived(self, data: bytes) -> None:
        self._parts.append(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if not self.done.called:
            self.done.callback(b"".join(self._parts))

    def _stop(self) -> None:
        producer = IPushProducer(self.transport, None)
        if producer is not None:
            producer.stopProducing()


async def get_json(reactor: Any, url: str, timeout: float) -> object:
    """GET ``url`` on a connection of its own; its JSON body, or None on any failure or after
    ``timeout`` seconds."""
    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))

    async def fetch() -> bytes:
        response = await agent.request(b"GET", url.encode(), Headers())
        collector = _Collector()
        response.deliverBody(collector)
        return await collector.done

    d = Deferred.fromCoroutine(fetch())
    timer = reactor.callLater(timeout, d.cancel)
    try:
        return json.loads(await d)
    except Exception:  # no answer, a cut, or not JSON: all mean "no status this time"
        return None
    finally:
        if timer.active():
            timer.cancel()
