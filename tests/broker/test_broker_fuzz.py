"""Fuzzing the broker link: the real BrokerProtocol over the real BrokerMethods: nothing a broker
sends can crash the process or a facade (docs/robustness.md#the-broker-link).

Every example drives a fresh stack (control state, facades on a MemoryReactor, a temp state dir,
the JSON log observer) over a StringTransport, and checks:

- no exception reaches the test;
- nothing is logged as a failure: with the real methods, every log.failure record is a bug;
- every output frame is one newline-terminated line of UTF-8 JSON-RPC 2.0;
- every request with a usable id gets exactly one answer carrying that id, and none is -32603;
- control state stays valid (finite loads, unique node ids, dialable URLs) and the link still
  serves a well-formed request afterwards.

``NVPAIR_FUZZ_EXAMPLES`` raises the example count for a longer soak.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from attrs import frozen
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from twisted.logger import LogLevel, globalLogPublisher
from twisted.python.failure import Failure

from nvpair.broker.addressing import FACADE_SCOPED, resolve_address
from nvpair.broker.envelope import RpcError
from nvpair.broker.framing import MAX_LINE
from nvpair.broker.methods import MAX_GENERATION
from nvpair.common.logs import LogObserver, debug_enabled
from nvpair.control.state import PriorityEntry
from nvpair.engines.table import ENGINES
from nvpair.observe.status import FacadeView, status_document
from tests.broker.test_rpc import TAKEN_PORT, Stack, build_stack

EXAMPLES = int(os.environ.get("NVPAIR_FUZZ_EXAMPLES", "250"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- the harness -----------------------------------------------------------------------------


@contextmanager
def fuzz_stack() -> Iterator[Stack]:
    """A fresh stack whose JSON log sees every event published while it is in use."""
    was_debug = debug_enabled()
    with tempfile.TemporaryDirectory() as state_dir:
        stack = build_stack(Path(state_dir))
        globalLogPublisher.addObserver(stack.observer)
        try:
            yield stack
        finally:
            globalLogPublisher.removeObserver(stack.observer)
            # log/set-level flips the process-wide debug gate; put it back for other tests.
            LogObserver(io.StringIO(), LogLevel.debug if was_debug else LogLevel.info)


def feed(stack: Stack, chunks: Iterable[bytes], eof: bool = False) -> None:
    for chunk in chunks:
        stack.protocol.dataReceived(chunk)
    if eof:
        stack.protocol.readConnectionLost()


def _refuse_constant(name: str) -> object:
    raise AssertionError(f"{name} in an output frame")


def output_frames(stack: Stack) -> list[dict[str, Any]]:
    """Every frame written so far, each checked to be one line of JSON-RPC 2.0."""
    raw = stack.transport.value()
    assert raw == b"" or raw.endswith(b"\n")
    frames = []
    for line in raw.split(b"\n")[:-1]:
        frame = json.loads(line.decode("utf-8"), parse_constant=_refuse_constant)
        assert isinstance(frame, dict) and frame.get("jsonrpc") == "2.0", frame
        if "method" in frame:
            # The proxy's own notification or request.
            assert set(frame) <= {"jsonrpc", "method", "params", "id"}, frame
            assert isinstance(frame["method"], str) and isinstance(frame["params"], dict)
            assert "id" not in frame or type(frame["id"]) is int
        else:
            assert set(frame) in ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"}), frame
            request_id = frame["id"]
            assert request_id is None or type(request_id) in (int, str), frame
            if "error" in frame:
                error = frame["error"]
                assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}
                assert type(error["code"]) is int and isinstance(error["message"], str)
                assert "data" not in error or isinstance(error["data"], dict)
        frames.append(frame)
    return frames


def answers(frames: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [frame for frame in frames if "method" not in frame]


def id_key(request_id: object) -> str:
    return json.dumps(request_id)


def assert_no_failure_logged(stack: Stack) -> None:
    records = [json.loads(line) for line in stack.log.getvalue().splitlines()]
    failures = [record for record in records if "stack" in record]
    assert failures == [], failures[0]["stack"]


def assert_control_valid(stack: Stack) -> None:
    control = stack.control
    for engine in ENGINES:
        nodes = control.discovery(engine).nodes
        ids = [node.id for node in nodes]
        assert all(isinstance(node_id, str) and node_id for node_id in ids)
        assert len(set(ids)) == len(ids)
        for node in nodes:
            assert node.local or node.url is not None
            assert all(isinstance(model, str) for model in node.models)
            if node.url is not None:
                parts = urlsplit(node.url)
                assert parts.scheme in ("http", "https") and parts.hostname
                assert parts.port is None or 0 < parts.port <= 65535
                if parts.scheme == "https":
                    # The pin lookup of a peer connection reads every https URL's port.
                    control.node_for_address(parts.hostname, parts.port or 443)
        pin = control.pin(engine)
        assert pin is None or (isinstance(pin, str) and pin)
        backend = control.local_backend(engine)
        if backend is not None:
            parts = urlsplit(backend)
            assert parts.scheme == "http" and parts.hostname
            assert parts.port is None or 0 < parts.port <= 65535
    priority = control.priority
    assert 0 <= priority.generation <= MAX_GENERATION
    entries = priority.entries or ()
    assert len({entry.id for entry in entries}) == len(entries)
    for entry in entries:
        assert isinstance(entry.id, str) and entry.id
        assert math.isfinite(entry.pending) and entry.pending >= 0
        assert math.isfinite(entry.gpu_pressure) and entry.gpu_pressure >= 0
    # What the admin listener would show of it, every engine's nodes included: plain JSON,
    # whatever the broker sent.
    views = {engine: FacadeView(1, (), False) for engine in ENGINES}
    status = status_document(views, control, {}, lambda engine, node: 0, 0, None, 0.0)
    json.dumps(status, allow_nan=False).encode("utf-8")
    assert all(1 <= live.port <= 65535 for live in stack.facades.facades.values())


def assert_still_serves(stack: Stack) -> None:
    """After the fuzz input, a well-formed request is served and applied."""
    stack.protocol.dataReceived(b"\n")  # ends whatever partial line the input left
    stack.transport.clear()
    generation = stack.control.priority.generation
    if generation < MAX_GENERATION:
        params = {"generation": generation + 1, "nodes": [{"id": "p", "pending": 1}]}
        answer = stack.request("node/set-priority", params)
        assert answer == {"jsonrpc": "2.0", "id": "q", "result": {}}
        assert stack.control.priority.entries == (PriorityEntry("p", 1.0, 0.0),)
    answer = stack.request("log/set-level", {"level": "info"})
    assert answer == {"jsonrpc": "2.0", "id": "q", "result": {}}


def chunked(stream: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = sorted(cuts)
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


# -- JSON with things json.dumps will not write ----------------------------------------------


@frozen
class Raw:
    """JSON text put into a line verbatim; ``poison``: no line containing it can parse."""

    text: str
    poison: bool


RAW = st.sampled_from(
    [
        Raw("1e400", False),  # valid JSON; Python reads it as inf
        Raw("-1e400", False),
        Raw("1E+308", False),
        Raw("5e-324", False),
        Raw("-0", False),
        Raw("1" * 4000, False),  # under Python's int digit limit (4300)
        Raw("1" * 5000, True),  # over it: json.loads raises ValueError
        Raw("1" + "0" * 400, False),  # an integer beyond any float
        Raw("NaN", True),
        Raw("Infinity", True),
        Raw("-Infinity", True),
        Raw('"\\ud800"', True),  # lone surrogates: no UTF-8 form
        Raw('"x\\udfff"', True),
        Raw('"\\ud83d\\ude00"', False),  # a valid pair: one character
        Raw('"\\u0000"', False),
        Raw("[" * 20 + "]" * 20, False),
        Raw('{"a":' * 20 + "1" + "}" * 20, False),
        Raw("[" * 5000 + "]" * 5000, True),  # past the recursion limit
        Raw('{"a":' * 3000 + "1" + "}" * 3000, True),
    ]
)


def emit(value: object, ascii_only: bool) -> tuple[str, bool]:
    """JSON text for ``value`` (Raw pieces verbatim) and whether it can no longer parse."""
    parts: list[str] = []
    poison = False

    def walk(item: object) -> None:
        nonlocal poison
        if isinstance(item, Raw):
            parts.append(item.text)
            poison = poison or item.poison
        elif item is None or isinstance(item, bool):
            parts.append(json.dumps(item))
        elif isinstance(item, int):
            parts.append(str(item))
        elif isinstance(item, float):
            parts.append(json.dumps(item))  # NaN and Infinity come out as such literals
            poison = poison or not math.isfinite(item)
        elif isinstance(item, str):
            parts.append(json.dumps(item, ensure_ascii=ascii_only))
        elif isinstance(item, list):
            parts.append("[")
            for index, element in enumerate(item):
                parts.append("," if index else "")
                walk(element)
            parts.append("]")
        else:
            assert isinstance(item, dict)
            parts.append("{")
            for index, (key, element) in enumerate(item.items()):
                parts.append(
                    ("," if index else "") + json.dumps(key, ensure_ascii=ascii_only) + ":"
                )
                walk(element)
            parts.append("}")

    walk(value)
    return "".join(parts), poison


# -- strategies ------------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Choose among strategies by weight. (one_of drops repeated strategies, and a drawn
    st.integers(0, 9) is 0 far more often than one time in ten.)"""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(pool).flatmap(lambda strategy: strategy)


def chance(numerator: int, denominator: int) -> st.SearchStrategy[bool]:
    return st.sampled_from([True] * numerator + [False] * (denominator - numerator))


LONG_STRINGS = st.sampled_from(["x" * 70_000, "\x00" * 8, "\u00e9" * 500, " ", "", "\u2028"])

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70_000),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    RAW,
    LONG_STRINGS,
)

JUNK = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)

PROCESS_METHODS = [
    "facade/enable",
    "node/set-priority",
    "log/set-level",
    "workload:submitted",
    "workload:started",
    "workload:completed",
    "workload:errored",
    "discovery:node-activity",
]

#: The facade methods this process serves, addressed; drawn often, since only these reach the
#: facade handlers (and only once their facade is enabled).
SERVED = st.builds(
    lambda engine, method: f"{engine}:{method}",
    st.sampled_from(sorted(ENGINES)),
    st.sampled_from(
        ["discovery:nodes"] * 3 + ["node/select", "node/set-local-backend", "set-port"]
    ),
)

HANDLED = st.sampled_from(["node/set-priority", "facade/enable", "log/set-level"])

METHODS = weighted(
    (6, SERVED),
    (4, HANDLED),
    (1, st.sampled_from(PROCESS_METHODS)),
    (
        1,
        st.builds(
            lambda engine, method: f"{engine}:{method}",
            st.sampled_from(sorted(ENGINES)),
            st.sampled_from(sorted(FACADE_SCOPED) + PROCESS_METHODS + ["nope"]),
        ),
    ),
    (1, st.sampled_from(sorted(FACADE_SCOPED))),  # unaddressed: -32004
    (1, st.sampled_from(["", ":", "ollama:", "vllm:ready", "errors:report", "OLLAMA:ready"])),
    (1, st.text(max_size=16)),
)

IDS = weighted(
    (6, st.one_of(st.integers(-3, 5), st.integers(), st.text(max_size=8))),
    (1, st.none()),
    (
        2,
        st.one_of(
            st.booleans(),
            st.floats(),
            RAW,
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
        ),
    ),
)


def some(element: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A short list, seldom empty (an empty snapshot stores nothing worth checking)."""
    return weighted((1, st.just([])), (5, st.lists(element, min_size=1, max_size=4)))


NODE_IDS = st.one_of(
    st.sampled_from(["a", "b", "local", "11111111-1111-1111-1111-111111111111"]),
    st.text(min_size=1, max_size=8),
)

GOOD_URLS = st.sampled_from(
    [
        "http://127.0.0.1:21434",
        "https://192.168.1.7:11434",
        "https://[::1]:8443",
        "https://h",
        "http://h:1/prefix",
    ]
)

PORTS = st.one_of(
    st.sampled_from([0, 1, 1234, 8080, 11434, 11435, 11500, TAKEN_PORT, 65535]),
    st.integers(0, 65535),
)

MODELS = st.lists(
    st.one_of(
        st.sampled_from(["llama3:latest", "qwen2:7b", "Llama3", "library/llama3", "a/b/c:d"]),
        st.text(max_size=10),
    ),
    max_size=3,
)

#: Well-typed params per (unaddressed) method name; :func:`params_for` breaks them.
GOOD: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "facade/enable": st.fixed_dictionaries(
        {"engine": st.sampled_from(sorted(ENGINES))},
        optional={
            "port": PORTS,
            "aliases": st.lists(
                st.sampled_from(["127.0.0.1:11434", "[::1]:11434", f"127.0.0.1:{TAKEN_PORT}"]),
                max_size=2,
            ),
            "ignorePersistedPort": st.booleans(),
        },
    ),
    "node/set-priority": st.fixed_dictionaries(
        {
            "generation": st.integers(1, 20),
            "nodes": some(
                st.fixed_dictionaries(
                    {"id": NODE_IDS},
                    optional={
                        "pending": st.one_of(st.integers(0, 5), st.floats(0, 10)),
                        "gpuPressure": st.floats(0, 1),
                    },
                )
            ),
        }
    ),
    "log/set-level": st.fixed_dictionaries(
        {"level": st.sampled_from(["debug", "info", "warn", "error"])}
    ),
    "discovery:nodes": st.fixed_dictionaries(
        {
            "nodes": some(
                st.one_of(
                    st.fixed_dictionaries(
                        {"id": NODE_IDS, "url": GOOD_URLS}, optional={"models": MODELS}
                    ),
                    st.fixed_dictionaries(
                        {"id": NODE_IDS, "local": st.just(True)}, optional={"models": MODELS}
                    ),
                )
            )
        }
    ),
    "node/select": st.fixed_dictionaries({"nodeId": st.none() | NODE_IDS}),
    "node/set-local-backend": st.fixed_dictionaries(
        {"url": st.none() | st.sampled_from(["http://127.0.0.1:11435", "http://[::1]:1"])}
    ),
    "set-port": st.fixed_dictionaries({"port": PORTS}),
}

#: Values of the wrong type, or of the right type and absurd, for any member.
NASTY = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        -0.0,
        2**63,
        10**400,  # an integer beyond any float
        "",
        "\x00",
        "x" * 70_000,
        [],
        {},
        ["a"],
        {"a": 1},
        Raw("1e400", False),
        Raw("-1e400", False),
    ]
)

#: Wrong values aimed at what one member name means.
BAD = {
    "url": st.sampled_from(
        [
            "http://[",
            "https://h:99999",
            "https://192.168.1.7:abc",
            "http://h:0",
            "ftp://h",
            "http://h:1?q",
            "http://u@h:1",
            "http://h\x00:1",
            "http:///x",
        ]
    ),
    "pending": st.sampled_from([10**400, 2**1100, -1, -0.5, float("nan"), float("inf")]),
    "gpuPressure": st.sampled_from([10**400, -1e-9, float("-inf"), Raw("1e400", False)]),
    # 2**63 - 1 is the largest valid one: nothing can follow it.
    "generation": st.sampled_from([1.0, -1, 2**63, 2**63 - 1, 10**30, Raw("1" * 4000, False)]),
    "port": st.sampled_from([65536, -1, 1.0, 10**30, True, TAKEN_PORT]),
    "id": st.sampled_from(["", "a", "b", "\x00", "\u00e9", "x" * 5000]),  # "a", "b": duplicates
    "nodeId": st.sampled_from(["", "\x00", "x" * 5000]),
    "engine": st.sampled_from(["", "OLLAMA", "vllm", "ollama "]),
    "aliases": st.sampled_from([["10.0.0.1:1"], ["127.0.0.1:0"], ["localhost:1"], ["127.0.0.1"]]),
    "level": st.sampled_from(["DEBUG", "critical", "", "trace"]),
    "models": st.sampled_from([[None], [[]], "llama3", [1]]),
    "local": st.sampled_from(["true", 1, None]),
}


def _members(value: object) -> list[tuple[dict[str, Any], str]]:
    """Every (object, member name) pair inside a params value."""
    found: list[tuple[dict[str, Any], str]] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found.extend((item, name) for name in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


@st.composite
def params_for(draw: st.DrawFn, method: str) -> object:
    """Well-typed params for ``method``, half the time with one thing wrong somewhere in them:
    one fault at a time reaches every validator, and past it, the handler."""
    strategy = GOOD.get(resolve_address(method).method)
    if strategy is None:
        return draw(st.dictionaries(st.text(max_size=8), JUNK, max_size=3))
    params = draw(strategy)
    members = _members(params)
    how = draw(st.sampled_from(["keep"] * 3 + ["break"] * 5 + ["drop", "extra"]))
    if how == "break" and members:
        # Members with aimed wrong values are picked more often than the rest.
        owner, name = draw(st.sampled_from([m for m in members if m[1] in BAD] * 2 + members))
        owner[name] = draw(weighted((3, BAD.get(name, NASTY)), (1, NASTY), (1, JUNK)))
    elif how == "drop" and members:
        owner, name = draw(st.sampled_from(members))
        del owner[name]
    elif how == "extra":
        params[draw(st.text(max_size=8))] = draw(JUNK)
    return params


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, object]:
    """A request, notification or answer; mostly well-formed, sometimes not at all."""
    message: dict[str, object] = {}
    if draw(chance(9, 10)):
        message["jsonrpc"] = "2.0"
    elif draw(st.booleans()):
        message["jsonrpc"] = draw(st.one_of(st.sampled_from(["1.0", "2", 2.0, 2, ""]), JUNK))
    kind = draw(st.sampled_from(["request", "request", "notification", "answer"]))
    method = draw(METHODS)
    if kind != "answer":
        message["method"] = method if draw(chance(9, 10)) else draw(JUNK)
    if kind != "notification":
        message["id"] = draw(IDS)
    if kind == "answer":
        shape = draw(st.sampled_from(["result", "error", "both", "neither"]))
        if shape in ("result", "both"):
            message["result"] = draw(JUNK)
        if shape in ("error", "both"):
            message["error"] = draw(
                st.one_of(
                    JUNK, st.fixed_dictionaries({"code": st.integers() | JUNK, "message": JUNK})
                )
            )
    if kind != "answer" or draw(st.booleans()):
        message["params"] = draw(params_for(method)) if draw(chance(9, 10)) else draw(JUNK)
    if draw(chance(1, 10)):
        message[draw(st.text(max_size=6))] = draw(JUNK)
    return message


@frozen
class Line:
    data: bytes
    poison: bool


@st.composite
def message_lines(draw: st.DrawFn) -> Line:
    text, poison = emit(draw(envelopes()), ascii_only=draw(st.booleans()))
    return Line(text.encode("utf-8"), poison)


def owed_id(line: Line) -> str | None:
    """The id a line must be answered with exactly once; None when it is owed no such answer.

    A line that parses to an object with a method and an int or string id is owed one answer
    with that id, whatever else is wrong with it (a bad jsonrpc member, unknown method, bad
    params, no facade). A line that does not parse is answered with id null.
    """
    if line.poison or len(line.data) > MAX_LINE:
        return None
    message = json.loads(line.data)  # not poisoned: no NaN, no deep nesting, no huge ints
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    request_id = message["id"]
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return id_key(request_id)


# -- the properties --------------------------------------------------------------------------


def enable_line(engine: str) -> Line:
    message = {"jsonrpc": "2.0", "id": f"enable-{engine}", "method": "facade/enable"}
    return Line(json.dumps({**message, "params": {"engine": engine}}).encode(), False)


@FUZZ
@given(
    enabled=st.lists(st.sampled_from(sorted(ENGINES)), unique=True, min_size=1),
    lines=st.lists(message_lines(), min_size=2, max_size=16),
    ends=st.lists(st.sampled_from([b"\n", b"\r\n", b"\n \n", b"\n\n"]), min_size=19, max_size=19),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=8),
)
def test_every_request_gets_exactly_one_valid_answer(
    enabled: list[str], lines: list[Line], ends: list[bytes], cuts: list[int]
) -> None:
    """Envelopes of every shape, every method of docs/broker-protocol.md, params good and bad: each
    request with a usable id is answered once with that id, and never -32603."""
    # Facades enabled first, so that facade methods mostly reach their handlers.
    lines = [*map(enable_line, enabled), *lines]
    stream = b"".join(line.data + end for line, end in zip(lines, ends, strict=False))
    with fuzz_stack() as stack:
        feed(stack, chunked(stream, [cut % (len(stream) + 1) for cut in cuts]))
        frames = output_frames(stack)
        got = Counter(id_key(a["id"]) for a in answers(frames) if a["id"] is not None)
        owed = Counter(key for key in map(owed_id, lines) if key is not None)
        assert got == owed
        assert all(a.get("error", {}).get("code") != -32603 for a in answers(frames))
        assert_control_valid(stack)
        record_reach(stack, frames)
        assert_still_serves(stack)
        assert_no_failure_logged(stack)


def record_reach(stack: Stack, frames: list[dict[str, Any]]) -> None:
    """How deep the input got (``--hypothesis-show-statistics``): a fuzz whose messages are
    all refused at the first field would test little."""
    control = stack.control
    event(f"facades enabled: {len(stack.facades.facades)}")
    event(f"discovery stored: {any(control.discovery(e).nodes for e in ENGINES)}")
    event(f"priority applied: {control.priority.generation > 0}")
    for answer in answers(frames):
        event(f"answer: {answer['error']['code'] if 'error' in answer else 'result'}")


#: Every method this process serves, addressed to a facade where it takes one; the three
#: process methods weighted as much as the twelve facade ones together.
SERVED_METHODS = ["facade/enable", "node/set-priority", "log/set-level"] * 4 + [
    f"{engine}:{method}"
    for engine in sorted(ENGINES)
    for method in ("discovery:nodes", "node/select", "node/set-local-backend", "set-port")
]


def control_view(stack: Stack) -> object:
    """Everything a broker message can change, as a comparable value."""
    control = stack.control
    return (
        control.priority,
        {engine: control.discovery(engine) for engine in ENGINES},
        {engine: (control.pin(engine), control.local_backend(engine)) for engine in ENGINES},
        {engine: live.port for engine, live in stack.facades.facades.items()},
    )


@FUZZ
@given(
    calls=st.lists(
        st.sampled_from(SERVED_METHODS).flatmap(
            lambda method: st.tuples(st.just(method), params_for(method))
        ),
        min_size=1,
        max_size=12,
    )
)
def test_params_of_every_served_method(calls: list[tuple[str, object]]) -> None:
    """Each served method with params good or broken in one place: the answer is a result or a
    refusal naming a field (or a bind failure), and a refused message changes nothing."""
    with fuzz_stack() as stack:
        for engine in sorted(ENGINES):
            assert "result" in stack.request("facade/enable", {"engine": engine})
        for method, params in calls:
            before = control_view(stack)
            text, poison = emit(
                {"jsonrpc": "2.0", "id": "c", "method": method, "params": params}, True
            )
            stack.transport.clear()
            stack.protocol.dataReceived(text.encode() + b"\n")
            found = [frame for frame in answers(output_frames(stack)) if frame["id"] == "c"]
            assert len(found) == (0 if poison else 1), (method, params)
            name = resolve_address(method).method
            if poison:
                assert control_view(stack) == before
                continue
            answer = found[0]
            if "error" in answer:
                error = answer["error"]
                event(f"{name}: {error['code']}")
                assert error["code"] in (-32602, -32001), (method, params, error)
                assert error["code"] != -32602 or isinstance(error["data"]["field"], str)
                # A refusal is atomic: nothing of a refused message is applied.
                assert control_view(stack) == before, (method, params)
            else:
                event(f"{name}: result")
            assert_control_valid(stack)
        assert_still_serves(stack)
        assert_no_failure_logged(stack)


#: Well-formed lines hidden among arbitrary bytes; each id is one no random input produces.
PLANTED: list[dict[str, object]] = [
    {"jsonrpc": "2.0", "id": "planted-0", "method": "log/set-level", "params": {"level": "warn"}},
    {"jsonrpc": "2.0", "id": "planted-1", "method": "ollama:node/select", "params": {}},
    {"jsonrpc": "2.0", "id": "planted-2", "method": "no/such/method"},
    {
        "jsonrpc": "2.0",
        "id": "planted-3",
        "method": "facade/enable",
        "params": {"engine": "llamacpp", "port": 9000},
    },
    {"jsonrpc": "2.0", "method": "node/set-priority", "params": {"generation": 1, "nodes": []}},
]
PLANTED_LINES = [json.dumps(message).encode() for message in PLANTED]

SEGMENTS = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(PLANTED_LINES),
    st.sampled_from(
        [
            b"\n",
            b"\r\n",
            b"\r",
            b"\x00",
            b"\xff\xfe",
            b"\xed\xa0\x80",  # a UTF-8-encoded surrogate: invalid UTF-8
            b"\xc3",  # a truncated two-byte sequence
            b"\xef\xbb\xbf",  # a BOM
            b"{",
            b'"',
            b"\\",
            b"[" * 3000,
            b"NaN",
            b'{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}',
        ]
    ),
    # Rarely: lines at and over the 1 MiB limit.
    st.sampled_from([b"x" * (MAX_LINE + 1), b"y" * MAX_LINE] + [b" "] * 30),
)


def planted_owed(stream: bytes) -> Counter[str]:
    """Planted requests that sit alone on a complete line within the limit."""
    owed: Counter[str] = Counter()
    for line in stream.split(b"\n")[:-1]:
        body = line.strip(b" \t\r")  # JSON's own whitespace only
        if len(line) <= MAX_LINE and body in PLANTED_LINES:
            message = PLANTED[PLANTED_LINES.index(body)]
            if "id" in message:
                owed[id_key(message["id"])] += 1
    return owed


@FUZZ
@given(
    segments=st.lists(SEGMENTS, max_size=10),
    cuts=st.lists(st.integers(0, 1 << 22), max_size=10),
    eof=st.booleans(),
)
def test_framing_of_arbitrary_bytes(segments: list[bytes], cuts: list[int], eof: bool) -> None:
    """Arbitrary bytes, split anywhere: the same frames as the stream read in one piece,
    planted requests answered once each, everything else answered with id null or dropped."""
    stream = b"".join(segments)
    with fuzz_stack() as whole:
        feed(whole, [stream], eof)
        expected = whole.transport.value()
    with fuzz_stack() as stack:
        feed(stack, chunked(stream, [cut % (len(stream) + 1) for cut in cuts]), eof)
        assert stack.transport.value() == expected
        frames = output_frames(stack)
        got = Counter(id_key(a["id"]) for a in answers(frames) if a["id"] is not None)
        assert got == planted_owed(stream)
        assert all(a.get("error", {}).get("code") != -32603 for a in answers(frames))
        assert_control_valid(stack)
        if eof:
            assert stack.lost == [None]
        else:
            assert_still_serves(stack)
        assert_no_failure_logged(stack)


@st.composite
def answer_lines(draw: st.DrawFn, ids: list[int]) -> Line:
    """An answer to one of the proxy's requests (or to none), of any shape."""
    message: dict[str, object] = {}
    if draw(chance(5, 6)):
        message["jsonrpc"] = "2.0"
    message["id"] = draw(
        st.one_of(st.sampled_from(ids), st.sampled_from([0, 99, True, 1.0, "1", None]), IDS)
    )
    shape = draw(st.sampled_from(["result", "result", "error", "error", "both", "neither"]))
    if shape in ("result", "both"):
        message["result"] = draw(JUNK)
    if shape in ("error", "both"):
        code = st.one_of(st.integers(), JUNK)
        message["error"] = draw(
            st.one_of(st.fixed_dictionaries({"code": code, "message": JUNK}), JUNK)
        )
    text, poison = emit(message, ascii_only=draw(st.booleans()))
    return Line(text.encode("utf-8"), poison)


def expected_outcome(lines: Iterable[Line], call_id: int) -> str | None:
    """How call ``call_id`` settles: the first parseable answer carrying its id decides."""
    for line in lines:
        if line.poison:
            continue
        message = json.loads(line.data)
        if message.get("id") != call_id or type(message.get("id")) is not int:
            continue
        clean = message.get("jsonrpc") == "2.0" and "result" in message and "error" not in message
        return "result" if clean else "error"
    return None


@FUZZ
@given(data=st.data())
def test_answers_settle_the_proxys_own_calls(data: st.DataObject) -> None:
    """Answers of any shape to the proxy's own requests: each call settles once, with a result
    or an RpcError, and no answer is ever answered."""
    with fuzz_stack() as stack:
        outcomes: dict[int, list[str]] = {}
        for _ in range(3):  # ids 1-3, so that an answer with id true could pass for 1
            d = stack.protocol.call("ollama:discovery:subscribe", {})
            request_id = output_frames(stack)[-1]["id"]
            outcomes[request_id] = []
            d.addCallbacks(
                lambda _, i=request_id: outcomes[i].append("result"),
                lambda f, i=request_id: outcomes[i].append(_kind(f)),
            )
        for engine in sorted(ENGINES):  # each enable sends <engine>:discovery:subscribe
            enable = {"jsonrpc": "2.0", "id": engine, "method": "facade/enable"}
            stack.send({**enable, "params": {"engine": engine}})
        ids = [f["id"] for f in output_frames(stack) if "method" in f and "id" in f]
        assert len(ids) == 6
        stack.transport.clear()
        lines = data.draw(st.lists(answer_lines(ids), min_size=1, max_size=10))
        stream = b"".join(line.data + b"\n" for line in lines)
        cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
        feed(stack, chunked(stream, cuts))
        frames = output_frames(stack)
        assert all("method" not in f and f["id"] is None for f in frames), frames
        for request_id, seen in outcomes.items():
            want = expected_outcome(lines, request_id)
            assert seen == ([] if want is None else [want])
        assert all(_kind(f) in ("error", "closed") for f in stack.subscribe_failures)
        assert_still_serves(stack)
        stack.protocol.readConnectionLost()
        assert all(len(seen) == 1 for seen in outcomes.values())
        assert_no_failure_logged(stack)


def _kind(failure: Failure) -> str:
    if failure.check(RpcError):
        return "error"
    if failure.check(ConnectionError):
        return "closed"
    return repr(failure.value)
