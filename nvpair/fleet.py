"""Standalone fleet mode: a TOML file in place of the broker
(docs/broker-protocol.md#standalone-fleet-mode).

The file names the facades to enable and each node's engine URLs. Each node's inventory is its
engine's own model list, polled; a node whose poll fails leaves discovery until it answers
again. There is no scheduler: with each inventory the poll also reads the engine's load state
(models in memory, busy slots, loading) for the fleet's own scheduling
(docs/fleet-scheduling.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers

from nvpair.control import ControlState, Node
from nvpair.engines import ENGINES
from nvpair.facade_manager import FacadeError
from nvpair.fanout import ask
from nvpair.fleetfile import Fleet, FleetNode
from nvpair.loadstate import UNKNOWN, Answer, LoadState
from nvpair.scheduling import FleetScheduler
from nvpair.web import UpstreamClient

T = TypeVar("T")

#: Bound on one inventory poll beyond the dial timeout (docs/inventories.md#polled-inventories).
POLL_GRACE = 30.0

#: A model list is small; a bigger answer is not one (and is not kept in memory).
MAX_INVENTORY_BODY = 16 * 1024 * 1024


class Facades(Protocol):
    """What the fleet needs of :class:`nvpair.facade_manager.FacadeManager`."""

    def enable(
        self, engine_id: str, port: int | None, aliases: Sequence[str], ignore_persisted: bool
    ) -> object: ...


class FleetService(Service):
    """Enables the file's facades and keeps each engine's discovery from polled inventories.

    Every (node, engine) pair is polled on its own schedule: at start, then every
    ``inventory-interval``, never twice at once. One poll asks for the model list and, at the
    same time, the engine's load routes; each request (dial, headers and body together) is
    bounded by the dial timeout plus :data:`POLL_GRACE` and by :data:`MAX_INVENTORY_BODY`, so a
    node that stalls delays only its own next poll, never another node's. The two readings
    are recorded as each arrives, and neither failing spoils the other — except that a node
    whose model list fails while its engine says it is loading keeps its last known models, so
    it stays in discovery as loading rather than leaving (docs/fleet-scheduling.md#load-state).

    :param clock: the poll schedule and bounds.
    :param upstream: the process's shared upstream client (its pool is closed by the
        process's shutdown, with everything else's).
    :param dial_timeout: connect timeout for each poll.
    :param scheduler: where load states go; None polls inventories only.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        fleet: Fleet,
        control: ControlState,
        facades: Facades,
        upstream: UpstreamClient,
        dial_timeout: float,
        scheduler: FleetScheduler | None = None,
    ) -> None:
        self._clock = clock
        self._fleet = fleet
        self._control = control
        self._facades = facades
        self._upstream = upstream
        self._timeout = (dial_timeout or 10.0) + POLL_GRACE
        self._scheduler = scheduler
        # engine -> node id -> models from that node's last successful poll, while in discovery
        self._answered: dict[str, dict[str, tuple[str, ...]]] = {e: {} for e in fleet.facades}
        # engine -> node id -> the last models it ever answered, kept after it leaves: what a
        # node that comes back loading is known to serve.
        self._known: dict[str, dict[str, tuple[str, ...]]] = {e: {} for e in fleet.facades}
        self._loops: list[LoopingCall] = []
        self._polling: set[Deferred[Any]] = set()

    def startService(self) -> None:
        super().startService()
        for engine, spec in self._fleet.facades.items():
            try:
                self._facades.enable(engine, spec.port or None, spec.aliases, False)
            except FacadeError as error:
                # Contained like a broker's enable: the other facades still come up.
                self.log.error(
                    "{engine} facade not enabled: {why}", engine=engine, why=error.message
                )
        for node in self._fleet.nodes:
            for engine, url in node.engines.items():
                if engine not in self._answered:
                    continue
                # One loop per pair: a LoopingCall waits for its poll's Deferred before it
                # schedules the next, so a slow poll is never duplicated and holds up nobody
                # else's.
                loop = LoopingCall(self._poll, node, engine, url)
                loop.clock = self._clock
                self._loops.append(loop)
                loop.start(self._fleet.inventory_interval, now=True).addErrback(
                    lambda failure: self.log.failure("inventory polling stopped", failure)
                )

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        loops, self._loops = self._loops, []
        for loop in loops:
            if loop.running:
                loop.stop()
        # Closes their connections; the results are dropped (the service is no longer
        # running), so a shutdown does not read as every node leaving.
        for poll in list(self._polling):
            poll.cancel()
        return None

    async def _ask(self, url: str, path: str) -> Answer:
        """One GET of a poll, bounded as a whole (time and bytes)."""
        reply = await ask(
            self._upstream,
            self._clock,
            self._timeout,
            url,
            b"GET",
            path.encode(),
            Headers(),
            MAX_INVENTORY_BODY,
        )
        return Answer(reply.status, reply.body)

    async def _poll_once(self, engine: str, url: str) -> list[str]:
        spec = ENGINES[engine]
        reply = await self._ask(url, spec.poll_path)
        if not 200 <= reply.status < 300:
            raise ValueError(f"status {reply.status}")
        models = spec.inventory_models(json.loads(reply.body))
        if models is None:
            raise ValueError("not the engine's model-list envelope")
        return models

    async def _load_answer(self, url: str, path: str) -> Answer | None:
        try:
            return await self._ask(url, path)
        except CancelledError:
            raise
        except Exception:
            # Refused, reset, timed out, too large: this route says nothing this time.
            return None

    async def _probe_load(self, engine: str, url: str) -> LoadState:
        if self._scheduler is None:
            return UNKNOWN
        probe = ENGINES[engine].load_probe
        # Every route at once, each bounded like the model list; one failing says nothing.
        answers = await defer.gatherResults(
            [Deferred.fromCoroutine(self._load_answer(url, path)) for path in probe.paths],
            consumeErrors=True,
        )
        return probe.read(answers, ENGINES[engine].model_key)

    def _track(self, d: Deferred[T]) -> Deferred[T]:
        """Remember ``d`` until it settles, so a shutdown can cancel it (and close its exchange)."""
        self._polling.add(d)

        def settled(result: T) -> T:
            self._polling.discard(d)
            return result

        return d.addBoth(settled)

    def _poll(self, node: FleetNode, engine: str, url: str) -> Deferred[None]:
        def done(result: object) -> None:
            if isinstance(result, Failure) and self.running and not result.check(CancelledError):
                # Swallowed so this pair's loop keeps running.
                self.log.failure(
                    "recording {node}'s {engine} poll failed", result, node=node.id, engine=engine
                )

        return Deferred.fromCoroutine(self._poll_pair(node, engine, url)).addBoth(done)

    async def _poll_pair(self, node: FleetNode, engine: str, url: str) -> None:
        inventory = self._track(Deferred.fromCoroutine(self._poll_once(engine, url)))
        load = self._track(Deferred.fromCoroutine(self._probe_load(engine, url)))

        def record_load(result: object) -> LoadState:
            if isinstance(result, Failure):
                # Cancelled by a shutdown, or a bug reading the answers: nothing known.
                if not result.check(CancelledError):
                    self.log.failure(
                        "reading {node}'s {engine} load", result, node=node.id, engine=engine
                    )
                return UNKNOWN
            assert isinstance(result, LoadState)
            # As soon as it arrives, whatever the inventory is doing.
            if self.running and self._scheduler is not None:
                self._scheduler.record_load(engine, node.id, result)
            return result

        loaded = load.addBoth(record_load)
        try:
            models = await inventory
        except CancelledError:
            raise
        except Exception as error:
            # Whether the node left or is loading is this round's load reading's to say.
            state = await loaded
            if self.running:
                self._failed(node.id, engine, str(error) or type(error).__name__, state.loading)
            return
        if self.running:
            assert isinstance(models, list)
            self._record(engine, node.id, tuple(models))
        await loaded

    def _failed(self, node_id: str, engine: str, why: str, loading: bool) -> None:
        known = self._known[engine].get(node_id)
        if loading and known is not None:
            # A llama.cpp server loading its model answers 503 everywhere, its model list
            # included; it is no gone node. Kept with what it last listed, marked loading.
            if node_id not in self._answered[engine]:
                self.log.info(
                    "{node} is loading: back in {engine} discovery with its last models",
                    engine=engine,
                    node=node_id,
                )
            self._record(engine, node_id, known)
            return
        if node_id in self._answered[engine]:
            self.log.info(
                "{node} left {engine} discovery: poll failed ({why})",
                engine=engine,
                node=node_id,
                why=why[:200],
            )
        self._record(engine, node_id, None)

    def _record(self, engine: str, node_id: str, models: tuple[str, ...] | None) -> None:
        answered = self._answered[engine]
        previous = answered.get(node_id)
        if models is None:
            if node_id not in answered:
                return
            del answered[node_id]
        else:
            if previous == models:
                return
            if previous is None:
                self.log.info(
                    "{node} joined {engine} discovery with {count} models",
                    engine=engine,
                    node=node_id,
                    count=len(models),
                )
            answered[node_id] = models
            self._known[engine][node_id] = models
        spec = ENGINES[engine]
        urls = {n.id: n.engines[engine] for n in self._fleet.nodes if engine in n.engines}
        self._control.set_discovery(
            engine,
            [
                Node(
                    id=nid,
                    local=False,
                    url=urls[nid],
                    models=names,
                    model_keys=frozenset(spec.model_key(m) for m in names),
                )
                for nid, names in answered.items()
            ],
        )
