"""Reading each engine's load answer (docs/fleet-scheduling.md#load-state, issue 13 item 1):
what the engines really answer becomes a value; anything else is unknown,
never an exception."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.engines.loadstate import LISTING_LAG, UNKNOWN, Answer, LoadState, unseen
from nvpair.engines.table import ENGINES, LLAMACPP, LMSTUDIO, OLLAMA


def ok(document: object, status: int = 200) -> Answer:
    return Answer(status, json.dumps(document).encode())


def read(engine_id: str, *answers: Answer | None) -> LoadState:
    engine = ENGINES[engine_id]
    return engine.load_probe.read(answers, engine.model_key)


def llama(
    health: Answer | None, slots: Answer | None, listing: Answer | None, props: Answer | None = None
) -> LoadState:
    """A llama.cpp poll read whole: ``/health``, ``/props`` and the list, then ``/slots`` when
    the first answers ask for it (its answer ``slots``)."""
    probe = LLAMACPP.load_probe
    first = [health, props, listing]
    more = probe.follow_up(first)
    followed = [(model, slots if path == "/slots" else None) for model, path in more]
    return probe.read_follow_up(probe.read(first, str), followed, str)


# -- Ollama GET /api/ps ---------------------------------------------------------------------------

PS_ENTRY = {
    "name": "llama3:latest",
    "model": "llama3:latest",
    "size": 5137025024,
    "digest": "365c0bd3c000",
    "details": {"format": "gguf", "family": "llama"},
    "expires_at": "2026-01-01T00:05:00.123456789Z",
    "size_vram": 5137025024,
    "context_length": 4096,
}


def test_ollama_ps_lists_the_models_in_memory_as_keys() -> None:
    """Names are compared with Ollama's key: ``library/Llama3`` is ``llama3:latest``."""
    state = read("ollama", ok({"models": [PS_ENTRY, {**PS_ENTRY, "name": "library/Qwen2:7b"}]}))
    assert OLLAMA.load_probe.paths == ("/api/ps",)
    assert state.warm == frozenset({OLLAMA.model_key("llama3"), OLLAMA.model_key("qwen2:7b")})
    assert not state.loading and state.slots is None
    assert state.in_memory(OLLAMA.model_key("llama3"), frozenset()) is True
    assert state.in_memory(OLLAMA.model_key("phi3"), frozenset()) is False


def test_ollama_ps_empty_means_nothing_in_memory_not_unknown() -> None:
    documents: list[dict[str, object]] = [{"models": []}, {"models": None}]
    for document in documents:
        state = read("ollama", ok(document))
        assert state.warm == frozenset() and state != UNKNOWN
        assert state.in_memory("x", frozenset({"x"})) is False


def test_an_expired_expires_at_still_counts_as_in_memory() -> None:
    """Ollama keeps the old expiry while a request runs on the model: listed is in memory."""
    state = read("ollama", ok({"models": [{**PS_ENTRY, "expires_at": "2001-01-01T00:00:00Z"}]}))
    assert state.warm == frozenset({OLLAMA.model_key("llama3")})


# -- LM Studio GET /api/v0/models -----------------------------------------------------------------


def v0(model: str, state: object) -> dict[str, object]:
    return {"id": model, "object": "model", "type": "llm", "state": state}


def test_lmstudio_loaded_models_are_warm() -> None:
    state = read(
        "lmstudio",
        ok({"object": "list", "data": [v0("a/m1", "loaded"), v0("a/m2", "not-loaded")]}),
    )
    assert LMSTUDIO.load_probe.paths == ("/api/v0/models",)
    assert state.warm == frozenset({"a/m1"})
    # A model-less request runs on whatever is loaded.
    assert state.in_memory(None, frozenset({"a/m1", "a/m2"})) is True


def test_lmstudio_without_rest_v0_is_unknown() -> None:
    """Versions before 0.3.6 answer any unknown route 200 with an error object."""
    unexpected = ok({"error": "Unexpected endpoint or method. (GET /api/v0/models)"})
    assert read("lmstudio", unexpected) == UNKNOWN


# -- llama.cpp GET /health, GET /props, then GET /slots --------------------------------------------


def slot(index: int, processing: bool) -> dict[str, object]:
    return {"id": index, "id_task": -1, "n_ctx": 4096, "is_processing": processing}


HEALTHY = ok({"status": "ok"})
LOADING = ok({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503)

#: A server started with ``-m`` lists its one model without a ``status``.
LISTED = ok({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "llamacpp"}]})


def test_llamacpp_health_and_slots() -> None:
    state = llama(HEALTHY, ok([slot(0, True), slot(1, False), slot(2, True)]), LISTED)
    assert LLAMACPP.load_probe.paths == ("/health", "/props", "/v1/models")
    assert (state.loading, state.warm_all, state.slots, state.busy) == (False, True, 3, 2)
    assert state.in_memory("tiny", frozenset({"tiny"})) is True
    assert state.free_slot(0) and not state.free_slot(1)


def test_llamacpp_loading_is_a_503_from_health() -> None:
    state = llama(LOADING, LOADING, LOADING)
    assert state.loading and state.in_memory("tiny", frozenset({"tiny"})) is False


def test_llamacpp_legacy_slot_state() -> None:
    """Builds before late 2024 said ``state`` 0 (idle) or 1 (processing)."""
    slots = ok([{"id": 0, "state": 1}, {"id": 1, "state": 0}])
    assert llama(HEALTHY, slots, LISTED) == LoadState(warm_all=True, slots=2, busy=1)


def test_llamacpp_without_slots_still_serves_its_model() -> None:
    """``--no-slots``: the slot count is unknown, the model is in memory."""
    disabled = ok({"error": {"code": 501, "message": "This server does not support slots"}}, 501)
    assert llama(HEALTHY, disabled, LISTED) == LoadState(warm_all=True)
    assert llama(None, ok([slot(0, False)]), None) == LoadState(warm_all=True, slots=1)
    assert llama(None, None, None) == UNKNOWN


#: ``/props`` of a server asleep (``--sleep-idle-seconds``), trimmed.
ASLEEP = ok({"total_slots": 2, "model_alias": "tiny", "is_sleeping": True})


def test_a_sleeping_server_is_cold_and_not_asked_its_slots() -> None:
    """docs/fleet-scheduling.md#sleeping-servers: one ``/slots`` request would wake it."""
    first = [HEALTHY, ASLEEP, LISTED]
    assert LLAMACPP.load_probe.follow_up(first) == ()
    state = LLAMACPP.load_probe.read(first, str)
    assert state == LoadState(warm=frozenset(), sleeping=True)
    assert state.in_memory("tiny", frozenset({"tiny"})) is False
    # A request sent to it wakes it: its model then counts in memory.
    assert state.assuming({"tiny"}).in_memory("tiny", frozenset({"tiny"})) is True


def test_an_awake_server_or_one_that_does_not_say_is_asked_its_slots() -> None:
    awake = ok({"total_slots": 2, "is_sleeping": False})
    for props in (awake, ok({"total_slots": 2}), None, ok({}, 404)):
        assert LLAMACPP.load_probe.follow_up([HEALTHY, props, LISTED]) == ((None, "/slots"),)
        assert llama(HEALTHY, ok([slot(0, True)]), LISTED, props) == LoadState(
            warm_all=True, slots=1, busy=1
        )


# -- hostile and broken answers -------------------------------------------------------------------

HOSTILE = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"models": [{"name": ' + b"9" * 5000 + b"}]}",
    b'{"models": [{"name": 1e400}]}',
    b'{"models": [{"name": NaN}]}',
    b"\xff\xfe not utf-8",
    b"",
    b"null",
    b'"a string"',
    b"[1, 2, 3]",
    b'{"models": "nope"}',
    b'{"models": [1]}',
    b'{"models": [{"name": ["x"]}]}',
    b'{"data": [{"id": "m", "state": ["loaded"]}]}',
    b'{"data": [{"id": 7, "state": "loaded"}]}',
    b'[{"is_processing": "yes"}]',
    b'[{"state": true}]',
    b'[{"state": 2}]',
    b"[null]",
]


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("engine_id", ["ollama", "lmstudio"])
def test_hostile_bodies_are_unknown(engine_id: str, body: bytes) -> None:
    assert read(engine_id, Answer(200, body)) == UNKNOWN


@pytest.mark.parametrize("body", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_slots_leave_the_slot_count_unknown(body: bytes) -> None:
    assert llama(HEALTHY, Answer(200, body), LISTED) == LoadState(warm_all=True)
    assert llama(None, Answer(200, body), None) == UNKNOWN


@pytest.mark.parametrize("status", [404, 500, 502, 301])
def test_a_status_that_is_not_2xx_says_nothing(status: int) -> None:
    assert read("ollama", ok({"models": [PS_ENTRY]}, status)) == UNKNOWN
    assert read("lmstudio", ok({"data": [v0("m", "loaded")]}, status)) == UNKNOWN
    assert llama(ok({"status": "ok"}, status), None, None) == UNKNOWN


def test_unknown_says_nothing_about_memory_and_assumes_one_slot() -> None:
    assert UNKNOWN.in_memory("m", frozenset({"m"})) is None
    assert UNKNOWN.free_slot(0) and not UNKNOWN.free_slot(1)


def bodies() -> st.SearchStrategy[bytes]:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
    shaped = st.fixed_dictionaries(
        {},
        optional={
            "models": st.lists(st.dictionaries(st.sampled_from(["name", "x"]), json_values)),
            "data": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "id": st.sampled_from(["a", "b", "\ud800", "a/b c.gguf"]) | json_values,
                        "state": json_values,
                        # A llama.cpp router's per-model status.
                        "status": st.fixed_dictionaries(
                            {"value": st.sampled_from(["loaded", "loading", "sleeping"])}
                        )
                        | json_values,
                    },
                )
            ),
        },
    )
    return st.binary() | (json_values | shaped).map(lambda v: json.dumps(v).encode())


@given(
    engine_id=st.sampled_from(sorted(ENGINES)),
    statuses=st.lists(st.integers(100, 599), min_size=3, max_size=3),
    payloads=st.lists(st.none() | bodies(), min_size=3, max_size=3),
)
def test_any_answer_gives_a_state_never_an_exception(
    engine_id: str, statuses: Sequence[int], payloads: Sequence[bytes | None]
) -> None:
    engine = ENGINES[engine_id]
    answers = [
        None if body is None else Answer(status, body)
        for status, body in zip(statuses, payloads, strict=True)
    ][: len(engine.load_probe.paths)]
    probe = engine.load_probe
    state = probe.read(answers, engine.model_key)
    assert isinstance(state, LoadState)
    assert state.busy >= 0 and (state.slots is None or state.busy <= state.slots)
    # A follow-up (a llama.cpp router's slots per loaded model) never fails either, whatever
    # its answers: here, the first answers over again.
    more = probe.follow_up(answers)
    assert all(path.startswith("/") for _, path in more)
    followed = probe.read_follow_up(
        state, [(model, answers[i % len(answers)]) for i, (model, _) in enumerate(more)], str
    )
    assert all(0 <= busy <= slots for _, slots, busy in followed.model_slots)


# -- dispatched is loading (docs/fleet-scheduling.md#dispatched-is-loading) -----------------------

WARM_A = LoadState(warm=frozenset({"a"}))


@pytest.mark.parametrize(
    ("state", "dispatched", "expected"),
    [
        pytest.param(
            UNKNOWN, {"m"}, LoadState(warm=frozenset({"m"})), id="unknown-knows-the-dispatch"
        ),
        pytest.param(WARM_A, {"m"}, LoadState(warm=frozenset({"a", "m"})), id="added"),
        pytest.param(WARM_A, {"a"}, WARM_A, id="already-listed"),
        pytest.param(WARM_A, set(), WARM_A, id="nothing-dispatched"),
        pytest.param(
            LoadState(loading=True), {"m"}, LoadState(loading=True), id="loading-stays-loading"
        ),
        pytest.param(
            LoadState(warm_all=True, slots=4, busy=1),
            {"m"},
            LoadState(warm_all=True, slots=4, busy=1),
            id="single-model-server-unchanged",
        ),
        pytest.param(
            LoadState(warm=frozenset(), slots=2, busy=1),
            {"m"},
            LoadState(warm=frozenset({"m"}), slots=2, busy=1),
            id="slots-kept",
        ),
    ],
)
def test_assuming(state: LoadState, dispatched: set[str], expected: LoadState) -> None:
    assert state.assuming(dispatched) == expected


@pytest.mark.parametrize(
    ("state", "dispatched", "room", "expected"),
    [
        pytest.param(WARM_A, {"m": 1.0}, 2, frozenset({"a", "m"}), id="room-for-both"),
        pytest.param(WARM_A, {"m": 1.0}, 1, frozenset({"m"}), id="a-swap-evicts"),
        pytest.param(WARM_A, {"m": 1.0, "n": 2.0}, 1, frozenset({"n"}), id="the-last-sent"),
        pytest.param(
            WARM_A, {"m": 3.0, "n": 2.0, "o": 1.0}, 2, frozenset({"m", "n"}), id="newest-two"
        ),
        pytest.param(WARM_A, {"a": 1.0}, 1, WARM_A.warm, id="already-held-no-load"),
        pytest.param(WARM_A, {"m", "n"}, 1, frozenset({"m", "n"}), id="unordered-keeps-all"),
        pytest.param(UNKNOWN, {"m": 1.0, "n": 2.0}, 1, frozenset({"m", "n"}), id="no-reading"),
    ],
)
def test_assuming_within_room(
    state: LoadState, dispatched: set[str] | dict[str, float], room: int, expected: frozenset[str]
) -> None:
    """A load past the models the engine has been seen holding evicts one the reading cannot
    name: only what was sent since counts (docs/fleet-scheduling.md#dispatched-is-loading)."""
    assert state.assuming(dispatched, room).warm == expected


@pytest.mark.parametrize(
    ("dispatched", "asked_at", "expected"),
    [
        pytest.param({"m": 10.0}, 9.0, {"m": 10.0}, id="asked-before-the-dispatch"),
        pytest.param({"m": 10.0}, 10.0, {"m": 10.0}, id="asked-at-the-dispatch"),
        pytest.param({"m": 10.0}, 10.0 + LISTING_LAG / 2, {"m": 10.0}, id="asked-too-soon"),
        pytest.param({"m": 10.0}, 10.0 + LISTING_LAG, {}, id="asked-a-lag-after"),
        pytest.param({"m": 10.0, "n": 14.5}, 15.0, {"n": 14.5}, id="only-the-recent-one"),
        pytest.param({}, 15.0, {}, id="nothing"),
    ],
)
def test_unseen(dispatched: dict[str, float], asked_at: float, expected: dict[str, float]) -> None:
    assert unseen(dispatched, asked_at) == expected


load_states = st.one_of(
    st.just(UNKNOWN),
    st.builds(LoadState, loading=st.booleans(), warm=st.frozensets(st.sampled_from("abc"))),
    st.builds(
        LoadState,
        warm_all=st.just(True),
        slots=st.integers(1, 4),
        busy=st.integers(0, 4),
    ),
)
keys = st.frozensets(st.sampled_from("abcm"))


@given(state=load_states, dispatched=keys, model=st.sampled_from("abcm"))
def test_an_assumption_only_adds(state: LoadState, dispatched: frozenset[str], model: str) -> None:
    """A dispatched model is in memory (unless the whole engine is loading); a model that was in
    memory stays so, one that was not and was not dispatched stays out; slots are untouched."""
    listed = frozenset("abcm")
    assumed = state.assuming(dispatched)
    before, after = state.in_memory(model, listed), assumed.in_memory(model, listed)
    if (model in dispatched and not state.loading) or before:
        assert after is True
    elif model not in dispatched:
        assert after == before or (before is None and after is False)
    assert (assumed.loading, assumed.slots, assumed.busy, assumed.warm_all) == (
        state.loading,
        state.slots,
        state.busy,
        state.warm_all,
    )
    assert assumed.assuming(dispatched) == assumed


times = st.floats(0, 1000, allow_nan=False)


@given(dispatched=st.dictionaries(st.sampled_from("abcm"), times), asked=times, later=times)
def test_a_later_poll_speaks_for_more(
    dispatched: dict[str, float], asked: float, later: float
) -> None:
    """What a poll leaves is a part of the dispatches, every dispatch after it was asked among
    them; a poll asked later never leaves more."""
    kept = unseen(dispatched, asked)
    assert kept.items() <= dispatched.items()
    assert {k for k, at in dispatched.items() if at > asked} <= kept.keys()
    if later >= asked:
        assert unseen(dispatched, later).keys() <= kept.keys()
