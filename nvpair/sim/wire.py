# -*- test-case-name: tests.sim.test_sim -*-
"""The values a simulated engine's dialect works with: an incoming call, the reply it describes,
and the JSON, NDJSON and SSE framing those replies are written in.

Dialects are pure: they turn a :class:`Call` and the engine's current state into a
:class:`Reply`, or, for work that runs on the model, a :class:`Task` that decides its reply when
its turn comes. How and when a reply's bytes reach the socket (turns, delays, faults, streaming)
is the engine's job (:mod:`nvpair.sim.engine`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from nvpair.sim.memory import Memory
from nvpair.sim.promptcache import PromptCache

JSON_TYPE = "application/json; charset=utf-8"
NDJSON_TYPE = "application/x-ndjson"
SSE_TYPE = "text/event-stream"
TEXT_TYPE = "text/plain; charset=utf-8"


class RouteKind(enum.Enum):
    """Which fault knobs apply to a route: inference routes get the delay/stall/abort knobs,
    inventory (model-list) routes get the inventory knobs, the rest get none."""

    INFERENCE = "inference"
    INVENTORY = "inventory"
    OTHER = "other"


@attrs.frozen
class Call:
    """One HTTP request as a dialect sees it.

    :param method: upper-case method, e.g. ``"POST"``.
    :param path: the path without the query string.
    :param query: the raw query string (without ``?``), ``""`` when absent.
    :param headers: lower-cased header names to their values, in order received.
    :param body: the request body.
    """

    method: str
    path: str
    query: str
    headers: Mapping[str, Sequence[str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or ``None``."""
        values = self.headers.get(name.lower())
        return values[0] if values else None


@attrs.frozen
class Reply:
    """A response a dialect wants sent.

    :param status: HTTP status code.
    :param chunks: the body, in the pieces it is written in. A streamed reply writes each piece
        separately (one NDJSON line or SSE event each); a whole reply is their concatenation,
        sent with a ``Content-Length``.
    :param content_type: the ``Content-Type``, or ``None`` for none (empty bodies).
    :param headers: extra response headers.
    :param streamed: whether the body is a stream of pieces (chunked, no ``Content-Length``).
    :param slot: the slot of the engine's prompt cache (:class:`PromptCache`) the answer runs
        in, busy until the reply is delivered or abandoned (llama.cpp); None for none.
    """

    status: int
    chunks: tuple[bytes, ...] = ()
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    streamed: bool = False
    slot: int | None = None

    @property
    def body(self) -> bytes:
        """The whole body."""
        return b"".join(self.chunks)

    def with_headers(self, extra: Sequence[tuple[str, str]]) -> Reply:
        """This reply with ``extra`` headers appended."""
        if not extra:
            return self
        return attrs.evolve(self, headers=(*self.headers, *extra))


@attrs.frozen
class Task:
    """An answer that runs on the model: it takes one of the engine's parallel places, waiting
    its turn while they are all taken (:mod:`nvpair.sim.turns`). Errors never do: a dialect
    answers them with a :class:`Reply` at once, as the engines do before they queue anything.

    :param decide: the reply, asked for when the task starts (what a llama.cpp slot holds by
        then shapes it) -- or on accept, for a stream a dialect sends the headers of then
        (:attr:`Dialect.stream_headers_first`).
    :param streamed: whether that reply is a stream.
    :param pin: the slot the request asked for (llama.cpp ``id_slot``); None: any.
    """

    decide: Callable[[], Reply]
    streamed: bool
    pin: int | None = None

    @classmethod
    def of(cls, reply: Reply) -> Task:
        """A task whose reply is known already: nothing in it depends on when it starts."""
        return cls(lambda: reply, reply.streamed)


Answer = Reply | Task


class EngineView(Protocol):
    """The state of a simulated engine that a dialect reads (and, for pull/delete, changes)."""

    @property
    def models(self) -> list[str]: ...

    @property
    def node(self) -> str: ...

    @property
    def tokens(self) -> Sequence[str]: ...

    @property
    def memory(self) -> Memory:
        """Which models are in memory (the cold-start knob)."""
        ...

    @property
    def parallel(self) -> int:
        """How many requests the engine runs at once, per model (llama.cpp: its slots)."""
        ...

    @property
    def prompts(self) -> PromptCache:
        """Its slots' kept prompts and its RAM prompt cache (llama.cpp)."""
        ...

    def now(self) -> float:
        """Reactor time in seconds since the epoch."""
        ...

    def next_id(self) -> int:
        """A fresh, increasing number for response ids."""
        ...


class Dialect(Protocol):
    """What an engine dialect implements (see :mod:`nvpair.sim.ollama` and friends)."""

    def classify(self, call: Call) -> RouteKind:
        """Which fault knobs apply to ``call``."""
        ...

    def answer(self, view: EngineView, call: Call) -> Answer:
        """The engine's answer to ``call``: a reply now, or a task that runs on the model."""
        ...

    def failure(self, call: Call, status: int, message: str) -> Reply:
        """An error reply with ``status`` in the shape this dialect uses on ``call``'s route."""
        ...

    def model_for(self, view: EngineView, call: Call) -> str | None:
        """The configured model an inference ``call`` runs on, when the engine loads models on
        demand (its first request waits for the load); None otherwise."""
        ...

    @property
    def default_parallel(self) -> int:
        """How many answers the engine runs at once per model unless told otherwise."""
        ...

    @property
    def stream_headers_first(self) -> bool:
        """Whether a streamed answer sends its headers on accept, before the model is ready
        (the load then delays the first body byte rather than the headers)."""
        ...


def dumps(value: object) -> bytes:
    """Compact JSON, as Go's ``encoding/json`` and llama.cpp write it (no spaces)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_reply(status: int, value: object, *, content_type: str = JSON_TYPE) -> Reply:
    """A whole JSON reply."""
    return Reply(status, (dumps(value),), content_type)


def text_reply(status: int, text: str, *, content_type: str = TEXT_TYPE) -> Reply:
    """A whole plain-text reply."""
    return Reply(status, (text.encode("utf-8"),), content_type)


def empty_reply(status: int, headers: Sequence[tuple[str, str]] = ()) -> Reply:
    """A reply with no body and no ``Content-Type``."""
    return Reply(status, (), None, tuple(headers))


def ndjson_line(value: object) -> bytes:
    """One NDJSON record."""
    return dumps(value) + b"\n"


def sse_data(value: object) -> bytes:
    """One unnamed SSE event carrying ``value`` as JSON."""
    return b"data: " + dumps(value) + b"\n\n"


def sse_event(name: str, value: object) -> bytes:
    """One named SSE event (``event:`` line, then ``data:``)."""
    return b"event: " + name.encode("utf-8") + b"\n" + sse_data(value)


SSE_DONE = b"data: [DONE]\n\n"


@attrs.frozen
class BadJSON:
    """Why a request body is not a JSON object.

    :param reason: ``"empty"``, ``"syntax"`` or ``"not-object"``.
    :param detail: the parser's message (syntax), or the JSON type found (not-object).
    :param first: the first non-blank character of the body (``""`` when empty).
    :param line: 1-based line of a syntax error.
    :param column: 1-based column of a syntax error.
    """

    reason: str
    detail: str = ""
    first: str = ""
    line: int = 1
    column: int = 1


def parse_object(body: bytes) -> dict[str, object] | BadJSON:
    """Parse a request body that must be a JSON object."""
    text = body.decode("utf-8", "replace")
    stripped = text.strip()
    if not stripped:
        return BadJSON("empty")
    try:
        value: object = json.loads(text)
    except json.JSONDecodeError as e:
        return BadJSON("syntax", e.msg, stripped[0], e.lineno, e.colno)
    if not isinstance(value, dict):
        return BadJSON("not-object", _json_type(value), stripped[0])
    return {str(k): v for k, v in value.items()}


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "null"


def get_str(body: Mapping[str, object], key: str) -> str:
    """``body[key]`` when it is a string, else ``""``."""
    value = body.get(key)
    return value if isinstance(value, str) else ""


def get_bool(body: Mapping[str, object], key: str, default: bool) -> bool:
    """``body[key]`` when it is a boolean, else ``default``."""
    value = body.get(key)
    return value if isinstance(value, bool) else default


def get_int(body: Mapping[str, object], key: str) -> int | None:
    """``body[key]`` when it is an integer (not a bool), else ``None``."""
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def get_dict(body: Mapping[str, object], key: str) -> dict[str, object]:
    """``body[key]`` when it is an object, else ``{}``."""
    value = body.get(key)
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return {}


def include_usage(body: Mapping[str, object]) -> bool:
    """Whether an OpenAI request asked for the streamed usage chunk."""
    return get_bool(get_dict(body, "stream_options"), "include_usage", False)


Handler = Callable[[EngineView, Call], Answer]


@attrs.frozen
class Route:
    """A route's fault class and the handler answering it."""

    kind: RouteKind
    handler: Handler


class Routes:
    """A dialect's route table: exact paths, plus paths ending ``/*`` where the ``*`` stands for
    any non-empty rest (``/v1/models/*``; LM Studio ids contain ``/``)."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._prefixed: dict[str, dict[str, Route]] = {}

    def add(self, methods: str, path: str, kind: RouteKind, handler: Handler) -> None:
        """Route each of the space-separated ``methods`` on ``path`` to ``handler``."""
        table = self._prefixed if path.endswith("/*") else self._exact
        key = path[:-1] if path.endswith("/*") else path
        for method in methods.split():
            table.setdefault(key, {})[method] = Route(kind, handler)

    def _methods(self, path: str) -> dict[str, Route] | None:
        found = self._exact.get(path)
        if found is not None:
            return found
        for prefix, methods in self._prefixed.items():
            if path.startswith(prefix) and len(path) > len(prefix):
                return methods
        return None

    def find(self, method: str, path: str) -> Route | None:
        """The route for ``method`` on ``path``, if any."""
        methods = self._methods(path)
        return methods.get(method) if methods is not None else None

    def kind(self, call: Call) -> RouteKind:
        """The route class of a call; anything unrouted is "other"."""
        route = self.find(call.method, call.path)
        return route.kind if route is not None else RouteKind.OTHER

    def knows(self, path: str) -> bool:
        """Whether any method is routed on ``path``."""
        return self._methods(path) is not None
