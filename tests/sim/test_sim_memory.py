# -*- test-case-name: tests.sim.test_sim_memory -*-
"""The simulated engines' cold-start knob (issue 13 item 1): a model not in memory answers its
first request only after the load delay, then stays warm until its keep-alive ends; each
dialect reports it as the real engine does (Ollama ``/api/ps``, LM Studio ``state``, llama.cpp
``/health`` 503 while loading and ``/slots`` busy while generating)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair.sim import Faults, SimEngine
from nvpair.sim.__main__ import main
from nvpair.sim.memory import Claim, Memory
from tests.sim.test_sim import INFERENCE, Start, eventually, fetch, send, sleep


@pytest.fixture
def start() -> Iterator[Start]:
    """Listening engines, stopped after the test."""
    engines: list[SimEngine] = []

    def make(dialect: str, models: Sequence[str] = ("m1",), **kwargs: Any) -> SimEngine:
        engine = SimEngine(reactor, dialect, models=models, **kwargs)
        engine.listen()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        pytest_twisted.blockon(engine.stop())


# -- the memory itself, on a Clock ---------------------------------------------------------------


def test_a_cold_model_loads_on_its_first_request_and_others_wait_for_that_load() -> None:
    clock = Clock()
    memory = Memory(clock, load_delay=2.0, keep_alive=30.0, warm=())
    assert not memory.in_memory("m") and memory.resident() == []
    assert memory.claim("m").wait == 2.0 and memory.loads == 1
    clock.advance(0.5)
    assert memory.claim("m").wait == 1.5 and memory.loads == 1  # the same load
    (resident,) = memory.resident()
    assert resident.loading(clock.seconds()) and resident.in_use == 2
    assert memory.loading("m") and not memory.loading("other")
    clock.advance(1.5)
    assert memory.in_memory("m") and memory.claim("m").wait == 0 and not memory.loading("m")


def test_the_keep_alive_starts_when_the_last_request_ends() -> None:
    clock = Clock()
    memory = Memory(clock, load_delay=1.0, keep_alive=30.0, warm=())
    claim = memory.claim("m")
    clock.advance(100.0)  # a long generation: in use, never expires
    assert memory.in_memory("m")
    assert memory.resident()[0].expires_at == 130.0
    memory.release(claim)
    memory.release(claim)  # twice is once
    assert memory.resident()[0].expires_at == 130.0
    clock.advance(29.0)
    assert memory.in_memory("m")
    clock.advance(1.0)
    assert not memory.in_memory("m") and memory.resident() == []
    assert memory.claim("m").wait == 1.0 and memory.loads == 2


def test_warm_models_and_no_keep_alive_stay_for_good() -> None:
    clock = Clock()
    memory = Memory(clock, load_delay=5.0, keep_alive=None, warm=["m"])
    clock.advance(10**6)
    assert memory.in_memory("m") and memory.claim("m").wait == 0 and memory.loads == 0
    assert memory.resident()[0].expires_at is None
    memory.unload()
    assert not memory.in_memory("m")


# -- capacity: Ollama's OLLAMA_MAX_LOADED_MODELS and eviction (server/sched.go) ------------------


def eviction_order(*models: str) -> list[str]:
    """Ollama's order among models with the same keep-alive: by model path (the sim's stand-in,
    the SHA-256 of the name), nothing to do with use."""
    return sorted(models, key=lambda m: hashlib.sha256(m.encode()).hexdigest())


def wait(claim: Claim) -> float | None:
    """The claim's wait now (a call, so a type checker does not keep an earlier reading)."""
    return claim.wait


def names(memory: Memory) -> set[str]:
    return {r.model for r in memory.resident()}


def full(clock: Clock, *models: str, max_loaded: int = 2) -> Memory:
    """A memory at its cap: ``models`` loaded one after the other and idle."""
    memory = Memory(clock, load_delay=1.0, keep_alive=30.0, warm=(), max_loaded=max_loaded)
    for model in models:
        memory.release(memory.claim(model))
        clock.advance(1.0)
    assert names(memory) == set(models)
    return memory


def test_a_load_past_the_cap_evicts_an_idle_model_at_once() -> None:
    clock = Clock()
    memory = full(clock, "a", "b")
    claim = memory.claim("c")
    assert claim.wait == 1.0 and memory.loads == 3 and memory.evictions == 1
    gone = eviction_order("a", "b")[0]
    assert names(memory) == {"a", "b", "c"} - {gone}
    # Capacity counts the loading model: the next new model, once that load is done (one at
    # a time), evicts again.
    memory.release(claim)
    again = memory.claim(gone)
    assert wait(again) is None and memory.evictions == 1
    clock.advance(1.0)
    assert wait(again) == 1.0 and memory.evictions == 2 and len(memory.resident()) == 2
    memory.release(again)


def test_the_victim_is_chosen_by_path_not_by_how_recently_it_was_used() -> None:
    """Ollama sorts by keep-alive, then model path; the model just used may go first."""
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, second, first)  # ``first`` is the most recently used
    memory.claim("c")
    assert names(memory) == {second, "c"}


def test_a_busy_model_is_never_evicted_while_an_idle_one_is_there() -> None:
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    busy = memory.claim(first)
    assert busy.wait == 0
    memory.claim("c")
    assert names(memory) == {first, "c"} and memory.evictions == 1
    memory.release(busy)


def test_with_every_model_busy_the_load_waits_for_the_chosen_one_to_end() -> None:
    """No idle model: Ollama picks the first by its order anyway, unloads it when its last
    request ends (no keep-alive), and only then loads."""
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    on_first, on_second = memory.claim(first), memory.claim(second)
    told: list[float] = []
    waiting = memory.claim("c")
    waiting.admitted = told.append
    assert wait(waiting) is None and memory.waiting == 1 and memory.loads == 2
    clock.advance(5.0)
    memory.release(on_second)  # not the one chosen: the load still waits
    assert wait(waiting) is None and told == [] and names(memory) == {first, second}
    clock.advance(2.0)
    memory.release(on_first)
    assert told == [1.0] and wait(waiting) == 1.0 and memory.evictions == 1
    assert names(memory) == {second, "c"} and memory.loads == 3 and memory.waiting == 0


def both_busy(clock: Clock) -> tuple[Memory, Claim, Claim]:
    """A memory at its cap of two, a request running on each model: on the first in eviction
    order (the one a load will choose), then on the second."""
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    return memory, memory.claim(first), memory.claim(second)


def test_a_request_for_a_model_in_memory_passes_a_load_waiting_for_room() -> None:
    """``getRunner`` hands a loaded model's runner over at once, queue or not -- the model
    chosen to make room included, which then stays busy longer."""
    memory, on_first, on_second = both_busy(Clock())
    first, second = on_first.model, on_second.model
    told: list[float] = []
    blocked = memory.claim("c")
    blocked.admitted = told.append
    assert wait(memory.claim(second)) == 0 and memory.waiting == 1
    passing = memory.claim(first)  # the model chosen to go
    assert wait(passing) == 0
    memory.release(on_first)
    assert told == [] and names(memory) == {first, second}
    memory.release(passing)
    assert told == [1.0] and names(memory) == {second, "c"}
    memory.release(on_second)


def test_the_pending_queue_goes_in_arrival_order_behind_a_load_waiting_for_room() -> None:
    """What is not in memory waits in Ollama's pending queue, served one at a time: a model
    that is neither loaded nor loading waits behind the blocked load, whatever its room."""
    clock = Clock()
    memory, on_first, on_second = both_busy(clock)
    order: list[str] = []
    blocked = memory.claim("c")
    blocked.admitted = lambda wait: order.append("c")
    behind = memory.claim("d")
    behind.admitted = lambda wait: order.append("d")
    assert wait(behind) is None and memory.waiting == 2
    memory.release(on_first)
    assert order == ["c"] and memory.loads == 3  # one load at a time
    clock.advance(1.0)
    assert order == ["c"]  # "d" needs room too, and both models are busy
    memory.release(blocked)
    assert order == ["c", "d"] and memory.loads == 4
    for claim in (on_second, behind):
        memory.release(claim)


def test_a_request_that_leaves_while_waiting_takes_nothing_with_it() -> None:
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    on_first, on_second = memory.claim(first), memory.claim(second)
    waiting = memory.claim("c")
    memory.release(waiting)
    assert memory.waiting == 0 and memory.loads == 2
    # The model chosen to make room goes all the same once idle, as in Ollama.
    memory.release(on_first)
    assert names(memory) == {second} and memory.evictions == 1
    memory.release(on_second)


def test_a_keep_alive_running_out_meanwhile_makes_room_sooner() -> None:
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    on_first, on_second = memory.claim(first), memory.claim(second)
    told: list[float] = []
    waiting = memory.claim("c")
    waiting.admitted = told.append
    memory.release(on_second)  # idle: its 30 s keep-alive starts
    clock.advance(29.9)
    assert told == []
    clock.advance(0.1)  # a timer, not the next question, lets the load in
    assert told == [1.0] and names(memory) == {first, "c"} and memory.evictions == 0
    memory.release(on_first)  # still chosen to go: unloaded as soon as it is idle
    assert names(memory) == {"c"} and memory.evictions == 1


def test_closing_leaves_no_timer_behind() -> None:
    """An engine stopped while a load waits for room leaves no pending call on the reactor."""
    clock = Clock()
    first, second = eviction_order("a", "b")
    memory = full(clock, first, second)
    memory.claim(first)
    on_second = memory.claim(second)
    memory.claim("c")
    memory.release(on_second)
    assert clock.getDelayedCalls()
    memory.close()
    assert clock.getDelayedCalls() == []


def test_without_a_cap_any_number_of_models_stay_loaded_one_at_a_time() -> None:
    """``processPending`` loads one model at a time: each load waits for the one before."""
    clock = Clock()
    memory = Memory(clock, load_delay=1.0, keep_alive=None, warm=())
    claims = [memory.claim(model) for model in "abcdefgh"]
    for n in range(8):
        assert [wait(c) for c in claims] == [1.0] * (n + 1) + [None] * (7 - n)
        assert memory.loads == n + 1
        clock.advance(1.0)
    assert len(memory.resident()) == 8 and memory.evictions == 0


def test_the_cap_is_checked() -> None:
    clock = Clock()
    with pytest.raises(ValueError, match="at least 1"):
        Memory(clock, load_delay=1.0, keep_alive=None, warm=(), max_loaded=0)
    with pytest.raises(ValueError, match="more than max_loaded"):
        Memory(clock, load_delay=1.0, keep_alive=None, warm=["a", "b"], max_loaded=1)


# -- through the dialects, on loopback -----------------------------------------------------------

LOAD = 0.3


def ollama_generate(stream: bool = False) -> dict[str, object]:
    return {"model": "m1", "prompt": "hi", "stream": stream}


@pytest_twisted.ensureDeferred
async def test_ollama_cold_start_and_keep_alive(start: Start) -> None:
    engine = start("ollama", ["m1", "m2"], load_delay=LOAD, keep_alive=0.5, warm=["m2"])
    listed = (await fetch("GET", engine.url + "/api/ps")).json()["models"]
    assert [m["name"] for m in listed] == ["m2:latest"]
    began = reactor.seconds()
    first = Deferred.fromCoroutine(send("POST", engine.url + "/api/generate", ollama_generate()))
    await sleep(0.1)
    # Loading: Ollama lists the runner already.
    loading = (await fetch("GET", engine.url + "/api/ps")).json()["models"]
    assert {m["name"] for m in loading} == {"m1:latest", "m2:latest"}
    response = await first
    assert response.code == 200 and reactor.seconds() - began >= LOAD
    await treq.content(response)
    warm = await fetch("POST", engine.url + "/api/generate", ollama_generate())
    assert warm.status == 200 and engine.memory.loads == 1
    entry = next(
        m
        for m in (await fetch("GET", engine.url + "/api/ps")).json()["models"]
        if m["name"] == "m1:latest"
    )
    expires = datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
    assert 0 < expires.timestamp() - datetime.now(UTC).timestamp() <= 0.6
    assert entry["size_vram"] == entry["size"]
    await sleep(0.6)
    assert (await fetch("GET", engine.url + "/api/ps")).json()["models"] == []
    began = reactor.seconds()
    again = await fetch("POST", engine.url + "/api/generate", ollama_generate())
    assert again.status == 200 and reactor.seconds() - began >= LOAD
    assert engine.memory.loads == 2


async def ps(engine: SimEngine) -> list[str]:
    return [m["name"] for m in (await fetch("GET", engine.url + "/api/ps")).json()["models"]]


@pytest_twisted.ensureDeferred
async def test_ollama_evicts_past_max_loaded_and_api_ps_shows_it(start: Start) -> None:
    engine = start("ollama", ["m1", "m2"], load_delay=LOAD, keep_alive=30, max_loaded=1, warm=())
    assert (await fetch("POST", engine.url + "/api/generate", ollama_generate())).status == 200
    assert await ps(engine) == ["m1:latest"]
    began = reactor.seconds()
    other = await fetch("POST", engine.url + "/api/generate", {**ollama_generate(), "model": "m2"})
    assert other.status == 200 and reactor.seconds() - began >= LOAD
    assert await ps(engine) == ["m2:latest"]
    assert engine.memory.loads == 2 and engine.memory.evictions == 1


@pytest_twisted.ensureDeferred
async def test_ollama_holds_a_load_until_the_busy_model_it_evicts_is_done(start: Start) -> None:
    """Every model busy: the new model's headers wait for the running answer to end, then for
    the load; /api/ps keeps listing the busy model meanwhile."""
    engine = start(
        "ollama", ["m1", "m2"], load_delay=LOAD, max_loaded=1, chunk_interval=0.15, warm=["m1"]
    )
    running = await send("POST", engine.url + "/api/generate", ollama_generate(stream=True))
    asked = Deferred.fromCoroutine(
        send("POST", engine.url + "/api/generate", {**ollama_generate(), "model": "m2"})
    )
    await eventually(lambda: engine.memory.waiting == 1)
    assert await ps(engine) == ["m1:latest"]
    await treq.content(running)
    ended = reactor.seconds()
    waited = await asked
    assert waited.code == 200 and reactor.seconds() - ended >= LOAD - 0.05
    await treq.content(waited)
    assert await ps(engine) == ["m2:latest"] and engine.memory.evictions == 1


@pytest_twisted.ensureDeferred
async def test_lmstudio_evicts_too_and_says_not_loaded(start: Start) -> None:
    engine = start("lmstudio", ["a/m1", "a/m2"], load_delay=LOAD, max_loaded=1, warm=["a/m1"])
    path, body = INFERENCE["lmstudio"]
    assert (await fetch("POST", engine.url + path, {**body, "model": "a/m2"})).status == 200
    states = (await fetch("GET", engine.url + "/api/v0/models")).json()["data"]
    assert [s["state"] for s in states] == ["not-loaded", "loaded"]


def test_warm_defaults_to_as_many_models_as_fit() -> None:
    engine = SimEngine(reactor, "ollama", models=["m1", "m2", "m3"], max_loaded=2)
    assert [r.model for r in engine.memory.resident()] == ["m1", "m2"]


@pytest_twisted.ensureDeferred
async def test_a_failed_request_loads_nothing(start: Start) -> None:
    engine = start("ollama", ["m1"], load_delay=LOAD, warm=(), faults=Faults(status=500))
    assert (await fetch("POST", engine.url + "/api/generate", ollama_generate())).status == 500
    engine.faults.clear()
    missing = await fetch("POST", engine.url + "/api/generate", {"model": "nope", "prompt": "x"})
    assert missing.status == 404
    assert engine.memory.loads == 0


@pytest_twisted.ensureDeferred
async def test_lmstudio_jit_load_holds_a_streams_first_byte(start: Start) -> None:
    """LM Studio sends a stream's headers on accept; the load delays the first byte."""
    engine = start("lmstudio", ["a/m1", "a/m2"], load_delay=LOAD, warm=())
    states = (await fetch("GET", engine.url + "/api/v0/models")).json()["data"]
    assert [s["state"] for s in states] == ["not-loaded", "not-loaded"]
    path, body = INFERENCE["lmstudio"]
    began = reactor.seconds()
    response = await send("POST", engine.url + path, {**body, "model": "a/m1"})
    headers_at = reactor.seconds() - began
    await treq.content(response)
    assert headers_at < LOAD <= reactor.seconds() - began
    states = (await fetch("GET", engine.url + "/api/v0/models")).json()["data"]
    assert [s["state"] for s in states] == ["loaded", "not-loaded"]
    rest = (await fetch("GET", engine.url + "/api/v1/models")).json()["models"]
    assert [bool(m["loaded_instances"]) for m in rest] == [True, False]


@pytest_twisted.ensureDeferred
async def test_llamacpp_loads_at_start_answering_503_everywhere(start: Start) -> None:
    engine = start("llamacpp", ["tiny"], load_delay=LOAD, warm=())
    for path in ("/health", "/v1/models", "/slots", "/props"):
        loading = await fetch("GET", engine.url + path)
        assert loading.status == 503, path
        assert loading.json()["error"] == {
            "message": "Loading model",
            "type": "unavailable_error",
            "code": 503,
        }
    path, body = INFERENCE["llamacpp"]
    assert (await fetch("POST", engine.url + path, body)).status == 503
    await sleep(LOAD)
    assert (await fetch("GET", engine.url + "/health")).json() == {"status": "ok"}
    assert (await fetch("POST", engine.url + path, body)).status == 200


@pytest_twisted.ensureDeferred
async def test_llamacpp_slots_are_busy_while_generating(start: Start) -> None:
    engine = start("llamacpp", ["tiny"], parallel=2, faults=Faults(stall=True))
    path, body = INFERENCE["llamacpp"]
    stalled = await send("POST", engine.url + path, body)
    assert stalled.code == 200
    slots = (await fetch("GET", engine.url + "/slots")).json()
    # The slot it really runs in: a fresh server starts on its highest (promptcache.py).
    assert [s["is_processing"] for s in slots] == [False, True]
    assert (await fetch("GET", engine.url + "/props")).json()["total_slots"] == 2
    await engine.refuse()


def test_the_runner_refuses_a_negative_load_delay(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--serve", "ollama", "0", "n", "m", "--load-delay", "-1"])
    assert "must not be negative" in capsys.readouterr().err


def test_the_runner_refuses_a_cap_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--serve", "ollama", "0", "n", "m", "--max-loaded", "0"])
    assert "--max-loaded must be at least 1" in capsys.readouterr().err
