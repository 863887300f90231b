"""In-memory stand-ins for the request path's edges: a client request and scripted upstreams."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import define, field
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionLost, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.config import Config
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.activity import NodeActivity
from nvpair.dispatch.queueing import NO_QUEUE, FleetQueue
from nvpair.dispatch.requestpath import SERVERS, RequestPath, Server
from nvpair.dispatch.seams import NOT_COUNTED, NOT_RECORDED, PriorityScheduling, Scheduling
from nvpair.dispatch.workload import Workloads
from nvpair.engines.loadstate import UNKNOWN
from nvpair.engines.table import FACADES, RouteClass
from nvpair.facades.facade import Admitted
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.observe.metrics import Metrics
from nvpair.observe.recent import RecentWorkloads
from nvpair.service import request_bounds
from nvpair.wire.message import (
    COMPLETE,
    Answer,
    BodySink,
    End,
    Ended,
    Fields,
    Flow,
    NoAnswer,
    RequestHead,
    ResponseHead,
)


class ClientTransport:
    def __init__(self) -> None:
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True


@define(eq=False)
class Channel:
    transport: ClientTransport = field(factory=ClientTransport)


class ClientRequest:
    """Enough of a facade's request (:class:`nvpair.wire.web.ProxiedRequest`) for the request
    path: its head, and its answer as written."""

    def __init__(self, method: bytes = b"POST", path: bytes = b"/api/chat") -> None:
        self.head = RequestHead(
            method, path, fields=Fields.of({b"content-type": [b"application/json"]})
        )
        self.path = path
        #: The answer's head, once responded.
        self.answer: ResponseHead | None = None
        self.chunks: list[bytes] = []
        self.finished = False
        self.started = False
        #: How the answer ended, once it did.
        self.ended: Ended | None = None
        self.channel: Channel | None = Channel()
        self.flow: Flow | None = None
        self._lost: list[Callable[[Failure], None]] = []

    # -- what the request path calls -------------------------------------------------------

    @property
    def status(self) -> int | None:
        return None if self.answer is None else self.answer.status

    def respond(self, head: ResponseHead) -> None:
        assert not self.started
        self.answer = head

    def data(self, chunk: bytes) -> None:
        assert not self.finished
        self.started = True
        self.chunks.append(chunk)

    def end(self, ended: Ended) -> None:
        assert not self.finished
        self.ended = ended
        if ended.complete:
            self.started = True
            self.finished = True
            self._lost = []

    @property
    def connected(self) -> bool:
        return self.channel is not None

    def abort(self) -> None:
        if self.channel is not None:
            self.channel.transport.abortConnection()

    def on_lost(self, lost: Callable[[Failure], None]) -> None:
        self._lost.append(lost)

    def follow(self, flow: Flow | None) -> None:
        assert self.flow is None or flow is None
        self.flow = flow

    # -- what a test does ------------------------------------------------------------------

    def disconnect(self) -> None:
        """The client goes away."""
        self.channel = None
        waiters, self._lost = self._lost, []
        for lost in waiters:
            lost(Failure(ConnectionLost()))

    @property
    def lost(self) -> bool:
        """The answer ended without its end: the connection was closed on the client."""
        return self.ended is not None and not self.ended.complete

    # Read through methods: these change behind the test's back, and mypy would otherwise
    # narrow an attribute checked once to the value it had then.
    def aborted(self) -> bool:
        return self.channel is not None and self.channel.transport.aborted

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def fields(self) -> Fields:
        """The answer's head's fields (empty before it responded)."""
        return Fields() if self.answer is None else self.answer.fields

    def reason(self) -> str | None:
        value = self.fields().first(b"X-Nvpair-Error")
        return None if value is None else value.decode()


class UpstreamConnection:
    """What a scripted answer's body is read over: its state, as the body's flow sets it."""

    def __init__(self) -> None:
        self.state = "producing"


class Response:
    """A scripted engine answer: its head now, its body when the test says. It is its body's
    source (``connect``, ``pause``, ``resume``, ``stop``), as an upstream connection's is."""

    def __init__(
        self, code: int, body: bytes | None = None, headers: Headers | Fields | None = None
    ):
        if headers is None:
            fields = Fields.of([(b"content-type", b"application/json")])
        elif isinstance(headers, Fields):
            fields = headers
        else:
            fields = Fields.of(headers.getAllRawHeaders())
        self.head = ResponseHead(code, b"Status", fields)
        self.connection = UpstreamConnection()
        self._sink: BodySink | None = None
        self._pending = body

    @property
    def code(self) -> int:
        return self.head.status

    @property
    def headers(self) -> Fields:
        return self.head.fields

    @property
    def length(self) -> int | None:
        return self.head.length

    @length.setter
    def length(self, length: int | None) -> None:
        self.head.length = length

    @property
    def answer(self) -> Answer:
        return Answer(self.head, self)

    def connect(self, sink: BodySink) -> None:
        if self._sink is not None:
            raise RuntimeError("the body has a sink already")
        self._sink = sink
        if self._pending is not None:
            body, self._pending = self._pending, None
            if body:
                sink.data(body)
            sink.end(COMPLETE)

    def pause(self) -> None:
        self.connection.state = "paused"

    def resume(self) -> None:
        self.connection.state = "producing"

    def stop(self, abort: bool = False) -> None:
        self.connection.state = "stopped"

    def send(self, data: bytes) -> None:
        assert self._sink is not None
        self._sink.data(data)

    def end(self) -> None:
        assert self._sink is not None
        self._sink.end(COMPLETE)

    def die(self) -> None:
        assert self._sink is not None
        self._sink.end(Ended(End.CUT, ConnectionLost()))


@define(eq=False)
class Call:
    """One request the proxy sent upstream."""

    base: str
    method: bytes
    uri: bytes
    headers: Headers | Fields
    body: bytes | None
    deferred: Deferred[Answer]
    cancelled: bool = False
    #: Reports the connection up (when the upstream was told to hold dials).
    connected: Callable[[], None] = lambda: None
    #: The caller let the client send it twice (a stale kept-alive connection).
    resend: bool = False

    def answer(self, response: Response) -> Response:
        self.deferred.callback(response.answer)
        return response

    def refuse(self) -> None:
        self.deferred.errback(Failure(ConnectionRefusedError()))


class ScriptedUpstream:
    """Records every dispatch; the test answers each one."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        #: What a cancelled request fails with: nvpair.wire.client.upstream gives
        #: ConnectingCancelledError while dialling, then plain CancelledError, and a connection
        #: that went NoAnswer. The request path must judge a cancel by who cancelled, never by
        #: this (test_dispatch.py covers each).
        self.cancel_error: Exception = NoAnswer(CancelledError())
        #: False: every dial stays pending until the test calls ``call.connected()``;
        #: True: connections are up at once, as a pooled one is.
        self.connect_at_once = True

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Headers | Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        def cancel(d: Deferred[Answer]) -> None:
            # By default a cancelled request fails with NoAnswer.
            call.cancelled = True
            d.errback(self.cancel_error)

        d: Deferred[Answer] = Deferred(cancel)
        call = Call(
            base_url,
            method,
            uri,
            headers,
            body,
            d,
            connected=connected or (lambda: None),
            resend=resend,
        )
        self.calls.append(call)
        if self.connect_at_once:
            call.connected()
        return d

    def open(self) -> list[Call]:
        return [c for c in self.calls if not c.deferred.called]

    @property
    def bases(self) -> list[str]:
        return [c.base for c in self.calls]

    def close(self) -> Deferred[None]:
        return Deferred()


def node(node_id: str, *models: str) -> Node:
    return Node(node_id, False, f"http://{node_id}", models, frozenset(models))


@define(eq=False)
class Harness:
    """A RequestPath on a Clock with scripted upstreams."""

    clock: Clock
    control: ControlState
    upstream: ScriptedUpstream
    reservations: Reservations
    path: RequestPath
    events: list[tuple[str, dict[str, Any]]]
    #: Standalone fleet mode's scheduling, when the harness plays fleet mode.
    fleet: FleetScheduler | None = None

    def workload_events(self) -> list[tuple[str, dict[str, Any]]]:
        """``(method, workloadInfo)`` of every workload event so far."""
        return [(m, p["workloadInfo"]) for m, p in self.events if m.startswith("workload:")]

    def serve(
        self,
        model: str = "m",
        engine: str = "lmstudio",
        route_path: str = "/v1/chat/completions",
        method: bytes = b"POST",
        route: RouteClass | None = None,
        fields: Mapping[bytes, list[bytes]] | None = None,
    ) -> tuple[ClientRequest, Deferred[None]]:
        """A request admitted (as ``route``, else as its engine classifies it) and handed to
        the request path; ``fields``: its head's, besides ``Content-Type``."""
        eng = FACADES[engine]
        if route is None:
            route = eng.classify(method, route_path)
        request = ClientRequest(method, route_path.encode())
        request.head.fields.update(Fields.of(fields or {}))
        admitted = Admitted(
            engine=eng,
            route=route,
            method=method,
            path=route_path,
            uri=route_path.encode(),
            body=json.dumps({"model": model}).encode(),
            model=model,
            model_key=eng.model_key(model),
        )
        return request, self.path.handle(admitted, request)

    def nodes(self, *nodes: Node, engine: str = "lmstudio") -> None:
        self.control.set_discovery(engine, nodes)


def harness(
    fleet: HealthPolicy | None = None,
    recent: RecentWorkloads | None = None,
    metrics: Metrics | None = None,
    servers: Mapping[RouteClass, Server] = SERVERS,
    scheduling: Scheduling | None = None,
    queue: bool = False,
    **overrides: Any,
) -> Harness:
    """A request path on a Clock; with ``fleet``, in standalone fleet mode with that passive
    health policy; with ``recent`` and ``metrics``, recording workloads and counting requests
    there as an admin listener's process does; ``servers`` in place of the route classes' own;
    ``scheduling`` in place of the mode's; with ``queue`` (and ``fleet``), fleet mode's queue
    at its defaults (``overrides`` are :class:`~nvpair.config.Config` fields)."""
    clock = Clock()
    control = ControlState()
    upstream = ScriptedUpstream()
    reservations = Reservations()
    control.on_priority(lambda p: reservations.new_snapshot(p.generation))
    settings: dict[str, Any] = {
        "state_dir": Path("/nonexistent"),
        "response_header_timeout": 30.0,
        "retry_backoff": 1.0,
        "job_deadline": 600.0,
        "client_write_timeout": 60.0,
    }
    settings.update(overrides)
    config = Config(**settings)
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(method: str, params: dict[str, Any]) -> None:
        events.append((method, params))

    workloads = Workloads(emit, lambda: int(clock.seconds() * 1000), run_id="0123456789abcdef")
    activity = NodeActivity(clock, emit)
    scheduler = (
        None
        if fleet is None
        else FleetScheduler(clock, fleet, activity.in_flight, owner_wait=config.owner_wait)
    )
    if scheduling is None:
        scheduling = PriorityScheduling(control) if scheduler is None else scheduler
    path = RequestPath(
        clock,
        control,
        upstream,
        request_bounds(config),
        reservations,
        workloads,
        activity,
        scheduling,
        recorder=NOT_RECORDED if recent is None else recent,
        counter=NOT_COUNTED if metrics is None else metrics,
        servers=servers,
        queue=FleetQueue(clock, lambda node: UNKNOWN) if queue else NO_QUEUE,
    )
    return Harness(clock, control, upstream, reservations, path, events, scheduler)
