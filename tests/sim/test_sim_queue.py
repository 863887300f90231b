# -*- test-case-name: tests.sim.test_sim_queue -*-
"""The simulated engines queue as the real ones do when saturated (issue 30 item 5;
docs/fleet-scheduling.md#simulated-engines): llama-server's slots and deferred tasks, Ollama's
``OLLAMA_NUM_PARALLEL`` per model, ``OLLAMA_MAX_QUEUE`` and its one-model swaps in arrival
order, LM Studio's Max Concurrent Predictions. On a Clock through an in-memory agent, then a few
through real sockets with real clients."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import ollama
import pytest
import pytest_twisted
import treq
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.task import Clock
from twisted.internet.threads import deferToThread
from twisted.web.iweb import IResponse

from nvpair.sim import Faults, SimEngine
from nvpair.sim.__main__ import main
from nvpair.sim.ollama import MAX_QUEUE_ERROR
from nvpair.sim.turns import Turns
from tests.sim.test_sim import (
    CHAT,
    REPO,
    Start,
    _BodyBytes,
    _MemoryAgent,
    eventually,
    pieces,
    raw_connect,
    send,
    start,
)

__all__ = ["start"]  # the listening engines of test_sim, a fixture

# -- the turns themselves -------------------------------------------------------------------------


def test_turns_beyond_the_places_wait_in_arrival_order() -> None:
    turns = Turns(2)
    first, second = turns.take("m"), turns.take("m")
    started: list[str] = []
    waiting = []
    for name in ("third", "fourth", "fifth"):
        turn = turns.take("m")
        turn.started = partial(started.append, name)
        waiting.append(turn)
    assert (first.running, second.running) == (True, True)
    assert not any(t.running for t in waiting) and turns.waiting("m") == 3
    turns.end(second)
    assert started == ["third"] and turns.running("m") == 2 and turns.waiting() == 2
    turns.end(first)
    turns.end(first)  # twice is once
    assert started == ["third", "fourth"] and turns.running() == 2


def test_a_waiter_that_leaves_never_starts() -> None:
    turns = Turns(1)
    running = turns.take("m")
    started: list[str] = []
    gone, staying = turns.take("m"), turns.take("m")
    gone.started = lambda: started.append("gone")
    staying.started = lambda: started.append("staying")
    turns.end(gone)
    assert turns.waiting() == 1
    turns.end(running)
    assert started == ["staying"]


def test_lanes_are_counted_apart() -> None:
    """Ollama's semaphore and LM Studio's limit are per model."""
    turns = Turns(1)
    assert turns.take("a").running and turns.take("b").running
    assert not turns.take("a").running and turns.waiting("a") == 1 and turns.waiting("b") == 0


def test_a_freed_slot_goes_first_to_the_waiter_that_asked_for_it() -> None:
    """``pop_deferred_task``: the first deferred task with that ``id_slot``, else the oldest;
    one pinned to a slot still busy is deferred again, at the back, even with a slot idle."""
    busy = {0, 1}
    turns = Turns(2, lambda slot: slot not in busy)
    on_zero, on_one = turns.take(""), turns.take("")
    order: list[str] = []
    for name, pin in (("any", None), ("on-1", 1), ("on-0", 0)):
        turns.take("", pin).started = partial(order.append, name)
    busy.discard(1)
    turns.end(on_one, slot=1)
    assert order == ["on-1"]
    busy.add(1)
    busy.discard(0)
    turns.end(on_zero, slot=0)
    assert order == ["on-1", "on-0"]
    assert turns.waiting() == 1


def test_a_waiter_pinned_to_a_busy_slot_goes_to_the_back_and_the_idle_slot_stays_idle() -> None:
    busy = {0, 1}
    turns = Turns(2, lambda slot: slot not in busy)
    on_zero = turns.take("")
    turns.take("")
    pinned = turns.take("", 1)
    loose = turns.take("")
    busy.discard(0)
    turns.end(on_zero, slot=0)  # the oldest is tried: pinned to slot 1, still busy
    assert not pinned.running and not loose.running and turns.running() == 1
    arrival = turns.take("")  # a new task finds slot 0 idle
    assert arrival.running


def test_turns_need_a_place() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Turns(0)


# -- engines on a Clock ---------------------------------------------------------------------------


class Asked:
    """One request through the in-memory agent: when its headers came, and its body."""

    def __init__(self, rig: Rig, path: str, body: object, method: bytes = b"POST") -> None:
        self.rig = rig
        self.headers_at: float | None = None
        self.status: int | None = None
        self.body = b""
        self.done_at: float | None = None
        self.failed = False
        data = None if body is None else _BodyBytes(json.dumps(body).encode())
        d = rig.agent.request(method, b"http://sim" + path.encode(), None, data)
        d.addCallbacks(self._response, self._failed)

    def _response(self, response: IResponse) -> None:
        self.headers_at, self.status = self.rig.clock.seconds(), response.code
        collected = treq.collect(response, self._data)
        collected.addCallbacks(self._done, self._failed)

    def _data(self, data: bytes) -> None:
        self.body += data

    def _done(self, _: object) -> None:
        self.done_at = self.rig.clock.seconds()

    def _failed(self, reason: object) -> None:
        self.failed = True

    @property
    def started(self) -> bool:
        return self.headers_at is not None

    def json(self) -> Any:
        return json.loads(self.body)


class Rig:
    """An engine on a Clock, reached through treq's in-memory agent."""

    def __init__(self, dialect: str, models: Sequence[str] = ("m1",), **kwargs: Any) -> None:
        self.clock = Clock()
        kwargs.setdefault("chunk_interval", 1.0)
        self.engine = SimEngine(self.clock, dialect, models=models, **kwargs)
        make_agent = cast(Any, RequestTraversalAgent)
        self.agent: _MemoryAgent = make_agent(self.engine.resource())

    def ask(self, path: str, body: object, method: bytes = b"POST") -> Asked:
        asked = Asked(self, path, body, method)
        self.agent.flush()
        self.advance(0)  # what is due now (a stream's first chunk) happens now
        return asked

    def advance(self, seconds: float) -> None:
        """Move time on in small steps, so that each timed call's writes are delivered."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(0.25, end - self.clock.seconds()))
            self.agent.flush()
        self.clock.advance(0)
        self.agent.flush()


#: Three tokens, a second apart: a stream's body lasts three seconds after its headers.
TOKENS = ["t"] * 3
NATIVE = "/completion", {"prompt": "why is the sky blue", "stream": True}


def test_llamacpp_defers_past_its_slots_with_no_headers_and_serves_in_arrival_order() -> None:
    """-np 2: the third and fourth requests get nothing, not even headers, until a slot frees;
    each freed slot starts exactly one of them, the oldest first."""
    rig = Rig("llamacpp", ["tiny"], parallel=2, tokens=TOKENS)
    path, body = NATIVE
    first = rig.ask(path, body)
    rig.advance(1)
    second = rig.ask(path, body)
    rig.advance(0.5)
    third, fourth = rig.ask(path, body), rig.ask(path, body)
    assert (first.headers_at, second.headers_at) == (0, 1)
    assert not third.started and not fourth.started
    assert (rig.engine.running, rig.engine.queued, rig.engine.headers_sent) == (2, 2, 2)
    rig.advance(1.5)  # t=3: the first is done
    assert first.done_at == 3 and third.headers_at == 3 and not fourth.started
    rig.advance(1)  # t=4: the second is done
    assert second.done_at == 4 and fourth.headers_at == 4
    rig.advance(3)
    assert (third.done_at, fourth.done_at) == (6, 7)
    assert (rig.engine.running, rig.engine.queued, rig.engine.in_flight) == (0, 0, 0)


def test_llamacpp_slots_show_which_slots_are_busy_and_never_the_deferred() -> None:
    rig = Rig("llamacpp", ["tiny"], parallel=2, tokens=TOKENS)
    path, body = NATIVE
    for _ in range(3):
        rig.ask(path, body)

    def slots(query: str = "") -> Asked:
        return rig.ask("/slots" + query, None, b"GET")

    listed = slots()
    assert [s["is_processing"] for s in listed.json()] == [True, True]
    assert rig.engine.queued == 1
    assert slots("?fail_on_no_slot=1").status == 503
    rig.advance(3)  # the first two done, the third running in the slot last freed
    assert sum(s["is_processing"] for s in slots().json()) == 1


def test_a_deferred_llamacpp_request_reads_the_cache_of_the_slot_it_gets() -> None:
    """The slot, and what it kept, is known only when the deferred request starts: a
    conversation's next turn, deferred behind its first, finds that first turn in cache."""
    rig = Rig("llamacpp", ["tiny"], parallel=1, tokens=TOKENS)
    turn1 = [CHAT]
    turn2 = [CHAT, {"role": "assistant", "content": "t t t"}, {"role": "user", "content": "why"}]
    first = rig.ask("/v1/chat/completions", {"messages": turn1, "stream": True})
    second = rig.ask("/v1/chat/completions", {"messages": turn2})
    rig.advance(10)
    assert first.done_at is not None and second.done_at is not None
    assert second.headers_at == second.done_at >= first.done_at
    assert second.json()["timings"]["cache_n"] == 5


def test_a_stalled_answer_holds_its_slot_and_a_killed_one_frees_it() -> None:
    rig = Rig("llamacpp", ["tiny"], parallel=1, tokens=TOKENS)
    path, body = NATIVE
    rig.engine.faults.die_after_chunks = 1
    dying = rig.ask(path, body)
    rig.engine.faults.clear()
    waiting = rig.ask(path, body)
    rig.advance(0.5)
    assert dying.failed and waiting.headers_at == 0
    rig.engine.faults.stall = True
    rig.advance(5)
    stalled = rig.ask(path, body)
    rig.engine.faults.clear()
    behind = rig.ask(path, body)
    rig.advance(60)
    assert stalled.started and stalled.done_at is None and not behind.started


def test_the_fault_delays_count_from_the_turn() -> None:
    rig = Rig("llamacpp", ["tiny"], parallel=1, tokens=TOKENS)
    path, body = NATIVE
    first = rig.ask(path, body)
    rig.engine.faults.header_delay = 2.0
    second = rig.ask(path, body)
    rig.advance(10)
    assert (first.done_at, second.headers_at, second.done_at) == (3, 5, 8)


def test_an_error_takes_no_turn() -> None:
    """Errors are answered at once, however busy the engine: a bad body, a failing engine."""
    rig = Rig("llamacpp", ["tiny"], parallel=1, tokens=TOKENS)
    path, body = NATIVE
    rig.ask(path, body)
    bad = rig.ask(path, {"stream": True})
    rig.engine.faults.status = 503
    failing = rig.ask(path, body)
    assert (bad.status, failing.status) == (400, 503)
    assert rig.engine.queued == 0


def test_ollama_runs_num_parallel_per_model_and_the_rest_wait_without_headers() -> None:
    """OLLAMA_NUM_PARALLEL is 1 by default, per model: a second request for the same model
    waits, headers included; one for another model runs beside it."""
    rig = Rig("ollama", ["m1", "m2"], tokens=TOKENS)
    stream = {"model": "m1", "prompt": "hi"}
    first, second = rig.ask("/api/generate", stream), rig.ask("/api/generate", stream)
    other = rig.ask("/api/generate", {**stream, "model": "m2"})
    rig.clock.advance(0)
    rig.agent.flush()
    assert first.started and other.started and not second.started
    rig.advance(3)
    assert first.done_at == 3 and second.headers_at == 3
    with_two = Rig("ollama", ["m1"], tokens=TOKENS, parallel=2)
    both = [with_two.ask("/api/generate", stream) for _ in range(3)]
    assert [asked.started for asked in both] == [True, True, False]


def test_ollama_answers_503_past_max_queue_with_its_own_body() -> None:
    """Requests for a model not in memory wait in the scheduler's queue, OLLAMA_MAX_QUEUE deep
    (the one being scheduled is out of it); one more is refused with ErrMaxQueue, on the OpenAI
    routes in their error shape. A request for the model in memory is never refused."""
    rig = Rig("ollama", ["a", "b", "c", "d"], tokens=TOKENS, warm=["a"], max_loaded=1, max_queue=2)
    running = rig.ask("/api/generate", {"model": "a", "prompt": "hi"})
    swapping = rig.ask("/api/generate", {"model": "b", "prompt": "hi"})  # being scheduled
    queued = [rig.ask("/api/generate", {"model": m, "prompt": "hi"}) for m in ("c", "d")]
    refused = rig.ask("/api/generate", {"model": "b", "prompt": "hi"})
    v1 = rig.ask("/v1/chat/completions", {"model": "c", "messages": [CHAT]})
    loaded = rig.ask("/api/generate", {"model": "a", "prompt": "hi"})
    assert running.started and not swapping.started and not any(q.started for q in queued)
    assert refused.status == 503
    assert refused.body == json.dumps({"error": MAX_QUEUE_ERROR}, separators=(",", ":")).encode()
    assert v1.status == 503 and v1.json()["error"]["message"] == MAX_QUEUE_ERROR
    assert v1.json()["error"]["type"] == "api_error"
    assert not loaded.started and not loaded.failed  # waiting for its turn, not refused
    assert rig.engine.refused == 2


def test_the_max_queue_knob() -> None:
    clock = Clock()
    engine = SimEngine(clock, "ollama", models=["a"], warm=(), load_delay=5, max_queue=0)
    assert engine.memory.max_queue == 0
    assert SimEngine(clock, "ollama", models=["a"]).memory.max_queue == 512
    assert SimEngine(clock, "lmstudio", models=["a"]).memory.max_queue is None


def test_ollama_swaps_its_one_model_in_arrival_order_each_swap_a_load() -> None:
    """max_loaded=1 (a small box), 3 s loads, requests A B A C at once: Ollama's scheduler
    takes what is not loaded one at a time, in order, and waits for the model in memory to go
    idle before each swap -- the second A, queued while A loaded, comes after B."""
    rig = Rig("ollama", ["a", "b", "c"], tokens=TOKENS, warm=(), load_delay=3.0, max_loaded=1)
    asked = [rig.ask("/api/generate", {"model": m, "prompt": "hi"}) for m in "abac"]
    rig.advance(30)
    assert [a.headers_at for a in asked] == [3, 9, 15, 21]
    assert [a.done_at for a in asked] == [6, 12, 18, 24]
    assert (rig.engine.memory.loads, rig.engine.memory.evictions) == (4, 3)


def test_ollama_a_request_for_the_model_in_memory_passes_a_waiting_swap() -> None:
    """What is loaded is handed over at once: the second A, asked once A is ready, runs before
    the swap to B, which waits for A to go idle."""
    rig = Rig("ollama", ["a", "b"], tokens=TOKENS, warm=(), load_delay=3.0, max_loaded=1)
    first = rig.ask("/api/generate", {"model": "a", "prompt": "hi"})
    swap = rig.ask("/api/generate", {"model": "b", "prompt": "hi"})
    rig.advance(4)
    again = rig.ask("/api/generate", {"model": "a", "prompt": "hi"})
    rig.advance(20)
    assert (first.headers_at, again.headers_at, swap.headers_at) == (3, 6, 12)
    assert rig.engine.memory.loads == 2


def test_lmstudio_queues_past_max_concurrent_predictions_headers_on_accept() -> None:
    """Max Concurrent Predictions, 4 by default: a fifth stream has its headers at once, as
    LM Studio sends them on accept, and its first byte when a prediction ends."""
    rig = Rig("lmstudio", ["a/m1"], tokens=TOKENS)
    body = {"model": "a/m1", "messages": [CHAT], "stream": True}
    asked = [rig.ask("/v1/chat/completions", body) for _ in range(5)]
    rig.advance(1.5)
    assert all(a.started for a in asked)
    assert all(a.body for a in asked[:4]) and asked[4].body == b""
    assert rig.engine.queued == 1 and rig.engine.running == 4
    rig.advance(10)
    assert asked[4].done_at is not None and asked[4].done_at > max(
        a.done_at or 0 for a in asked[:4]
    )


@pytest.mark.parametrize(("dialect", "default"), [("llamacpp", 4), ("ollama", 1), ("lmstudio", 4)])
def test_parallel_defaults_to_the_engines_own(dialect: str, default: int) -> None:
    assert SimEngine(Clock(), dialect, models=["m1"]).parallel == default


# -- real sockets, real clients ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_treq_sees_llamacpp_serve_one_slot_in_arrival_order(start: Start) -> None:
    """-np 1 over loopback: three streams at once come back one after the other, in the order
    the engine received them."""
    engine = start("llamacpp", ["tiny"], parallel=1, chunk_interval=0.05)

    async def timed(prompt: str) -> list[tuple[float, bytes]]:
        body = {"prompt": prompt, "stream": True}
        return await pieces(await send("POST", engine.url + "/completion", body))

    # Read concurrently, so that each piece is timed as it arrives.
    reading = [ensureDeferred(timed(f"p{n}")) for n in range(3)]
    await eventually(lambda: engine.queued == 2)
    assert engine.headers_sent == 1
    times = sorted(await gatherResults(reading))
    for before, after in itertools.pairwise(times):
        assert after[0][0] >= before[-1][0]
    # Each stream ends with the stop event, which names the prompt.
    ends = [b"".join(data for _, data in got).rstrip().split(b"\n\n")[-1] for got in times]
    served = [json.loads(end.removeprefix(b"data: "))["prompt"] for end in ends]
    assert served == [cast(Any, r.json())["prompt"] for r in engine.requests]


@pytest_twisted.ensureDeferred
async def test_a_deferred_client_that_leaves_is_dropped_and_one_that_stalls_is_cut(
    start: Start,
) -> None:
    """A stalled answer holds the one slot; the request behind it waits; once the stalled
    client goes away, the slot frees and the waiter is answered whole."""
    engine = start("llamacpp", ["tiny"], parallel=1, faults=Faults(stall=True))
    path, body = NATIVE
    held = await raw_connect(engine, path, body)
    await eventually(lambda: engine.headers_sent == 1)
    engine.faults.clear()
    gone = await raw_connect(engine, path, body)
    behind = ensureDeferred(send("POST", engine.url + path, body))
    await eventually(lambda: engine.queued == 2)
    assert gone.transport is not None and held.transport is not None
    gone.transport.loseConnection()
    await gone.ended
    await eventually(lambda: engine.queued == 1)
    held.transport.loseConnection()
    got = await pieces(await behind)
    assert b'"stop":true' in b"".join(data for _, data in got)
    assert engine.abandoned == 2 and gone.received == b""


@pytest_twisted.ensureDeferred
async def test_the_ollama_sdk_sees_one_answer_at_a_time_and_the_full_queue(start: Start) -> None:
    """The ollama client: two chats at once on the default OLLAMA_NUM_PARALLEL=1 run one after
    the other; a cold model behind a full scheduler queue is a ResponseError 503."""
    engine = start("ollama", ["m1", "m2"], chunk_interval=0.1)
    client = ollama.Client(host=engine.url)
    firsts: list[float] = []
    barrier = threading.Barrier(2)

    def chat(n: int) -> None:
        barrier.wait()
        lines = 0
        for _ in client.chat(model="m1", messages=[CHAT], stream=True):
            if not lines:
                firsts.append(time.monotonic())
            lines += 1
        assert lines == 5

    await deferToThread(lambda: [t.join() for t in _threads(chat, 2)])  # type: ignore[func-returns-value]
    # Each answer streams for 0.4 s (five lines 0.1 s apart): run together they would start
    # together.
    first, second = sorted(firsts)
    assert second - first >= 0.3

    cold = start("ollama", ["m1", "m2"], warm=(), load_delay=5, max_queue=0)
    loading = ensureDeferred(
        send("POST", cold.url + "/api/generate", {"model": "m1", "prompt": "hi"})
    )
    await eventually(lambda: cold.memory.loading("m1"))

    def refused() -> ollama.ResponseError:
        with pytest.raises(ollama.ResponseError) as raised:
            ollama.Client(host=cold.url).generate(model="m2", prompt="hi")
        return raised.value

    error = await deferToThread(refused)
    assert (error.status_code, error.error) == (503, MAX_QUEUE_ERROR)
    loading.addErrback(lambda _: None)
    loading.cancel()


def _threads(target: Any, n: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    return threads


def test_the_runner_takes_parallel_and_max_queue() -> None:
    """``python -m nvpair.sim --parallel 2 --max-queue 0``: llama.cpp lists two slots; on an
    Ollama that holds one model, busy, a request for another is being scheduled and one more
    finds the queue of no places full: 503."""
    command = [sys.executable, "-m", "nvpair.sim"]
    command += ["--serve", "llamacpp", "0", "n1", "tiny", "--serve", "ollama", "0", "n2", "a,b,c"]
    command += ["--parallel", "2", "--max-queue", "0", "--max-loaded", "1"]
    command += ["--chunk-interval", "5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        assert proc.stderr is not None
        ports = [int(proc.stderr.readline().split("port ")[1].split(")")[0]) for _ in range(2)]
        with opener.open(f"http://127.0.0.1:{ports[0]}/props", timeout=5) as answer:
            assert json.load(answer)["total_slots"] == 2

        def generate(model: str) -> Any:
            data = json.dumps({"model": model, "prompt": "hi"}).encode()
            url = f"http://127.0.0.1:{ports[1]}/api/generate"
            return opener.open(urllib.request.Request(url, data, method="POST"), timeout=1)

        with generate("a") as streaming:  # a twenty-second stream: "a" stays busy
            assert streaming.status == 200
            with pytest.raises(TimeoutError):
                generate("b")  # waits for "a" to go idle
            with pytest.raises(urllib.error.HTTPError) as refused:
                generate("c")
            assert refused.value.code == 503
            assert json.load(refused.value) == {"error": MAX_QUEUE_ERROR}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_runner_refuses_bad_queue_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    for knob, value, said in (
        ("--parallel", "0", "at least 1"),
        ("--max-queue", "-1", "must not be negative"),
    ):
        with pytest.raises(SystemExit):
            main(["--serve", "ollama", "0", "n", "m", knob, value])
        assert said in capsys.readouterr().err
