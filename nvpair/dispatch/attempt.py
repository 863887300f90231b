"""One dispatch to one node: dial, headers, the first-body gate, and the commit/cancel claim.

An attempt ends in exactly one of two ways: it is **served** (the response becomes the
client's answer — a committed 2xx, an answer that is not retried, or the final attempt's own
status) or it **failed** in a way the loop may retry. The attempt never decides about the
request as a whole: the requester leaving cancels it from outside and propagates as
``CancelledError``, while the discovery watcher's cancellation is this attempt's own business
and comes back as a failure (docs/request-path.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

from attrs import define
from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime

from nvpair.common.deadlines import Deadline, Deadlines
from nvpair.control.state import ControlState, Discovery, Node
from nvpair.dispatch.outcome import Verdict, classify
from nvpair.dispatch.relay import BodyRelay, First
from nvpair.engines.table import ENGINES, RouteClass
from nvpair.wire.client.bodies import discard_body
from nvpair.wire.headers import is_event_stream
from nvpair.wire.message import Answer, Fields, ResponseHead
from nvpair.wire.web import UpstreamClient


class Claim(enum.Enum):
    """An attempt's single state; commit and cancel each claim it by compare-and-swap."""

    RUNNING = "running"
    COMMITTED = "committed"
    ABANDONED = "abandoned"


@define(eq=False)
class AttemptState:
    """One attempt's run: the claim commit and the discovery watcher race for, what it is
    waiting on now, and whether its header budget ran out.

    A pair of signals could not say which came first; one state, claimed once, can. The loser's
    claim returns False and it does nothing.
    """

    #: The node the attempt went to.
    node: Node
    claim: Claim = Claim.RUNNING
    #: What the attempt awaits now (the response head, then the first body byte): what the
    #: watcher or the header timer cancels.
    waiting: Deferred[Answer] | Deferred[First] | None = None
    #: The header budget ran out (a cancelled request fails with whatever the client makes of
    #: a cancel, so the reason is recorded here rather than read off the error).
    expired: bool = False
    #: The header budget's deadline, from the dial's end to the head.
    header: Deadline | None = None

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
        if self.waiting is not None:
            self.waiting.cancel()
        return True

    def watch(self, engine: str, snapshot: Discovery) -> None:
        """A discovery snapshot came: the target left it, so cancel promptly instead of waiting
        out the first-content timeout while the broker already calls the workload failed."""
        node = self.node
        if engine == node.engine and snapshot.node(node.id) is None:
            self.claim_abandon()

    def expire(self) -> None:
        self.expired = True
        if self.waiting is not None:
            self.waiting.cancel()

    def stop_timers(self) -> None:
        header, self.header = self.header, None
        if header is not None:
            header.cancel()


class Fault(enum.Enum):
    """Why a retryable attempt failed."""

    STATUS = "status"
    TRANSPORT = "transport"
    FIRST_BODY_TIMEOUT = "first-body-timeout"
    NODE_LEFT = "node-left"


#: An attempt's result as operators read it: ``/metrics``' ``result`` label and ``/status``'s
#: ``recent`` attempts (docs/operations.md#metrics, docs/operations.md#recent-workloads).
RESULTS: dict[Fault, str] = {
    Fault.STATUS: "status",
    Fault.TRANSPORT: "transport",
    Fault.FIRST_BODY_TIMEOUT: "first_body_timeout",
    Fault.NODE_LEFT: "node_left",
}
SERVED = "served"
#: Served, then cut by its engine before the body's end (docs/operations.md#recent-workloads).
TRUNCATED = "truncated"


# Served, Failed and Outgoing are made per attempt or per request: immutable as tuples
# (NamedTuple), which a frozen attrs class costs several times more to make, each field set
# through object.__setattr__ (docs/performance.md#per-dispatch-overheads).


class Served(NamedTuple):
    """The engine's answer is the client's; ``relay`` holds its body, not yet attached."""

    head: ResponseHead
    relay: BodyRelay


class Failed(NamedTuple):
    """A retryable failure: the loop moves on (or, for the final attempt, answers for it)."""

    why: Fault
    status: int | None = None
    detail: str = ""


Outcome = Served | Failed


#: A retried error body is read to its end (so the connection is reused) within these
#: bounds, and its connection closed past them: an engine's error body is small.
DISCARD_SECONDS = 10.0
DISCARD_BYTES = 1024 * 1024


class Outgoing(NamedTuple):
    """What every attempt of one request sends upstream, to whichever node (each dialled as
    its own engine's, :attr:`nvpair.control.state.Node.engine`)."""

    route: RouteClass
    method: bytes
    uri: bytes
    #: A copy of the client's end-to-end fields (:func:`nvpair.dispatch.job.outgoing_of`).
    fields: Fields
    body: bytes
    #: Whether the client may send it twice should a kept-alive connection go before any
    #: answer byte (an inference request, which the loop would dispatch again anyway).
    resend: bool = False


class Attempts:
    """Runs attempts for the request path.

    :param clock: the header and first-body timeouts.
    :param header_timeout: seconds for headers, and again for the first body byte once
        headers arrive (docs/retry-budget.md); 0 disables both.
    :param address: the base URL to dial for a node (raises when it has none).
    """

    def __init__(
        self,
        clock: IReactorTime,
        control: ControlState,
        upstream: UpstreamClient,
        header_timeout: float,
        address: Callable[[str, Node], str],
    ) -> None:
        self._clock = clock
        self._control = control
        self._upstream = upstream
        self._timeout = header_timeout
        # Every attempt's header budget on one reactor timer (docs/performance.md#timers).
        self._deadlines = Deadlines(clock, header_timeout) if header_timeout else None
        self._address = address

    def _discard(self, answer: Answer) -> None:
        """An answer that is not the client's: drained in the background, bounded."""
        discard_body(answer, self._clock, DISCARD_SECONDS, DISCARD_BYTES)

    async def run(
        self, outgoing: Outgoing, node: Node, final: bool, cancelled: Callable[[], bool]
    ) -> Outcome:
        """Send ``outgoing`` to ``node``; see the module docstring for how it ends.

        :param final: the last permitted attempt: a retryable status is then served as the
            answer (its status and body unchanged) instead of failing.
        :param cancelled: whether the request itself (the parent scope) was cancelled. A
            failure is classified by reading it, never by the exception's type: a cancelled
            dial fails with ``ConnectingCancelledError`` or ``NoAnswer``, which
            would otherwise pass for a transport error and keep a gone requester's loop going.
        """
        state = AttemptState(node)
        # A peer's request targets this node's own engine, which is no discovery entry.
        watching = outgoing.route is not RouteClass.PEER
        unsubscribe = self._control.on_discovery(state.watch) if watching else None
        # One coroutine for the whole attempt, not one awaiting another: every frame between
        # the request path and the Deferred it waits on is suspended and resumed at each wake.
        try:
            sent = self._send(outgoing, node, state)
            if isinstance(sent, Failed):
                return sent
            try:
                answer: Answer = await sent
            except Exception as error:
                if cancelled():
                    raise CancelledError() from error
                if state.abandoned():
                    return Failed(Fault.NODE_LEFT)
                if state.expired:
                    return Failed(Fault.TRANSPORT, detail="header timeout")
                return Failed(Fault.TRANSPORT, detail=type(error).__name__)
            finally:
                state.stop_timers()
            if state.abandoned():
                # The watcher fired while the headers were being delivered.
                self._discard(answer)
                return Failed(Fault.NODE_LEFT)

            head = answer.head
            verdict = classify(head.status, outgoing.route)
            if verdict is Verdict.RETRY and not final:
                self._discard(answer)
                return Failed(Fault.STATUS, status=head.status)

            relay = BodyRelay(answer.body)
            answer.body.connect(relay)
            # Every answer commits at its first body byte (or its empty body's end): one whose
            # engine died before it has relayed nothing, and fails as transport. Only an
            # inference 2xx waits under the first-body cap (docs/request-path.md#the-commit-point).
            # An event feed commits at its head: it may stay silent for minutes, and its
            # client waits for the stream to open (docs/request-path.md#event-feeds).
            if not relayed_at_head(outgoing, node, head):
                timed = verdict is Verdict.COMMIT and outgoing.route is RouteClass.INFERENCE
                failed = await self._first_byte(head, relay, state, cancelled, timed)
                if failed is not None:
                    return failed
            if not state.claim_commit():
                # A committed first byte wins the claim, so this is the watcher having won
                # before any byte: retry rather than serve a stream the proxy would truncate.
                relay.abandon()
                return Failed(Fault.NODE_LEFT)
            return Served(head, relay)
        finally:
            state.stop_timers()
            if unsubscribe is not None:
                unsubscribe()

    def _send(
        self, outgoing: Outgoing, node: Node, state: AttemptState
    ) -> Deferred[Answer] | Failed:
        """Start the exchange, with the header budget armed once the connection is up.

        Dial, headers and first content are budgets run in sequence
        (docs/retry-budget.md#per-attempt-budgets). Anything that fails while starting
        is this node's transport failure, never the request's: the loop fails over.
        """

        def connected() -> None:
            # May run before ``request`` returns (a pooled connection): ``expire`` reads
            # ``state.waiting`` only when it fires.
            if self._deadlines is not None:
                state.header = self._deadlines.add(state.expire)

        try:
            base = self._address(node.engine, node)
            sent = self._upstream.request(
                base,
                outgoing.method,
                outgoing.uri,
                outgoing.fields,
                outgoing.body,
                connected,
                outgoing.resend,
            )
        except Exception as error:
            return Failed(Fault.TRANSPORT, detail=str(error) or type(error).__name__)
        state.waiting = sent
        return sent

    async def _first_byte(
        self,
        head: ResponseHead,
        relay: BodyRelay,
        state: AttemptState,
        cancelled: Callable[[], bool],
        timed: bool,
    ) -> Failed | None:
        """Wait for the first body byte: the commit point. None once it (or EOF) came.

        :param timed: under the first-body cap (an inference 2xx); else without a bound of
            its own, as the body after it would be.

        One path whether or not the byte has come: most answers bring it with their head (a
        whole answer in one read), and awaiting a gate already open goes on at once, with no
        timer armed for it.
        """
        gate = relay.gate()
        if timed and self._timeout and not gate.called:
            gate.addTimeout(self._timeout, self._clock)
        state.waiting = gate
        try:
            await gate
        except TimeoutError:
            # Never a commit, not even on the final attempt: the caller answers 504.
            return Failed(Fault.FIRST_BODY_TIMEOUT, status=head.status)
        except CancelledError:
            relay.abandon()
            if state.abandoned() and not cancelled():
                return Failed(Fault.NODE_LEFT)
            raise
        except Exception as error:
            if cancelled():
                raise CancelledError() from error
            return Failed(Fault.TRANSPORT, detail=type(error).__name__)
        return None


def relayed_at_head(outgoing: Outgoing, node: Node, head: ResponseHead) -> bool:
    """Whether ``head`` is an event feed's, relayed at its head: a 2xx ``text/event-stream``
    answer that is not an inference answer (docs/request-path.md#event-feeds). A peer's request
    is classed by its path, as the node that sent it classed it."""
    if not 200 <= head.status < 300 or not is_event_stream(head.fields):
        return False
    route = outgoing.route
    if route is RouteClass.PEER:
        path = outgoing.uri.split(b"?", 1)[0].decode("latin-1")
        route = ENGINES[node.engine].classify(outgoing.method, path)
    return route is not RouteClass.INFERENCE
