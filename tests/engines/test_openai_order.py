"""The ``openai`` facade's failover loop across engines, on a Clock (docs/openai-facade.md):
one order over every engine's owners, each node ranked by its own engine's load and health;
the owner wait woken by any engine's discovery; a workload's engine that of its node."""

from __future__ import annotations

from twisted.logger import capturedLogs

from nvpair.control.state import Node
from nvpair.engines.loadstate import LoadState
from nvpair.engines.table import ENGINES
from nvpair.fleet.health import HealthPolicy
from tests.fakes import Harness, Response, harness

POLICY = HealthPolicy(threshold=1, cooldown=5.0, cooldown_max=120.0)


def at(node_id: str, engine: str, *models: str) -> Node:
    """A node of ``engine`` at ``http://<engine>.<node>``: where a dispatch went says both."""
    keys = frozenset(ENGINES[engine].model_key(model) for model in models)
    return Node(node_id, False, f"http://{engine}.{node_id}", models, keys)


def fleet() -> Harness:
    h = harness(fleet=POLICY)
    h.nodes(at("a", "ollama", "qwen:latest"), engine="ollama")
    h.nodes(at("b", "llamacpp", "qwen"), engine="llamacpp")
    return h


def dispatched(h: Harness) -> list[str]:
    return [call.base.removeprefix("http://") for call in h.upstream.calls]


def test_the_owners_of_every_engine_are_candidates_in_one_order() -> None:
    """``qwen`` is Ollama's ``qwen:latest`` on ``a`` and llama.cpp's ``qwen`` on ``b``: ``a``
    first (node id), ``b`` after it fails, each dialled at its own engine's URL on the path
    the client used."""
    h = fleet()
    request, _ = h.serve("qwen", engine="openai")
    h.upstream.calls[0].answer(Response(503, b"busy"))
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert dispatched(h) == ["ollama.a", "llamacpp.b"]
    assert [call.uri for call in h.upstream.calls] == [b"/v1/chat/completions"] * 2
    assert request.body == b"ok"


def test_a_warm_node_of_one_engine_goes_before_a_cold_one_of_another() -> None:
    """Each node is ranked by its own engine's load state: llama.cpp's ``b`` has its model in
    memory, Ollama's ``a`` does not, so ``b`` goes first despite its id."""
    h = fleet()
    assert h.fleet is not None
    h.fleet.record_load("ollama", "a", LoadState(warm=frozenset({"other:latest"})))
    h.fleet.record_load("llamacpp", "b", LoadState(warm_all=True, slots=1, busy=0))
    h.serve("qwen", engine="openai")
    assert dispatched(h) == ["llamacpp.b"]


def test_one_machine_s_engines_are_held_back_each_on_its_own() -> None:
    """The same node id under two engines is two candidates: passive health holds back the
    engine that failed, not the machine's other engine."""
    h = harness(fleet=POLICY)
    h.nodes(at("box", "ollama", "qwen:latest"), engine="ollama")
    h.nodes(at("box", "llamacpp", "qwen"), engine="llamacpp")
    h.serve("qwen", engine="openai")
    h.upstream.calls[0].answer(Response(503, b""))
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert dispatched(h) == ["ollama.box", "llamacpp.box"]
    assert h.fleet is not None
    assert h.fleet.health.held("ollama", "box") and not h.fleet.health.held("llamacpp", "box")
    h.serve("qwen", engine="openai")
    assert dispatched(h)[2:] == ["llamacpp.box"]


def test_a_workload_s_engine_is_that_of_the_node_it_goes_to() -> None:
    """Submitted as the first candidate's engine, then each dispatch's; completed as the engine
    of the node that served it."""
    h = fleet()
    h.serve("qwen", engine="openai")
    h.upstream.calls[0].answer(Response(503, b""))
    h.upstream.calls[1].answer(Response(200, b"ok"))
    assert [(m, info["engine"], info.get("scheduledOn")) for m, info in h.workload_events()] == [
        ("workload:submitted", "ollama", None),
        ("workload:submitted", "ollama", "a"),
        ("workload:submitted", "ollama", None),
        ("workload:submitted", "llamacpp", "b"),
        ("workload:started", "llamacpp", "b"),
        ("workload:completed", "llamacpp", "b"),
    ]


def test_the_owner_wait_ends_when_another_engine_gains_the_model() -> None:
    """Every owner gone: the wait for one wakes on any engine's discovery, not only the first
    candidate's."""
    h = fleet()
    h.serve("qwen", engine="openai")
    # Both owners leave while the first attempt waits: it is abandoned, and nobody is left.
    h.nodes(engine="llamacpp")
    h.nodes(engine="ollama")
    assert h.upstream.calls[0].cancelled
    h.clock.advance(10.0)
    assert dispatched(h) == ["ollama.a"]
    h.nodes(at("c", "lmstudio", "qwen"), engine="lmstudio")
    h.clock.advance(1.0)
    assert dispatched(h) == ["ollama.a", "lmstudio.c"]


def test_every_owner_down_names_the_nodes_of_every_engine() -> None:
    h = fleet()
    assert h.fleet is not None
    h.fleet.away("ollama", "a", ["qwen:latest"])
    h.fleet.away("llamacpp", "b", ["qwen"])
    h.nodes(engine="ollama")
    h.nodes(engine="llamacpp")
    with capturedLogs():
        request, _ = h.serve("qwen", engine="openai")
    assert (request.status, request.reason()) == (502, "no-owner")
    assert request.json()["error"]["message"] == 'every node that serves model "qwen" is down: a, b'
