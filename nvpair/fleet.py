"""Standalone fleet mode: a TOML file in place of the broker
(docs/broker-protocol.md#standalone-fleet-mode).

The file names the facades to enable and each node's engine URLs. Each node's inventory is its
engine's own model list, polled; a node whose poll fails leaves discovery until it answers
again. There is no scheduler, so every node counts as listed with no load and the process's
own reservations alone spread the work.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred
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
from nvpair.web import UpstreamClient

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
    ``inventory-interval``, never twice at once. One poll (dial, headers and body together) is
    bounded by the dial timeout plus :data:`POLL_GRACE` and by :data:`MAX_INVENTORY_BODY`, so a
    node that stalls delays only its own next poll, never another node's.

    :param clock: the poll schedule and bounds.
    :param upstream: the process's shared upstream client (its pool is closed by the
        process's shutdown, with everything else's).
    :param dial_timeout: connect timeout for each poll.
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
    ) -> None:
        self._clock = clock
        self._fleet = fleet
        self._control = control
        self._facades = facades
        self._upstream = upstream
        self._timeout = (dial_timeout or 10.0) + POLL_GRACE
        # engine -> node id -> models from that node's last successful poll
        self._answered: dict[str, dict[str, tuple[str, ...]]] = {e: {} for e in fleet.facades}
        self._loops: list[LoopingCall] = []
        self._polling: set[Deferred[list[str]]] = set()

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

    async def _poll_once(self, engine: str, url: str) -> list[str]:
        spec = ENGINES[engine]
        reply = await ask(
            self._upstream,
            self._clock,
            self._timeout,
            url,
            b"GET",
            spec.poll_path.encode(),
            Headers(),
            MAX_INVENTORY_BODY,
        )
        if not 200 <= reply.status < 300:
            raise ValueError(f"status {reply.status}")
        models = spec.inventory_models(json.loads(reply.body))
        if models is None:
            raise ValueError("not the engine's model-list envelope")
        return models

    def _poll(self, node: FleetNode, engine: str, url: str) -> Deferred[None]:
        poll = Deferred.fromCoroutine(self._poll_once(engine, url))
        self._polling.add(poll)

        def settled(result: list[str] | Failure) -> None:
            self._polling.discard(poll)
            if not self.running:
                return
            try:
                if isinstance(result, Failure):
                    self._failed(node.id, engine, result)
                else:
                    self._record(engine, node.id, tuple(result))
            except Exception:
                # Swallowed so this pair's loop keeps running.
                self.log.failure(
                    "recording {node}'s {engine} poll failed", node=node.id, engine=engine
                )

        return poll.addBoth(settled)

    def _failed(self, node_id: str, engine: str, failure: Failure) -> None:
        if node_id in self._answered[engine]:
            self.log.info(
                "{node} left {engine} discovery: poll failed ({why})",
                engine=engine,
                node=node_id,
                why=failure.getErrorMessage()[:200],
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
