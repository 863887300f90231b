# -*- test-case-name: tests.test_sim_memory -*-
"""The simulated engines' cold-start knob (issue 13 item 1): a model not in memory answers its
first request only after the load delay, then stays warm until its keep-alive ends; each
dialect reports it as the real engine does (Ollama ``/api/ps``, LM Studio ``state``, llama.cpp
``/health`` 503 while loading and ``/slots`` busy while generating)."""

from __future__ import annotations

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
from nvpair.sim.memory import Memory
from tests.test_sim import INFERENCE, Start, fetch, send, sleep


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
    memory = Memory(clock.seconds, load_delay=2.0, keep_alive=30.0, warm=())
    assert not memory.in_memory("m") and memory.resident() == []
    assert memory.use("m") == 2.0 and memory.loads == 1
    clock.advance(0.5)
    assert memory.use("m") == 1.5 and memory.loads == 1  # the same load
    (resident,) = memory.resident()
    assert resident.loading(clock.seconds()) and resident.in_use == 2
    assert memory.loading("m") and not memory.loading("other")
    clock.advance(1.5)
    assert memory.in_memory("m") and memory.use("m") == 0 and not memory.loading("m")


def test_the_keep_alive_starts_when_the_last_request_ends() -> None:
    clock = Clock()
    memory = Memory(clock.seconds, load_delay=1.0, keep_alive=30.0, warm=())
    memory.use("m")
    clock.advance(100.0)  # a long generation: in use, never expires
    assert memory.in_memory("m")
    assert memory.resident()[0].expires_at == 130.0
    memory.done("m")
    assert memory.resident()[0].expires_at == 130.0
    clock.advance(29.0)
    assert memory.in_memory("m")
    clock.advance(1.0)
    assert not memory.in_memory("m") and memory.resident() == []
    assert memory.use("m") == 1.0 and memory.loads == 2


def test_warm_models_and_no_keep_alive_stay_for_good() -> None:
    clock = Clock()
    memory = Memory(clock.seconds, load_delay=5.0, keep_alive=None, warm=["m"])
    clock.advance(10**6)
    assert memory.in_memory("m") and memory.use("m") == 0 and memory.loads == 0
    assert memory.resident()[0].expires_at is None
    memory.unload()
    assert not memory.in_memory("m")


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
    assert [s["is_processing"] for s in slots] == [True, False]
    assert (await fetch("GET", engine.url + "/props")).json()["total_slots"] == 2
    await engine.refuse()


def test_the_runner_refuses_a_negative_load_delay(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--serve", "ollama", "0", "n", "m", "--load-delay", "-1"])
    assert "must not be negative" in capsys.readouterr().err
