"""One dispatch to one node: dial, headers, the first-body gate, and the commit/cancel claim.

An attempt ends in exactly one of two ways: it is **served** (the response becomes the
client's answer — a committed 2xx, an answer that is not retried, or the final attempt's own
status) or it **failed** in a way the loop may retry. The attempt never decides about the
request as a whole: the requester leaving cancels it from outside and propagates as
``CancelledError``, while the discovery watcher's cancellation is this attempt's own business
and comes back as a failure (spec §5.3).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from attrs import define, frozen
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.bodies import discard_body
from nvpair.control import ControlState, Discovery, Node
from nvpair.engines import RouteClass
from nvpair.outcome import Verdict, classify
from nvpair.relay import BodyRelay
from nvpair.upstream import Upstream


class Claim(enum.Enum):
    """An attempt's single state; commit and cancel each claim it by compare-and-swap."""

    RUNNING = "running"
    COMMITTED = "committed"
    ABANDONED = "abandoned"


@define(eq=False)
class AttemptState:
    """The claim both the commit path and the discovery watcher race for.

    A pair of signals could not say which came first; one state, claimed once, can. The loser's
    claim returns False and it does nothing.
    """

    claim: Claim = Claim.RUNNING

    def claim_commit(self) -> bool:
        if self.claim is not Claim.RUNNING:
            return False
        self.claim = Claim.COMMITTED
        return True

    def abandoned(self) -> bool:
        """Whether the watcher won (read through a method: it changes behind an await)."""
        return self.claim is Claim.ABANDONED

    def claim_abandon(self) -> bool:
        if self.claim is not Claim.RUNNING:
            return False
        self.claim = Claim.ABANDONED
        return True


class Fault(enum.Enum):
    """Why a retryable attempt failed."""

    STATUS = "status"
    TRANSPORT = "transport"
    FIRST_BODY_TIMEOUT = "first-body-timeout"
    NODE_LEFT = "node-left"


@frozen
class Served:
    """The response is the client's answer; ``relay`` holds its body, not yet attached."""

    response: IResponse
    relay: BodyRelay


@frozen
class Failed:
    """A retryable failure: the loop moves on (or, for the final attempt, answers for it)."""

    why: Fault
    status: int | None = None
    detail: str = ""


Outcome = Served | Failed


#: A retried error body is read to its end (so the connection is reused) within these
#: bounds, and its connection closed past them: an engine's error body is small.
DISCARD_SECONDS = 10.0
DISCARD_BYTES = 1024 * 1024


@frozen
class Dispatch:
    """What every attempt of one request sends."""

    engine: str
    route: RouteClass
    method: bytes
    uri: bytes
    headers: Headers
    body: bytes


class Attempts:
    """Runs attempts for the request path.

    :param clock: the header and first-body timeouts.
    :param header_timeout: seconds for headers, and again for the first body byte once
        headers arrive (spec §5.1); 0 disables both.
    :param address: the base URL to dial for a node (raises when it has none).
    """

    def __init__(
        self,
        clock: IReactorTime,
        control: ControlState,
        upstream: Upstream,
        header_timeout: float,
        address: Callable[[str, Node], str],
    ) -> None:
        self._clock = clock
        self._control = control
        self._upstream = upstream
        self._timeout = header_timeout
        self._address = address

    def _discard(self, response: IResponse) -> None:
        """A response that is not the client's answer: drained in the background, bounded."""
        discard_body(response, self._clock, DISCARD_SECONDS, DISCARD_BYTES)

    async def run(
        self, dispatch: Dispatch, node: Node, final: bool, cancelled: Callable[[], bool]
    ) -> Outcome:
        """Dispatch to ``node``; see the module docstring for how it ends.

        :param final: the last permitted attempt: a retryable status is then served as the
            answer (its status and body unchanged) instead of failing.
        :param cancelled: whether the request itself (the parent scope) was cancelled. A
            failure is classified by reading it, never by the exception's type: a cancelled
            dial fails with ``ConnectingCancelledError`` or ``ResponseNeverReceived``, which
            would otherwise pass for a transport error and keep a gone requester's loop going.
        """
        state = AttemptState()
        waiting: list[Deferred[Any]] = []

        def watch(engine: str, snapshot: Discovery) -> None:
            # The target left discovery: cancel promptly instead of waiting out the
            # first-content timeout while the broker already calls the workload failed.
            # (A peer's request targets this node's own engine, which is no discovery entry.)
            if dispatch.route is RouteClass.PEER:
                return
            if engine != dispatch.engine or snapshot.node(node.id) is not None:
                return
            if state.claim_abandon() and waiting:
                waiting[-1].cancel()

        unsubscribe = self._control.on_discovery(watch)
        try:
            return await self._run(dispatch, node, final, state, waiting, cancelled)
        finally:
            unsubscribe()

    async def _run(
        self,
        dispatch: Dispatch,
        node: Node,
        final: bool,
        state: AttemptState,
        waiting: list[Deferred[Any]],
        cancelled: Callable[[], bool],
    ) -> Outcome:
        try:
            base = self._address(dispatch.engine, node)
        except LookupError as missing:
            return Failed(Fault.TRANSPORT, detail=str(missing))
        # The header budget starts once the connection is up, not at the dial (spec §5.1:
        # dial, headers and first content run in sequence). ``connected`` may run before
        # ``request`` returns (a pooled connection), hence the holder.
        sent_holder: list[Deferred[IResponse]] = []
        timers: list[IDelayedCall] = []
        expired: list[bool] = []

        def expire() -> None:
            # Not Deferred.addTimeout: a cancelled Agent request fails with
            # ResponseNeverReceived, which addTimeout would not translate.
            expired.append(True)
            if sent_holder:
                sent_holder[0].cancel()

        def connected() -> None:
            if self._timeout:
                timers.append(self._clock.callLater(self._timeout, expire))

        try:
            sent = self._upstream.request(
                base, dispatch.method, dispatch.uri, dispatch.headers, dispatch.body, connected
            )
        except Exception as error:
            # An attempt that cannot even start is this node's transport failure, never the
            # request's: the loop fails over (docs/robustness.md).
            return Failed(Fault.TRANSPORT, detail=type(error).__name__)
        sent_holder.append(sent)
        waiting.append(sent)
        if expired:
            sent.cancel()
        try:
            response: IResponse = await sent
        except Exception as error:
            if cancelled():
                raise CancelledError() from error
            if state.abandoned():
                return Failed(Fault.NODE_LEFT)
            if expired:
                return Failed(Fault.TRANSPORT, detail="header timeout")
            return Failed(Fault.TRANSPORT, detail=type(error).__name__)
        finally:
            for timer in timers:
                if timer.active():
                    timer.cancel()
        if state.abandoned():
            # The watcher fired while the headers were being delivered.
            self._discard(response)
            return Failed(Fault.NODE_LEFT)

        verdict = classify(response.code, dispatch.route)
        if verdict is Verdict.RETRY and not final:
            self._discard(response)
            return Failed(Fault.STATUS, status=response.code)

        relay = BodyRelay()
        response.deliverBody(relay)
        # The first-body gate is scoped to inference 2xx answers (spec §5.2); an answer that is
        # not retried commits at once.
        if verdict is Verdict.COMMIT and dispatch.route is RouteClass.INFERENCE:
            gate = relay.first
            if self._timeout:
                gate.addTimeout(self._timeout, self._clock)
            waiting.append(gate)
            try:
                await gate
            except TimeoutError:
                # Never a commit, not even on the final attempt: the caller answers 504.
                return Failed(Fault.FIRST_BODY_TIMEOUT, status=response.code)
            except CancelledError:
                relay.abandon()
                if state.abandoned() and not cancelled():
                    return Failed(Fault.NODE_LEFT)
                raise
            except Exception as error:
                if cancelled():
                    raise CancelledError() from error
                return Failed(Fault.TRANSPORT, detail=type(error).__name__)
        if not state.claim_commit():
            # A committed first byte wins the claim, so this is the watcher having won before
            # any byte: retry rather than serve a stream the proxy would truncate itself.
            relay.abandon()
            return Failed(Fault.NODE_LEFT)
        return Served(response, relay)
