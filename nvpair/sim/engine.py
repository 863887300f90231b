# -*- test-case-name: tests.sim.test_sim -*-
"""A simulated engine on a real socket: :class:`SimEngine` with its :class:`Faults` knobs, the
record of what it received, and the machinery that delivers a dialect's reply over time.

The dialect (:mod:`nvpair.sim.ollama`, :mod:`~nvpair.sim.lmstudio`, :mod:`~nvpair.sim.llamacpp`)
decides *what* to answer; this module decides *when*: a model that must be loaded first
(:mod:`nvpair.sim.memory`), a turn among the ``parallel`` answers the engine runs at once
(:mod:`nvpair.sim.turns`), then header and first-byte delays, a stall, a connection killed
mid-stream, chunks spaced by ``chunk_interval``, a client going away.

An answer that waits -- for its model, for its turn -- sends nothing until it starts: llama.cpp
and Ollama write no header before the first token, LM Studio a stream's headers on accept and
its first byte when it starts. The fault knobs apply from the start on: ``header_delay`` counts
from the turn, a stall holds its place until the client goes away, a connection killed frees
it. Errors (a fault's ``status`` included) are answered at once and take no place.
"""

from __future__ import annotations

import enum
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Protocol, cast

import attrs
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import (
    IDelayedCall,
    IListeningPort,
    IReactorTCP,
    IReactorTime,
    ITCPTransport,
    ITransport,
)
from twisted.internet.protocol import ServerFactory
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET, Site

from nvpair.sim.cors import CorsPolicy, LlamaCppCors, LMStudioCors, OllamaCors, parse_origins
from nvpair.sim.generation import default_tokens
from nvpair.sim.llamacpp import LlamaCppDialect
from nvpair.sim.lmstudio import LMStudioDialect
from nvpair.sim.memory import Claim, Memory
from nvpair.sim.ollama import DEFAULT_MAX_QUEUE, MAX_QUEUE_ERROR, OllamaDialect
from nvpair.sim.promptcache import DEFAULT_CACHE_RAM_MIB, PromptCache
from nvpair.sim.turns import Turn, Turns
from nvpair.sim.wire import Answer, Call, Dialect, Reply, RouteKind, Task

DIALECTS = ("ollama", "lmstudio", "llamacpp")

CorsSetting = bool | str | Sequence[str] | None
"""The ``cors`` argument of :class:`SimEngine`, per dialect:

- ``ollama``: extra allowed origins (``OLLAMA_ORIGINS``: a list, or a comma-separated string;
  ``*`` allows all); the local origins Ollama always allows stay allowed. Default none extra.
- ``lmstudio``: ``True`` for the "Enable CORS" server setting. Default ``False``.
- ``llamacpp``: ``--cors-origins`` (a list or a comma-separated string; ``localhost`` stands for
  any loopback origin). Default ``"*"``: the ``Origin`` is reflected on every response.
"""


@attrs.define
class Faults:
    """Failure knobs, read when a request arrives (a change affects the next request, not one
    already being answered). The inference knobs shape whatever the route answers, errors
    included, from the moment it starts (an answer waiting for its model or its turn has not);
    ``stall`` wins over ``die_after_chunks``; CORS preflights and denials ignore them.

    :param status: answer every inference request at once with this status and the dialect's
        error body.
    :param header_delay: seconds before the headers of an inference answer are sent.
    :param first_byte_delay: seconds between those headers and the first body byte (streamed or
        not: a whole body is sent in one piece after the delay).
    :param stall: inference: send the headers, then nothing, keeping the connection open.
    :param die_after_chunks: streamed inference: abort the TCP connection after this many body
        chunks (``0``: right after the headers).
    :param die_after_bytes: whole (not streamed) inference: send only this many bytes of the body,
        under the full ``Content-Length``, then abort the TCP connection (``0``: right after the
        headers).
    :param reset_before_headers: inference: read the request, then abort the TCP connection
        without sending a byte (after ``header_delay``). Wins over every other inference knob.
    :param inventory_status: model-list routes answer this status with the dialect's error body.
    :param inventory_invalid: model-list routes answer 200 with a body that is not the envelope.
    :param inventory_delay: seconds before the headers of a model-list answer are sent.
    """

    status: int | None = None
    header_delay: float = 0.0
    first_byte_delay: float = 0.0
    stall: bool = False
    die_after_chunks: int | None = None
    die_after_bytes: int | None = None
    reset_before_headers: bool = False
    inventory_status: int | None = None
    inventory_invalid: bool = False
    inventory_delay: float = 0.0

    def clear(self) -> None:
        """Turn every knob off."""
        for field in attrs.fields(Faults):
            setattr(self, field.name, field.default)


@attrs.frozen
class RecordedRequest:
    """One request as the engine received it.

    :param method: e.g. ``"POST"``.
    :param path: the request target as received, query string included.
    :param headers: lower-cased header names to their values.
    :param body: the request body.
    """

    method: str
    path: str
    headers: dict[str, list[str]]
    body: bytes

    def json(self) -> object:
        """The body parsed as JSON."""
        return json.loads(self.body)


class _WebRequest(Protocol):
    """The part of ``twisted.web.server.Request`` used here, typed (Twisted's is not)."""

    method: bytes
    uri: bytes
    content: IO[bytes] | None
    requestHeaders: Headers
    responseHeaders: Headers
    defaultContentType: bytes | None
    transport: object

    def setResponseCode(self, code: int, message: bytes | None = None) -> None: ...

    def setHeader(self, name: bytes | str, value: bytes | str) -> None: ...

    def write(self, data: bytes) -> None: ...

    def finish(self) -> None: ...

    def notifyFinish(self) -> Deferred[None]: ...


def _abort(transport: object) -> None:
    """Reset the connection (RST), dropping anything not yet flushed."""
    if ITCPTransport.providedBy(transport):
        ITCPTransport(transport).abortConnection()
    elif ITransport.providedBy(transport):
        ITransport(transport).loseConnection()


def _write_head(request: _WebRequest, reply: Reply) -> None:
    request.setResponseCode(reply.status)
    if reply.content_type is not None:
        request.setHeader(b"content-type", reply.content_type.encode("latin-1"))
    for name, value in reply.headers:
        request.responseHeaders.addRawHeader(name, value.encode("latin-1"))
    if not reply.streamed:
        request.setHeader(b"content-length", str(len(reply.body)).encode("ascii"))


@attrs.frozen
class _Plan:
    """The timing of one answer, from the fault knobs that apply to its route."""

    header_delay: float = 0.0
    first_byte_delay: float = 0.0
    stall: bool = False
    die_after: int | None = None
    cut_at: int | None = None
    reset: bool = False

    @property
    def immediate(self) -> bool:
        return self == _Plan()


class _Gate(enum.Enum):
    """What of an answer waits for its model to be let into memory (:meth:`_Delivery.open`)."""

    #: Nothing: the wait, if any, is in the plan already.
    NONE = "none"
    #: The headers (Ollama holds them until the model is loaded).
    HEADERS = "headers"
    #: A stream's first byte; the headers go out on accept (LM Studio).
    BODY = "body"


class _Delivery:
    """Writes one reply to one request over time, and stops when the client goes away.

    Behind a :attr:`_Gate.HEADERS` gate the reply may be decided only when the gate opens.
    """

    def __init__(
        self,
        clock: IReactorTime,
        request: _WebRequest,
        reply: Reply | None,
        plan: _Plan,
        interval: float,
        ended: Callable[[_Delivery, bool], None],
        heads: Callable[[], None],
        gate: _Gate = _Gate.NONE,
    ) -> None:
        self._clock = clock
        self._request = request
        self._reply = reply
        self._plan = plan
        self._interval = interval
        self._ended = ended
        self._heads = heads
        self._gate = gate
        self._headers_out = False
        self._pending: IDelayedCall | None = None
        self._sent = 0
        self._done = False

    def start(self) -> None:
        # Registered before anything is written: notifyFinish after finish never fires.
        self._request.notifyFinish().addErrback(self._lost)
        if self._gate is _Gate.HEADERS:
            return
        if self._plan.header_delay > 0:
            self._later(self._plan.header_delay, self._send_headers)
        else:
            self._send_headers()

    @property
    def reply(self) -> Reply:
        assert self._reply is not None, "the gate decides the reply before anything is written"
        return self._reply

    def open(self, wait: float, reply: Reply | None = None) -> None:
        """The answer starts, its model ready ``wait`` seconds from now: the gated part goes
        on, that much later than its plan, with ``reply`` when it was decided only now."""
        if reply is not None:
            self._reply = reply
        gate, self._gate = self._gate, _Gate.NONE
        if self._done or gate is _Gate.NONE:
            return
        if gate is _Gate.HEADERS:
            self._plan = attrs.evolve(self._plan, header_delay=self._plan.header_delay + wait)
            self._later(self._plan.header_delay, self._send_headers)
            return
        self._plan = attrs.evolve(self._plan, first_byte_delay=self._plan.first_byte_delay + wait)
        if self._headers_out:
            self._later(self._plan.first_byte_delay, self._send_next)

    def cancel(self) -> None:
        """Stop writing (the engine is shutting down); the connection is aborted separately."""
        self._end(abandoned=False)

    def _later(self, delay: float, step: Callable[[], None]) -> None:
        self._pending = self._clock.callLater(delay, self._fire, step)

    def _fire(self, step: Callable[[], None]) -> None:
        self._pending = None
        step()

    def _end(self, abandoned: bool) -> None:
        if self._done:
            return
        self._done = True
        if self._pending is not None and self._pending.active():
            self._pending.cancel()
        self._pending = None
        self._ended(self, abandoned)

    def _lost(self, reason: Failure) -> None:
        # The client went away (or the connection was aborted): cancel whatever was scheduled.
        self._end(abandoned=True)

    def _send_headers(self) -> None:
        if self._plan.reset:
            # Nothing was written, so nothing can be lost by aborting at once.
            self._die()
            return
        _write_head(self._request, self.reply)
        self._request.write(b"")  # sends the headers now, before any body
        self._heads()
        self._headers_out = True
        if self._plan.stall:
            return
        if self._plan.die_after == 0 or self._plan.cut_at == 0:
            self._die_soon()
        elif self._gate is _Gate.BODY:
            pass  # the first byte waits for the model: open() goes on
        elif self._plan.first_byte_delay > 0 or self.reply.streamed:
            # Even without a delay a stream yields to the reactor between pieces.
            self._later(self._plan.first_byte_delay, self._send_next)
        else:
            self._send_next()

    def _send_next(self) -> None:
        reply = self.reply
        if self._plan.cut_at is not None:
            self._request.write(reply.body[: self._plan.cut_at])
            self._die_soon()
            return
        chunks = reply.chunks if reply.streamed else (reply.body,)
        if self._sent < len(chunks):
            self._request.write(chunks[self._sent])
            self._sent += 1
        if self._plan.die_after is not None and self._sent >= self._plan.die_after:
            self._die_soon()
        elif self._sent < len(chunks):
            self._later(self._interval, self._send_next)
        else:
            self._end(abandoned=False)
            self._request.finish()

    def _die_soon(self) -> None:
        # An abort drops whatever the transport has not flushed yet, and a write is flushed by the
        # reactor's next I/O poll -- which can come after the next timed call when the write
        # happened during I/O handling. Two turns always put a poll between write and abort.
        self._later(0, lambda: self._later(0, self._die))

    def _die(self) -> None:
        self._end(abandoned=False)
        _abort(self._request.transport)


@attrs.define(eq=False)
class _Job:
    """What one answer holds, from accept until it ends: its model in memory, its turn, the
    llama.cpp slot it runs in."""

    kind: RouteKind
    claim: Claim | None = None
    turn: Turn | None = None
    slot: int | None = None
    #: When its model is (was) ready, once let into memory.
    ready_at: float = 0.0
    #: It has its turn and its model (its wait for them is over).
    started: bool = False


class _QuietSite(Site):
    """A Site without the access log: the demo's stderr carries the listener lines only."""

    def log(self, request: object) -> None:
        pass


class _Connections(WrappingFactory[ProtocolWrapper]):
    """The site's factory, wrapped to know its open connections so they can be aborted."""

    def abort_all(self) -> None:
        for wrapper in list(self.protocols):
            if wrapper.transport is not None:
                _abort(wrapper.transport)


class _SimResource(Resource):
    isLeaf = True

    def __init__(self, render: Callable[[_WebRequest], bytes | int]) -> None:
        super().__init__()
        self._render = render

    def render(self, request: object) -> bytes | int:
        return self._render(cast(_WebRequest, request))


def _dialect(name: str) -> Dialect:
    if name == "ollama":
        return OllamaDialect()
    if name == "lmstudio":
        return LMStudioDialect()
    if name == "llamacpp":
        return LlamaCppDialect()
    raise ValueError(f"unknown dialect {name!r}; expected one of {', '.join(DIALECTS)}")


def _cors_policy(dialect: str, setting: CorsSetting) -> CorsPolicy:
    if dialect == "lmstudio":
        if setting is None or isinstance(setting, bool):
            return LMStudioCors(bool(setting))
        raise TypeError("lmstudio cors is a bool (the 'Enable CORS' setting)")
    if isinstance(setting, bool):
        raise TypeError(f"{dialect} cors is a list of origins, not a bool")
    if dialect == "ollama":
        return OllamaCors(parse_origins(setting) if setting is not None else ())
    return LlamaCppCors(parse_origins(setting) if setting is not None else ("*",))


class SimEngine:
    """A simulated Ollama, LM Studio or llama.cpp server.

    :param reactor: the reactor; its time schedules every delay and :meth:`listen` needs it to
        provide ``IReactorTCP`` as well.
    :param dialect: ``"ollama"``, ``"lmstudio"`` or ``"llamacpp"``.
    :param models: the models the engine advertises (and answers for).
    :param node: a name that appears in the generated text, so a test can tell who answered.
    :param faults: failure knobs (a fresh, all-off :class:`Faults` by default).
    :param tokens: the completion, one streamed chunk per token (default
        ``["Hello", " from", " <node>", "."]``). See :mod:`nvpair.sim.generation` for the exact
        usage figures.
    :param cors: the dialect's CORS setting, see :data:`CorsSetting`.
    :param chunk_interval: seconds between streamed chunks (0 still yields to the reactor).
    :param load_delay: seconds a model not in memory takes to load. Ollama and LM Studio load a
        model on its first request, which waits for the load (Ollama holds the headers, LM
        Studio a stream's first byte); llama.cpp loads its one model when it starts listening,
        answering 503 ``Loading model`` everywhere meanwhile.
    :param keep_alive: seconds a model stays in memory after its last request ends (Ollama's
        ``keep_alive``, LM Studio's idle TTL); None keeps it for good. llama.cpp never unloads.
    :param warm: the models in memory at the start (default: every model, or the first
        ``max_loaded``), so a cold start is ``warm=()``.
    :param parallel: answers the engine runs at once, per model; the rest wait their turn in
        order, unbounded (:mod:`nvpair.sim.turns`). llama.cpp: its slots (``-np``; ``/slots``
        lists them, each keeping a prompt, :mod:`nvpair.sim.promptcache`), default 4 as
        ``-np auto``. Ollama: ``OLLAMA_NUM_PARALLEL``, default 1. LM Studio: Max Concurrent
        Predictions, default 4.
    :param max_queue: Ollama's ``OLLAMA_MAX_QUEUE`` (default 512): requests for models not
        in memory that may wait in its scheduler's queue; one more is answered 503 (None: no
        bound). The other dialects ignore it.
    :param cache_ram: llama.cpp's RAM prompt cache in MiB (``--cache-ram``): 0 off, -1
        unbounded; the other dialects ignore it.
    :param max_loaded: how many models may be in memory at once (Ollama's
        ``OLLAMA_MAX_LOADED_MODELS``, and in practice its GPU's memory); None: any number.
        Loading one more evicts a model first, by Ollama's rules (:mod:`nvpair.sim.memory`),
        and ``/api/ps`` (LM Studio: ``state``) shows it gone. llama.cpp serves its one model.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        dialect: str,
        *,
        models: Sequence[str],
        node: str = "sim",
        faults: Faults | None = None,
        tokens: Sequence[str] | None = None,
        cors: CorsSetting = None,
        chunk_interval: float = 0.0,
        load_delay: float = 0.0,
        keep_alive: float | None = None,
        warm: Iterable[str] | None = None,
        parallel: int | None = None,
        max_loaded: int | None = None,
        cache_ram: int = DEFAULT_CACHE_RAM_MIB,
        max_queue: int | None = DEFAULT_MAX_QUEUE,
    ) -> None:
        self._reactor = reactor
        self._impl = _dialect(dialect)
        self._cors = _cors_policy(dialect, cors)
        self.dialect = dialect
        self.node = node
        self.models: list[str] = list(models)
        self.faults = faults if faults is not None else Faults()
        self.tokens: list[str] = list(tokens) if tokens is not None else list(default_tokens(node))
        self.chunk_interval = chunk_interval
        single = dialect == "llamacpp"
        cap = None if single else max_loaded
        self._memory = Memory(
            reactor,
            load_delay,
            None if single else keep_alive,
            self.models[:cap] if warm is None else warm,
            cap,
            max_queue if dialect == "ollama" else None,
        )
        if parallel is None:
            parallel = self._impl.default_parallel
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self._parallel = parallel
        self._prompts = PromptCache(parallel, cache_ram)
        pins = (lambda slot: not self._prompts.busy(slot)) if single else None
        self._turns = Turns(parallel, pins)
        self.requests: list[RecordedRequest] = []
        self.abandoned = 0
        """How many answers the client abandoned (disconnected) before they were complete."""
        self.headers_sent = 0
        """How many answers have had their status line and headers written (any route)."""
        self.refused = 0
        """How many requests Ollama's full scheduler queue answered 503 (``max_queue``)."""
        self._ids = itertools.count(1)
        self._deliveries: dict[_Delivery, _Job] = {}
        self._resource = _SimResource(self._render)
        self._connections = _Connections(_QuietSite(self._resource, reactor=reactor))
        self._listening: IListeningPort | None = None
        self._port = 0
        self._interface = "127.0.0.1"

    # -- EngineView (what the dialects read) ---------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Inference answers not yet complete: waiting, delayed, streaming or stalled."""
        return sum(1 for job in self._deliveries.values() if job.kind is RouteKind.INFERENCE)

    @property
    def queued(self) -> int:
        """Inference answers waiting to start: for their model (to be let into memory) or for
        their turn."""
        return sum(
            1
            for job in self._deliveries.values()
            if job.kind is RouteKind.INFERENCE and not job.started
        )

    @property
    def running(self) -> int:
        """Answers holding one of the ``parallel`` places (llama.cpp: busy slots)."""
        return self._turns.running()

    @property
    def memory(self) -> Memory:
        """Which models are in memory; :meth:`Memory.unload` makes the next request cold."""
        return self._memory

    @property
    def parallel(self) -> int:
        """Answers run at once, per model (llama.cpp: its slots)."""
        return self._parallel

    @property
    def prompts(self) -> PromptCache:
        """The slots' kept prompts and the RAM prompt cache (llama.cpp)."""
        return self._prompts

    def now(self) -> float:
        return self._reactor.seconds()

    def next_id(self) -> int:
        return next(self._ids)

    # -- serving -------------------------------------------------------------------------------

    def resource(self) -> IResource:
        """The engine as a ``twisted.web`` resource (for ``StubTreq`` or a Site of your own)."""
        return self._resource

    def listen(self, port: int = 0, interface: str = "127.0.0.1") -> int:
        """Start listening; returns the port actually bound."""
        if self._listening is not None:
            raise RuntimeError(f"{self.dialect} sim {self.node} is already listening")
        # Twisted's Factory generic is invariant, so even a plain Site fails listenTCP's check.
        factory = cast(ServerFactory, self._connections)
        self._listening = IReactorTCP(self._reactor).listenTCP(port, factory, interface=interface)
        address = self._listening.getHost()
        assert isinstance(address, IPv4Address | IPv6Address)
        self._port, self._interface = address.port, interface
        if (
            self.dialect == "llamacpp"
            and self.models
            and not self._memory.in_memory(self.models[0])
        ):
            # llama-server loads its model as it starts, serving nothing meanwhile.
            self._memory.load(self.models[0])
        return self._port

    def refuse(self) -> Deferred[None]:
        """Stop listening (new connections are refused) and abort every open connection.

        The Deferred fires once the listening socket is closed.
        """
        listening, self._listening = self._listening, None
        self._cut()
        if listening is None:
            return succeed(None)
        return maybeDeferred(listening.stopListening).addCallback(lambda _: None)

    def resume(self) -> int:
        """Listen again on the same port and interface; returns the port."""
        if self._listening is not None:
            return self._port
        if not self._port:
            raise RuntimeError("resume() needs an earlier listen()")
        return self.listen(self._port, self._interface)

    def drop_connections(self) -> None:
        """Abort every open connection but keep listening: a client's pooled keep-alive
        connections go away (and whatever was being answered on them is cut)."""
        self._cut()

    def _cut(self) -> None:
        # The waiting go first: an answer cut frees its turn, which no waiter may take now.
        self._turns.clear()
        for delivery in list(self._deliveries):
            delivery.cancel()
        self._connections.abort_all()

    def stop(self) -> Deferred[None]:
        """Stop listening and abort open connections (test teardown); safe to call twice."""
        # Closed after the cut: requests ending may set the queue going, and a timer with it.
        stopped = self.refuse()
        self._memory.close()
        return stopped

    @property
    def listening(self) -> bool:
        """Whether it accepts connections now (listened, and not refused since)."""
        return self._listening is not None

    @property
    def port(self) -> int:
        """The port last listened on (0 before :meth:`listen`)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://<interface>:<port>``."""
        host = f"[{self._interface}]" if ":" in self._interface else self._interface
        return f"http://{host}:{self._port}"

    # -- answering -----------------------------------------------------------------------------

    def _render(self, request: _WebRequest) -> bytes | int:
        call = self._record(request)
        # Our replies say what they are; never let twisted.web call a body text/html.
        request.defaultContentType = None
        cors = self._cors.decide(call)
        if cors.answer is not None:
            return self._send_now(request, cors.answer)
        kind = self._impl.classify(call)
        faults = attrs.evolve(self.faults)  # knobs as they were when the request arrived
        answer = self._reply(call, kind, faults)
        model = self._model(call, kind, faults, answer)
        if model is not None and self._memory.refuses(model):
            # Ollama's scheduler queue is full: refused before anything is scheduled.
            self.refused += 1
            answer, model = self._impl.failure(call, 503, MAX_QUEUE_ERROR), None
        if isinstance(answer, Task):
            return self._run(request, kind, faults, answer, model, cors.headers)
        reply = answer.with_headers(cors.headers)
        plan = _plan(kind, faults, reply.streamed)
        claim = None if model is None else self._memory.claim(model)
        body_first = reply.streamed and self._impl.stream_headers_first
        gate = _Gate.NONE
        if claim is not None and claim.wait is None:
            # Waiting for room in memory: how long is known once it is let in.
            gate = _Gate.BODY if body_first else _Gate.HEADERS
        elif claim is not None and claim.wait:
            plan = _later_by(plan, claim.wait, body_first)
        if plan.immediate and not reply.streamed and gate is _Gate.NONE:
            if claim is not None:
                self._memory.release(claim)
            return self._send_now(request, reply)
        job = _Job(kind, claim, started=gate is _Gate.NONE)
        delivery = self._deliver(request, reply, plan, gate, job)
        if claim is not None and gate is not _Gate.NONE:
            claim.admitted = lambda wait: self._admitted(delivery, job, wait)
        return NOT_DONE_YET

    def _run(
        self,
        request: _WebRequest,
        kind: RouteKind,
        faults: Faults,
        task: Task,
        model: str | None,
        cors: Sequence[tuple[str, str]],
    ) -> bytes | int:
        """An answer that runs on the model: its model in memory, then its turn, then the
        reply, decided when it starts."""
        plan = _plan(kind, faults, task.streamed)
        claim = None if model is None else self._memory.claim(model)
        job = _Job(kind, claim)
        wait = 0.0 if claim is None else claim.wait
        if wait is not None:
            job.ready_at = self.now() + wait
            job.turn = self._turns.take(model or "", task.pin)
        if job.turn is not None and job.turn.running:
            # It starts now, as it would have before there were turns.
            job.started = True
            reply = self._decide(task, cors, job)
            load = max(0.0, job.ready_at - self.now())
            if plan.immediate and not reply.streamed and not load:
                self._end(job)
                return self._send_now(request, reply)
            plan = _later_by(plan, load, reply.streamed and self._impl.stream_headers_first)
            self._deliver(request, reply, plan, _Gate.NONE, job)
            return NOT_DONE_YET
        body_first = task.streamed and self._impl.stream_headers_first
        # A stream whose headers go out on accept needs its reply now; the rest is decided
        # when it starts.
        early = self._decide(task, cors, job) if body_first else None
        gate = _Gate.BODY if body_first else _Gate.HEADERS
        delivery = self._deliver(request, early, plan, gate, job)

        def start() -> None:
            job.started = True
            reply = early if early is not None else self._decide(task, cors, job)
            delivery.open(max(0.0, job.ready_at - self.now()), reply)

        if job.turn is not None:
            job.turn.started = start
        else:
            assert claim is not None

            def admitted(wait: float) -> None:
                job.ready_at = self.now() + wait
                job.turn = self._turns.take(model or "", task.pin)
                if job.turn.running:
                    start()
                else:
                    job.turn.started = start

            claim.admitted = admitted
        return NOT_DONE_YET

    def _decide(self, task: Task, cors: Sequence[tuple[str, str]], job: _Job) -> Reply:
        reply = task.decide().with_headers(cors)
        job.slot = reply.slot
        return reply

    def _deliver(
        self, request: _WebRequest, reply: Reply | None, plan: _Plan, gate: _Gate, job: _Job
    ) -> _Delivery:
        delivery = _Delivery(
            self._reactor,
            request,
            reply,
            plan,
            self.chunk_interval,
            self._delivery_ended,
            self._headers_written,
            gate,
        )
        self._deliveries[delivery] = job
        delivery.start()
        return delivery

    def _admitted(self, delivery: _Delivery, job: _Job, wait: float) -> None:
        """A reply that waited for room in memory (no turn to wait for) goes on."""
        job.started = True
        delivery.open(wait)

    def _model(self, call: Call, kind: RouteKind, faults: Faults, answer: Answer) -> str | None:
        """The model an inference answer runs on, when the engine loads models on demand."""
        if kind is not RouteKind.INFERENCE or faults.status is not None:
            return None
        if isinstance(answer, Reply) and answer.status >= 400:
            return None
        return self._impl.model_for(self, call)

    def _reply(self, call: Call, kind: RouteKind, faults: Faults) -> Answer:
        if kind is RouteKind.INFERENCE and faults.status is not None:
            message = f"simulated failure on {self.node} (HTTP {faults.status})"
            return self._impl.failure(call, faults.status, message)
        if kind is RouteKind.INVENTORY and faults.inventory_status is not None:
            status = faults.inventory_status
            message = f"simulated model-list failure on {self.node} (HTTP {status})"
            return self._impl.failure(call, status, message)
        if kind is RouteKind.INVENTORY and faults.inventory_invalid:
            return Reply(200, (b"not json",), "application/json; charset=utf-8")
        return self._impl.answer(self, call)

    def _send_now(self, request: _WebRequest, reply: Reply) -> bytes:
        _write_head(request, reply)
        self._headers_written()
        # HEAD keeps the Content-Length of the GET body but sends none (twisted.web would only
        # log a warning and drop it).
        return b"" if request.method == b"HEAD" else reply.body

    def _headers_written(self) -> None:
        self.headers_sent += 1

    def _delivery_ended(self, delivery: _Delivery, abandoned: bool) -> None:
        job = self._deliveries.pop(delivery, None)
        if job is not None:
            self._end(job)
        if abandoned:
            self.abandoned += 1

    def _end(self, job: _Job) -> None:
        """Give back what an answer held: its slot first, so that a waiter that asked for it
        finds it idle, then its turn (the next one may start), then its model."""
        if job.slot is not None:
            self._prompts.release(job.slot)
        if job.turn is not None:
            self._turns.end(job.turn, job.slot)
        if job.claim is not None:
            self._memory.release(job.claim)

    def _record(self, request: _WebRequest) -> Call:
        target = request.uri.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, list[str]] = {}
        for name, values in request.requestHeaders.getAllRawHeaders():
            headers.setdefault(name.decode("latin-1").lower(), []).extend(
                v.decode("latin-1") for v in values
            )
        body = b""
        if request.content is not None:
            request.content.seek(0)
            body = request.content.read()
        method = request.method.decode("ascii", "replace")
        self.requests.append(RecordedRequest(method, target, headers, body))
        return Call(method, path, query, headers, body)


def _plan(kind: RouteKind, faults: Faults, streamed: bool) -> _Plan:
    if kind is RouteKind.INFERENCE:
        return _Plan(
            header_delay=faults.header_delay,
            first_byte_delay=faults.first_byte_delay,
            stall=faults.stall,
            die_after=faults.die_after_chunks if streamed else None,
            cut_at=None if streamed else faults.die_after_bytes,
            reset=faults.reset_before_headers,
        )
    if kind is RouteKind.INVENTORY:
        return _Plan(header_delay=faults.inventory_delay)
    return _Plan()


def _later_by(plan: _Plan, wait: float, body_first: bool) -> _Plan:
    """``plan`` with a known wait for the model before it: the headers wait, or for a stream
    whose headers go out on accept, its first byte."""
    if not wait:
        return plan
    if body_first:
        return attrs.evolve(plan, first_byte_delay=plan.first_byte_delay + wait)
    return attrs.evolve(plan, header_delay=plan.header_delay + wait)
