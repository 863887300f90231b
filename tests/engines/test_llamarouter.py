"""llama.cpp router mode read as a load (issue 22 item 5;
docs/fleet-scheduling.md#llamacpp-router-mode): a router's ``/v1/models`` says each model's
state, its ``/slots`` is read per loaded model without ever loading one, and the order puts a
router holding the model before one that must load it. Pure: answers as bytes, the order as a
function, then the poll itself on a Clock with scripted answers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from twisted.internet.task import Clock

from nvpair.control.routing import Standing, Tier, fleet_plan, tier
from nvpair.control.state import Node
from nvpair.engines.llamarouter import MAX_SLOT_READS, router_statuses, slot_reads, slots_path
from nvpair.engines.loadstate import UNKNOWN, Answer, LoadState
from nvpair.engines.table import LLAMACPP
from nvpair.fleet.scheduling import FleetScheduler
from tests.fleet.test_fleet_loadpoll import POLICY, LoadPolling, started
from tests.fleet.test_fleet_poll import BOUND, INTERVAL

PROBE = LLAMACPP.load_probe


def ok(document: object, status: int = 200) -> Answer:
    return Answer(status, json.dumps(document).encode())


def entry(model: str, status: object) -> dict[str, object]:
    """One model of a real router's list (trimmed: its ``args`` and ``preset`` too)."""
    return {
        "id": model,
        "aliases": [],
        "object": "model",
        "owned_by": "llamacpp",
        "status": status if not isinstance(status, str) else {"value": status, "args": []},
    }


def listing(**statuses: object) -> Answer:
    return ok({"object": "list", "data": [entry(m, s) for m, s in statuses.items()]})


def slots(*busy: bool) -> Answer:
    return ok([{"id": i, "n_ctx": 256, "is_processing": b} for i, b in enumerate(busy)])


HEALTHY = ok({"status": "ok"})

#: What a router answers ``/slots`` without ``?model=``.
NO_MODEL = ok(
    {"error": {"code": 400, "message": "model name is missing from the request"}}, status=400
)

#: What a router answers ``/props`` without ``?model=`` (trimmed).
ROUTER_PROPS = ok({"role": "router", "max_instances": 4, "model_alias": "llama-server"})


def read(models: Answer | None, health: Answer | None = HEALTHY) -> LoadState:
    return PROBE.read([health, ROUTER_PROPS, models], str)


# -- the model list -------------------------------------------------------------------------------


def test_each_status_is_a_load_state() -> None:
    """loaded = in memory; loading = in memory, no slot free yet; the others = cold, a
    sleeping one shown so (docs/fleet-scheduling.md#sleeping-servers)."""
    state = read(listing(a="loaded", b="loading", c="unloaded", d="sleeping", e="failed"))
    assert state == LoadState(
        warm=frozenset({"a", "b"}),
        loading_models=frozenset({"b"}),
        sleeping_models=frozenset({"d"}),
    )
    assert state.in_memory("a", frozenset("abcde")) is True
    assert state.in_memory("b", frozenset("abcde")) is True
    for cold in "cde":
        assert state.in_memory(cold, frozenset("abcde")) is False
    assert state.free_slot(0, "a") and not state.free_slot(0, "b")


def test_a_router_whose_list_says_nothing_is_unknown() -> None:
    """Its ``/props`` says router: never read as a single model's server, never asked its
    ``/slots`` without ``?model=``; a router that says so nowhere answers that 400."""
    assert read(listing(a="unloaded")) == LoadState(warm=frozenset())
    # With its model list unreadable this time, nothing is known (not "every model warm").
    assert read(None) == UNKNOWN
    assert read(ok({"data": []}, status=500)) == UNKNOWN
    assert PROBE.follow_up([HEALTHY, ROUTER_PROPS, None]) == ()
    silent = [HEALTHY, None, None]
    assert PROBE.follow_up(silent) == ((None, "/slots"),)
    assert PROBE.read_follow_up(PROBE.read(silent, str), [(None, NO_MODEL)], str) == UNKNOWN


def test_a_server_started_with_a_model_is_read_as_before() -> None:
    single = ok({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
    first = [HEALTHY, ok({"is_sleeping": False}), single]
    assert PROBE.follow_up(first) == ((None, "/slots"),)
    assert PROBE.read_follow_up(
        PROBE.read(first, str), [(None, slots(True, False))], str
    ) == LoadState(warm_all=True, slots=2, busy=1)


@pytest.mark.parametrize(
    "document",
    [
        {"data": [entry("a", "loaded"), {"id": "b"}]},
        {"data": [entry("a", {"value": 1})]},
        {"data": [entry("a", ["loaded"])]},
        {"data": [entry("a", {"args": []})]},
        {"data": [{**entry("a", "loaded"), "id": None}]},
        {"data": [entry("a", "loaded"), "b"]},
    ],
)
def test_a_malformed_router_list_says_nothing(document: object) -> None:
    """An entry whose status is not ``{"value": "..."}``: the list is not guessed at."""
    assert router_statuses(document) is None
    assert read(ok(document)) == UNKNOWN


def test_a_router_loading_as_a_whole_is_loading() -> None:
    loading = ok({"error": {"code": 503, "message": "Loading model"}}, 503)
    assert read(listing(a="loaded"), health=loading) == LoadState(loading=True)
    assert PROBE.follow_up([loading, loading, listing(a="loaded")]) == ()


# -- slots per loaded model -----------------------------------------------------------------------


def test_only_loaded_models_slots_are_asked_and_never_with_autoload() -> None:
    """Asking a model's slots loads it unless ``autoload=false``: a poll must never load one
    (with ``--models-max 1`` it would evict the one that is loaded)."""
    answers = [
        HEALTHY,
        ROUTER_PROPS,
        listing(a="loaded", b="loading", c="unloaded", d="loaded", e="sleeping"),
    ]
    assert PROBE.follow_up(answers) == (
        ("a", "/slots?model=a&autoload=false"),
        ("d", "/slots?model=d&autoload=false"),
    )


def test_a_model_id_is_quoted_into_the_query() -> None:
    assert (
        slots_path("org/m 7b.gguf&x=1") == "/slots?model=org%2Fm%207b.gguf%26x%3D1&autoload=false"
    )
    assert slots_path("\ud800") is None
    assert slot_reads([("\ud800", "loaded"), ("é", "loaded")]) == (
        ("é", "/slots?model=%C3%A9&autoload=false"),
    )


def test_the_slots_asked_per_poll_are_bounded() -> None:
    many = [(f"m{i}", "loaded") for i in range(1000)]
    assert len(slot_reads(many)) == MAX_SLOT_READS


def test_each_loaded_models_slots_are_its_own() -> None:
    state = read(listing(a="loaded", b="loaded", c="unloaded"))
    # b was unloaded between the list and its slots: 400 "model is not loaded".
    gone = ok({"error": {"code": 400, "message": "model is not loaded"}}, 400)
    state = PROBE.read_follow_up(state, [("a", slots(True, True)), ("b", gone)], str)
    assert state.model_slots == (("a", 2, 2),) and state.busy == 2
    assert not state.free_slot(0, "a")
    # b: in memory by the list, its slots unknown: one slot assumed, as for any engine that
    # does not say, counting what else the router is busy with.
    assert state.in_memory("b", frozenset("abc")) and not state.free_slot(0, "b")
    free = PROBE.read_follow_up(read(listing(a="loaded")), [("a", slots(True, False))], str)
    assert free.free_slot(0, "a") and not free.free_slot(1, "a")


def test_unreadable_slots_leave_the_reading_as_the_list_said() -> None:
    state = read(listing(a="loaded"))
    for answer in (None, ok({}), Answer(200, b"[" * 100_000), ok([{"is_processing": "yes"}])):
        assert PROBE.read_follow_up(state, [("a", answer)], str) == state


# -- the order ------------------------------------------------------------------------------------


def router(node_id: str) -> Node:
    models = ("alpha", "beta")
    return Node(node_id, False, f"http://{node_id}", models, frozenset(models))


def test_the_router_holding_the_model_goes_first() -> None:
    """Node ``a`` would win on id; ``b`` has alpha loaded and goes first for alpha, ``a``
    (beta loaded) for beta; a model loading counts as in memory, busy."""
    holds_beta = PROBE.read_follow_up(
        read(listing(alpha="unloaded", beta="loaded")), [("beta", slots(False))], str
    )
    holds_alpha = PROBE.read_follow_up(
        read(listing(alpha="loaded", beta="unloaded")), [("alpha", slots(False))], str
    )
    loads_alpha = read(listing(alpha="loading", beta="unloaded"))
    states = {"a": holds_beta, "b": holds_alpha, "c": loads_alpha}
    nodes = [router(n) for n in states]

    def order(model: str) -> list[str]:
        plan = fleet_plan(nodes, None, model, lambda n: Standing(states[n]), {})
        return [node.id for node in plan.candidates]

    assert order("alpha") == ["b", "c", "a"]
    assert order("beta") == ["a", "b", "c"]
    assert tier(router("c"), "alpha", loads_alpha, 0) is Tier.WARM_BUSY
    assert tier(router("b"), "alpha", holds_alpha, 1) is Tier.WARM_BUSY


def test_the_proxys_own_requests_are_not_counted_twice_per_model() -> None:
    """The busy slots a router reports include this proxy's; taken off each model's figure,
    a model never looks freer than it is once the reservations are added back."""
    own = {"n": 1}
    scheduler = FleetScheduler(Clock(), POLICY, lambda engine, node: own["n"])
    state = PROBE.read_follow_up(
        read(listing(a="loaded", b="loaded")), [("a", slots(True, True)), ("b", slots(True))], str
    )
    scheduler.record_load("llamacpp", "r", state)
    kept = scheduler.load("llamacpp", "r")
    assert kept.model_slots == (("a", 2, 1), ("b", 1, 0)) and kept.busy == 2
    # With this proxy's one request reserved, a is full, and so is b (it may be b's).
    assert not kept.free_slot(1, "a") and not kept.free_slot(1, "b")


# -- the poll: list, then each loaded model's slots -----------------------------------------------


@pytest.fixture
def routers() -> Iterator[LoadPolling]:
    yield from started("llamacpp")


MODELS = json.dumps(
    {"object": "list", "data": [entry("alpha", "loaded"), entry("beta", "unloaded")]}
).encode()
ALPHA_SLOTS = "/slots?model=alpha&autoload=false"


def test_a_poll_asks_each_loaded_models_slots_once_the_list_is_in(routers: LoadPolling) -> None:
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    assert routers.sent("a", ALPHA_SLOTS) == []
    routers.answer("a", "/v1/models", MODELS)
    # The inventory is in at once; the load waits for alpha's slots.
    assert routers.nodes() == {"a": ("alpha", "beta")}
    assert routers.load("a") == UNKNOWN
    assert len(routers.sent("a", ALPHA_SLOTS)) == 1
    assert routers.sent("a", "/slots?model=beta&autoload=false") == []
    routers.answer("a", ALPHA_SLOTS, slots(True, False).body)
    assert routers.load("a") == LoadState(
        warm=frozenset({"alpha"}), busy=1, model_slots=(("alpha", 2, 1),)
    )


def test_the_next_poll_waits_for_the_slots_too(routers: LoadPolling) -> None:
    """Never two polls of a pair at once: the follow-up is part of the poll."""
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    routers.answer("a", "/v1/models", MODELS)
    routers.clock.advance(INTERVAL)
    assert len(routers.sent("a", "/health")) == 1
    routers.answer("a", ALPHA_SLOTS, slots(False).body)
    routers.clock.advance(INTERVAL)
    assert len(routers.sent("a", "/health")) == 2


def test_a_stalled_slots_answer_is_bounded_and_says_nothing(routers: LoadPolling) -> None:
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    routers.answer("a", "/v1/models", MODELS)
    routers.clock.advance(BOUND)
    assert routers.load("a") == LoadState(warm=frozenset({"alpha"}))


def test_a_shutdown_cancels_the_slots_asked(routers: LoadPolling) -> None:
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    routers.answer("a", "/v1/models", MODELS)
    (asked,) = routers.pending("a", ALPHA_SLOTS)
    routers.service.stopService()
    assert asked.called  # cancelled, its connection closed


def test_the_slots_probes_go_one_at_a_time(routers: LoadPolling) -> None:
    """docs/fleet-scheduling.md#one-probe-at-a-time: each probe keeps its model from being
    evicted while it lasts, so at most one is in flight per node, in the list's order."""
    three = json.dumps(
        {"object": "list", "data": [entry(m, "loaded") for m in ("alpha", "beta", "gamma")]}
    ).encode()
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    routers.answer("a", "/v1/models", three)
    probes = [f"/slots?model={m}&autoload=false" for m in ("alpha", "beta", "gamma")]
    for done, probe in enumerate(probes):
        in_flight = [p for p in probes if routers.pending("a", p)]
        assert in_flight == [probe]
        assert all(len(routers.sent("a", p)) == 1 for p in probes[: done + 1])
        assert all(routers.sent("a", p) == [] for p in probes[done + 1 :])
        routers.answer("a", probe, slots(done == 1).body)
    assert routers.load("a").model_slots == (("alpha", 1, 0), ("beta", 1, 1), ("gamma", 1, 0))


def test_a_failed_probe_does_not_stop_the_next(routers: LoadPolling) -> None:
    """One model's probe failing says nothing of it, and the next model is still asked."""
    two = json.dumps({"object": "list", "data": [entry(m, "loaded") for m in ("alpha", "beta")]})
    routers.answer("a", "/health", b'{"status":"ok"}')
    routers.answer("a", "/props", ROUTER_PROPS.body)
    routers.answer("a", "/v1/models", two.encode())
    (first,) = routers.pending("a", ALPHA_SLOTS)
    first.errback(ConnectionRefusedError())
    routers.answer("a", "/slots?model=beta&autoload=false", slots(False).body)
    assert routers.load("a").model_slots == (("beta", 1, 0),)
