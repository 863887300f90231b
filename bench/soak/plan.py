"""Pure: the soak's fleet, the requests it sends and the faults it injects, drawn from a seeded
random source so a run can be repeated with ``--seed``.

Every node serves all three dialects. Per dialect one model is on every node, two models split
the nodes in pairs, and one model lives on node-4 alone, so a fault on node-4 can leave a model
with no owner at all. A model nobody advertises and a body that is not JSON are sent now and then
too: the proxy's own answers must not leak either.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Mapping, Sequence

import attrs

NODES = ("node-1", "node-2", "node-3", "node-4")
ENGINES = ("ollama", "lmstudio", "llamacpp")

#: Per engine: the model on every node, the pair models (node-1/2 and node-3/4), node-4's own.
MODELS: Mapping[str, tuple[str, str, str, str]] = {
    "ollama": ("llama3:latest", "qwen2:7b", "phi3:mini", "mistral:7b"),
    "lmstudio": ("qwen2.5-7b-instruct", "gemma-2-9b-it", "llama-3.2-3b-instruct", "phi-3.5-mini"),
    "llamacpp": ("tiny", "small", "medium", "large"),
}
UNKNOWN_MODEL = "nobody-has-this"

#: Allowed by every simulated engine's CORS policy; the foreign one is refused by Ollama.
LOCAL_ORIGIN = "http://localhost:5173"
FOREIGN_ORIGIN = "https://elsewhere.example"


def node_models(engine: str, node_index: int) -> tuple[str, ...]:
    """The models node ``NODES[node_index]`` advertises for ``engine``."""
    shared, first_pair, second_pair, solo = MODELS[engine]
    models = [shared, first_pair if node_index < 2 else second_pair]
    if node_index == len(NODES) - 1:
        models.append(solo)
    return tuple(models)


def fleet_toml(
    inventory_interval: str,
    facade_ports: Mapping[str, int],
    engine_urls: Mapping[str, Mapping[str, str]],
) -> str:
    """The standalone fleet file (docs/broker-protocol.md#standalone-fleet-mode).

    :param engine_urls: node id -> engine -> base URL.
    """
    lines = [f'inventory-interval = "{inventory_interval}"', ""]
    for engine, port in facade_ports.items():
        lines += [f"[facades.{engine}]", f"port = {port}", ""]
    for node, urls in engine_urls.items():
        lines += ["[[nodes]]", f'id = "{node}"', "[nodes.engines]"]
        lines += [f'{engine} = "{url}"' for engine, url in urls.items()]
        lines.append("")
    return "\n".join(lines)


class Ending(enum.Enum):
    """How the client ends its side of an exchange."""

    READ = "read"
    """Read the whole answer."""
    DROP_MID_STREAM = "drop-mid-stream"
    """Close the connection after the first body bytes."""
    GIVE_UP = "give-up"
    """Close the connection ``give_up_after`` seconds in, wherever the exchange is then: before
    the headers (in the middle of a failover, with luck) or in the body."""


@attrs.frozen
class RequestSpec:
    """One request to send through a facade.

    :param kind: what it exercises, for the report: ``inference``, ``stream``, ``inventory``,
        ``preflight`` or ``invalid``.
    :param fresh_connection: a connection of its own, closed after the answer (else pooled).
    """

    engine: str
    kind: str
    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    ending: Ending = Ending.READ
    give_up_after: float = 0.0
    fresh_connection: bool = False


_JSON = (("Content-Type", "application/json"),)
_INFERENCE_PATHS: Mapping[str, tuple[str, ...]] = {
    "ollama": ("/api/chat", "/api/generate", "/v1/chat/completions"),
    "lmstudio": ("/v1/chat/completions", "/v1/completions"),
    "llamacpp": ("/v1/chat/completions", "/completion"),
}
_INVENTORY_PATHS: Mapping[str, tuple[str, ...]] = {
    "ollama": ("/api/tags", "/v1/models"),
    "lmstudio": ("/v1/models", "/api/v0/models"),
    "llamacpp": ("/v1/models", "/models"),
}

#: Share of each request kind in the mix (the rest of a kind's draw decides its details).
KIND_WEIGHTS: Mapping[str, float] = {
    "inference": 0.33,
    "stream": 0.40,
    "inventory": 0.15,
    "preflight": 0.08,
    "invalid": 0.04,
}
DROP_SHARE = 0.08
"""Of streamed requests: the client disconnects after the first chunk."""
GIVE_UP_SHARE = 0.04
"""Of inference requests: the client closes the connection at a random moment."""
FRESH_SHARE = 0.15
"""Of all requests: on a connection of their own rather than a pooled one."""


def _model(rng: random.Random, engine: str) -> str:
    shared, first_pair, second_pair, solo = MODELS[engine]
    roll = rng.random()
    if roll < 0.6:
        return shared
    if roll < 0.85:
        return rng.choice((first_pair, second_pair))
    if roll < 0.96:
        return solo
    return UNKNOWN_MODEL


def _inference_body(path: str, model: str, stream: bool) -> bytes:
    text = "say something short"
    body: dict[str, object] = {"model": model, "stream": stream}
    if path.endswith("chat") or path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return json.dumps(body).encode()


def draw_request(rng: random.Random) -> RequestSpec:
    """One request of the mix."""
    engine = rng.choice(ENGINES)
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    fresh = rng.random() < FRESH_SHARE
    if kind in ("inference", "stream"):
        path = rng.choice(_INFERENCE_PATHS[engine])
        stream = kind == "stream"
        ending = Ending.READ
        give_up_after = 0.0
        roll = rng.random()
        if roll < GIVE_UP_SHARE:
            # Answers take 0.05-0.4 s unfaulted and up to tens of seconds under faults.
            ending, give_up_after = Ending.GIVE_UP, rng.choice((0.02, 0.1, 0.3, 1.0, 3.0, 8.0))
        elif stream and roll < GIVE_UP_SHARE + DROP_SHARE:
            ending = Ending.DROP_MID_STREAM
        body = _inference_body(path, _model(rng, engine), stream)
        return RequestSpec(engine, kind, "POST", path, body, _JSON, ending, give_up_after, fresh)
    if kind == "inventory":
        headers: tuple[tuple[str, str], ...] = ()
        if rng.random() < 0.3:
            headers = (("Origin", rng.choice((LOCAL_ORIGIN, FOREIGN_ORIGIN))),)
        path = rng.choice(_INVENTORY_PATHS[engine])
        return RequestSpec(engine, kind, "GET", path, None, headers, fresh_connection=fresh)
    if kind == "preflight":
        headers = (
            ("Origin", rng.choice((LOCAL_ORIGIN, LOCAL_ORIGIN, FOREIGN_ORIGIN))),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "content-type"),
        )
        path = rng.choice(_INFERENCE_PATHS[engine])
        return RequestSpec(engine, kind, "OPTIONS", path, None, headers, fresh_connection=fresh)
    path = rng.choice(_INFERENCE_PATHS[engine])
    body = rng.choice((b'{"model": "tiny", "messages": [', b"[1, 2]", b"\xff\xfe not json"))
    return RequestSpec(engine, kind, "POST", path, body, _JSON, fresh_connection=fresh)


# -- faults -------------------------------------------------------------------------------------


@attrs.frozen
class FaultSpec:
    """One fault for one simulated engine, held for ``hold`` seconds and then undone.

    :param kind: which knob of ``nvpair.sim.Faults`` (or ``refuse``: stop listening and abort
        every open connection, then listen again on the same port).
    :param value: the knob's value: a status code, seconds, or a chunk count.
    """

    kind: str
    value: float
    hold: float

    @property
    def label(self) -> str:
        if self.kind in ("stall", "refuse", "inventory-invalid"):
            return self.kind
        if self.kind in ("status", "inventory-status", "die-after-chunks"):
            return f"{self.kind} {self.value:.0f}"
        return f"{self.kind} {self.value:.1f}s"


#: Kinds and their weights. Delays straddle the soak's 5 s response-header timeout so some
#: attempts time out and fail over while others are merely slow.
FAULT_WEIGHTS: Mapping[str, float] = {
    "status": 3,
    "header-delay": 2,
    "first-byte-delay": 2,
    "stall": 1,
    "die-after-chunks": 2,
    "refuse": 1.5,
    "inventory-status": 1,
    "inventory-invalid": 0.5,
    "inventory-delay": 1,
}


def draw_fault(rng: random.Random, hold: tuple[float, float] = (3.0, 15.0)) -> FaultSpec:
    """One fault with its holding time."""
    kind = rng.choices(list(FAULT_WEIGHTS), weights=list(FAULT_WEIGHTS.values()))[0]
    value: float = 0.0
    if kind == "status":
        value = rng.choice((503, 503, 500, 429))
    elif kind == "inventory-status":
        value = rng.choice((500, 503))
    elif kind in ("header-delay", "first-byte-delay"):
        value = rng.uniform(0.5, 8.0)
    elif kind == "inventory-delay":
        value = rng.uniform(0.5, 6.0)
    elif kind == "die-after-chunks":
        value = rng.choice((0, 1, 2, 5))
    return FaultSpec(kind, value, rng.uniform(*hold))


def pick_target(rng: random.Random, healthy: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """A (node, engine) among those with no fault on them, or None when every one has one."""
    return rng.choice(list(healthy)) if healthy else None
