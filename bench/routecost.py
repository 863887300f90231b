"""Per-request routing cost against fleet size, measured in-process.

A fleet file with hundreds of simulated nodes is heavy, and the routing is pure, so this calls
nvpair's own :class:`~nvpair.dispatch.candidates.Candidates` directly on a synthetic
:class:`~nvpair.control.state.ControlState`: 10,000 models spread over N nodes (each model on two of
them, so every request has a failover), and per request what the failover loop asks of it for an
inference round: the plan (owners, order, the node to reserve), then the live re-check and the
address of the node it dials first.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Sequence

from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.candidates import Candidates
from nvpair.dispatch.seams import PriorityScheduling
from nvpair.engines.table import LLAMACPP, RouteClass
from nvpair.facades.facade import Admitted

ENGINE = LLAMACPP.id


def fleet(nodes: int, models: int) -> ControlState:
    """``models`` models over ``nodes`` nodes, model i on nodes i and i+1 (mod ``nodes``)."""
    held: list[list[str]] = [[] for _ in range(nodes)]
    for i in range(models):
        for n in {i % nodes, (i + 1) % nodes}:
            held[n].append(f"model-{i}")
    control = ControlState()
    control.set_discovery(
        ENGINE,
        (
            Node(
                id=f"node-{n:03d}",
                local=False,
                # Never dialled (nothing leaves this process); loopback all the same.
                url=f"http://127.0.{n // 250}.{n % 250 + 1}:8080",
                models=tuple(names),
                model_keys=frozenset(LLAMACPP.model_key(name) for name in names),
            )
            for n, names in enumerate(held)
        ),
    )
    return control


def admitted(model: str) -> Admitted:
    """An inference request for ``model`` as the facade hands it on."""
    body = b'{"model": "%s"}' % model.encode()
    path = "/v1/chat/completions"
    key = LLAMACPP.model_key(model)
    return Admitted(LLAMACPP, RouteClass.INFERENCE, b"POST", path, path.encode(), body, model, key)


def route(candidates: Candidates, request: Admitted) -> str | None:
    """The routing work of one inference request: the address of the node it dials first."""
    for planned in candidates.plan(request).candidates:
        live = candidates.live(request, planned)
        if live is not None:
            return candidates.base_url(ENGINE, live)
    return None


def per_request_us(nodes: int, models: int, requests: int, seed: int = 1) -> float:
    """Microseconds of routing per request, the best of three passes over ``requests``
    random models (the best pass is the one least disturbed by the rest of the machine)."""
    control, reservations = fleet(nodes, models), Reservations()
    # Broker mode's order: the scheduler's priority list.
    candidates = Candidates(control, reservations, PriorityScheduling(control))
    # A few claims outstanding, as under load: the plan weighs them.
    for n in range(min(nodes, 8)):
        reservations.take(f"node-{n:03d}")
    rng = random.Random(seed)
    requests_ = [admitted(f"model-{rng.randrange(models)}") for _ in range(requests)]
    best = float("inf")
    gc.collect()
    for _ in range(3):
        started = time.perf_counter()
        for request in requests_:
            if route(candidates, request) is None:
                raise RuntimeError(f"no route for {request.model} over {nodes} nodes")
        best = min(best, time.perf_counter() - started)
    return best / requests * 1e6


def sweep(sizes: Sequence[int], models: int, requests: int) -> dict[int, float]:
    """Microseconds per request for each fleet size."""
    return {n: per_request_us(n, models, requests) for n in sizes}
