"""The simulated fleet, in this process: four nodes x three dialects, and the fault injector that
turns their :class:`~nvpair.sim.Faults` knobs while traffic runs.
"""

from __future__ import annotations

import random
from collections import Counter
from contextlib import suppress
from typing import Any

from twisted.internet.defer import DeferredList
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from bench.soak.plan import ENGINES, NODES, FaultSpec, draw_fault, node_models, pick_target
from nvpair.sim import SimEngine

Key = tuple[str, str]
"""(node id, engine)"""


class Fleet:
    """Every simulated engine, listening on a free loopback port.

    :param reactor: IReactorTCP + IReactorTime.
    :param chunk_interval: seconds between streamed chunks.
    :param tokens: streamed chunks per completion.
    """

    def __init__(self, reactor: Any, chunk_interval: float, tokens: int) -> None:
        self.engines: dict[Key, SimEngine] = {}
        for index, node in enumerate(NODES):
            for engine in ENGINES:
                sim = SimEngine(
                    reactor,
                    engine,
                    models=node_models(engine, index),
                    node=node,
                    tokens=[f" w{n}" for n in range(tokens)],
                    # LM Studio's "Enable CORS" on: a preflight through the proxy can be granted.
                    cors=True if engine == "lmstudio" else None,
                    chunk_interval=chunk_interval,
                )
                sim.listen(0, "127.0.0.1")
                self.engines[node, engine] = sim

    @property
    def ports(self) -> frozenset[int]:
        return frozenset(sim.port for sim in self.engines.values())

    def urls(self) -> dict[str, dict[str, str]]:
        """node id -> engine -> base URL, for the fleet file."""
        urls: dict[str, dict[str, str]] = {}
        for (node, engine), sim in self.engines.items():
            urls.setdefault(node, {})[engine] = sim.url
        return urls

    async def reset_connections(self) -> None:
        """Abort every connection to every engine, then listen again.

        Taken before the quiet samples: the proxy's idle upstream pool is then emptied the same
        way each time, while a connection the proxy forgot with its reads paused would miss the
        reset and still hold its fd.
        """
        await DeferredList([sim.refuse() for sim in self.engines.values()])
        for sim in self.engines.values():
            with suppress(CannotListenError):  # see Chaos._undo
                sim.resume()

    async def stop(self) -> None:
        await DeferredList([sim.stop() for sim in self.engines.values()])


class Chaos:
    """Starts a random fault on a random healthy engine every ``every`` seconds (at most
    ``limit`` at once) and undoes each after its holding time.

    :param reactor: IReactorTime.
    """

    log = Logger()

    def __init__(
        self, reactor: Any, fleet: Fleet, rng: random.Random, every: float, limit: int
    ) -> None:
        self._reactor = reactor
        self._fleet = fleet
        self._rng = rng
        self._every = every
        self._limit = limit
        self._active: dict[Key, tuple[FaultSpec, IDelayedCall]] = {}
        self._loop = LoopingCall(self._inject)
        self._loop.clock = reactor
        self.injected: Counter[str] = Counter()
        self.failed_resumes = 0

    @property
    def active(self) -> int:
        return len(self._active)

    def start(self) -> None:
        self._loop.start(self._every, now=False)

    def stop(self) -> None:
        """Stop injecting and undo every fault still on."""
        if self._loop.running:
            self._loop.stop()
        for key in list(self._active):
            _, pending = self._active[key]
            if pending.active():
                pending.cancel()
            self._undo(key)
        for sim in self._fleet.engines.values():
            sim.faults.clear()

    def _inject(self) -> None:
        if len(self._active) >= self._limit:
            return
        healthy = sorted(key for key in self._fleet.engines if key not in self._active)
        key = pick_target(self._rng, healthy)
        if key is None:
            return
        spec = draw_fault(self._rng)
        sim = self._fleet.engines[key]
        faults = sim.faults
        if spec.kind == "status":
            faults.status = int(spec.value)
        elif spec.kind == "header-delay":
            faults.header_delay = spec.value
        elif spec.kind == "first-byte-delay":
            faults.first_byte_delay = spec.value
        elif spec.kind == "stall":
            faults.stall = True
        elif spec.kind == "die-after-chunks":
            faults.die_after_chunks = int(spec.value)
        elif spec.kind == "inventory-status":
            faults.inventory_status = int(spec.value)
        elif spec.kind == "inventory-invalid":
            faults.inventory_invalid = True
        elif spec.kind == "inventory-delay":
            faults.inventory_delay = spec.value
        elif spec.kind == "refuse":
            sim.refuse()
        self.injected[spec.kind] += 1
        self._active[key] = (spec, self._reactor.callLater(spec.hold, self._undo, key))

    def _undo(self, key: Key) -> None:
        spec, _ = self._active.pop(key)
        sim = self._fleet.engines[key]
        if spec.kind != "refuse":
            sim.faults.clear()
            return
        try:
            sim.resume()
        except CannotListenError as error:
            # The port was taken meanwhile (an ephemeral port of some outgoing connection):
            # the engine stays down, which the proxy must survive as well.
            self.failed_resumes += 1
            self.log.warn(
                "{node} {engine} cannot listen again: {why}",
                node=key[0],
                engine=key[1],
                why=str(error),
            )
