"""Standalone fleet mode: a TOML file in place of the broker (contract "Standalone fleet file").

The file names the facades to enable and each node's engine URLs. Each node's inventory is its
engine's own model list, polled; a node whose poll fails leaves discovery until it answers
again. There is no scheduler, so every node counts as listed with no load and the process's
own reservations alone spread the work.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from attrs import frozen
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent

from nvpair.bodies import fetch
from nvpair.broker import RpcError
from nvpair.control import ControlState, Node
from nvpair.durations import parse_duration
from nvpair.engines import ENGINES
from nvpair.facades import parse_alias
from nvpair.logs import debug_enabled
from nvpair.upstream import quiet_pool

#: Bound on one inventory poll beyond the dial timeout (contract: dial timeout plus 30 s).
POLL_GRACE = 30.0

#: A model list is small; a bigger answer is not one (and is not kept in memory).
MAX_INVENTORY_BODY = 16 * 1024 * 1024


class FleetFileError(ValueError):
    """The fleet file cannot be used; the message names the file and the offending key."""


@frozen
class FacadeSpec:
    port: int
    aliases: tuple[str, ...]


@frozen
class FleetNode:
    id: str
    engines: Mapping[str, str]


@frozen
class Fleet:
    """A parsed fleet file."""

    inventory_interval: float
    facades: Mapping[str, FacadeSpec]
    nodes: tuple[FleetNode, ...]


def _fail(path: Path, where: str, why: str) -> FleetFileError:
    return FleetFileError(f"{path}: {where}: {why}")


def _check_keys(path: Path, where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key(s) {', '.join(unknown)}")


def load_fleet(path: Path) -> Fleet:
    """Parse and validate a fleet file; :class:`FleetFileError` names what is wrong."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise FleetFileError(f"{path}: cannot read: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise FleetFileError(f"{path}: not valid TOML: {error}") from None
    _check_keys(path, "top level", document, {"inventory-interval", "facades", "nodes"})

    interval_text = document.get("inventory-interval", "5s")
    try:
        interval = parse_duration(interval_text) if isinstance(interval_text, str) else -1.0
    except ValueError:
        interval = -1.0
    if interval <= 0:
        raise _fail(path, "inventory-interval", 'must be a positive duration such as "5s"')

    facades_table = document.get("facades", {})
    if not isinstance(facades_table, dict) or not facades_table:
        raise _fail(path, "facades", "name at least one facade, e.g. [facades.ollama]")
    facades: dict[str, FacadeSpec] = {}
    for engine, spec in facades_table.items():
        where = f"facades.{engine}"
        if engine not in ENGINES:
            raise _fail(path, where, f"unknown engine; expected one of {', '.join(ENGINES)}")
        if not isinstance(spec, dict):
            raise _fail(path, where, "must be a table")
        _check_keys(path, where, spec, {"port", "aliases"})
        port = spec.get("port", 0)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise _fail(path, f"{where}.port", "must be an integer in 0-65535")
        aliases = spec.get("aliases", [])
        if not isinstance(aliases, list):
            raise _fail(path, f"{where}.aliases", "must be a list of loopback host:port")
        for alias in aliases:
            try:
                parse_alias(alias)
            except ValueError as bad:
                raise _fail(path, f"{where}.aliases", str(bad)) from None
        facades[engine] = FacadeSpec(port, tuple(aliases))

    nodes_list = document.get("nodes", [])
    if not isinstance(nodes_list, list):
        raise _fail(path, "nodes", "must be an array of tables ([[nodes]])")
    nodes: list[FleetNode] = []
    seen: set[str] = set()
    for index, item in enumerate(nodes_list):
        where = f"nodes[{index}]"
        if not isinstance(item, dict):
            raise _fail(path, where, "must be a table")
        _check_keys(path, where, item, {"id", "engines"})
        node_id = item.get("id")
        if not isinstance(node_id, str) or not node_id or node_id in seen:
            raise _fail(path, f"{where}.id", "must be a unique non-empty string")
        seen.add(node_id)
        engines = item.get("engines", {})
        if not isinstance(engines, dict):
            raise _fail(path, f"{where}.engines", "must be a table of engine = URL")
        for engine, url in engines.items():
            if engine not in ENGINES:
                raise _fail(path, f"{where}.engines.{engine}", "unknown engine")
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme != "http" or not parts.hostname:
                raise _fail(path, f"{where}.engines.{engine}", "must be an http:// URL")
        nodes.append(FleetNode(node_id, dict(engines)))
    return Fleet(interval, facades, tuple(nodes))


class LogOutbox:
    """Standalone mode's outbox: what would go to a broker goes to the log instead."""

    log = Logger()

    def notify(self, method: str, params: dict[str, object]) -> None:
        # Workload events carry only operational fields (ids, model, node, times, state).
        if debug_enabled():
            self.log.debug("event {method} {params}", method=method, params=json.dumps(params))

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        return defer.succeed({})


class Facades(Protocol):
    """What the fleet needs of :class:`nvpair.facades.FacadeManager`."""

    def enable(
        self, engine_id: str, port: int | None, aliases: Sequence[str], ignore_persisted: bool
    ) -> object: ...


class FleetService(Service):
    """Enables the file's facades and keeps each engine's discovery from polled inventories.

    Every (node, engine) pair is polled on its own schedule: at start, then every
    ``inventory-interval``, never twice at once. One poll (dial, headers and body together) is
    bounded by the dial timeout plus :data:`POLL_GRACE` and by :data:`MAX_INVENTORY_BODY`, so a
    node that stalls delays only its own next poll, never another node's.

    :param reactor: IReactorTCP + IReactorTime.
    :param dial_timeout: connect timeout for each poll.
    :param agent: sends the polls (tests); by default an Agent on a pool of this service's own.
    """

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        fleet: Fleet,
        control: ControlState,
        facades: Facades,
        dial_timeout: float,
        *,
        agent: IAgent | None = None,
    ) -> None:
        self._clock: IReactorTime = reactor
        self._fleet = fleet
        self._control = control
        self._facades = facades
        self._pool: HTTPConnectionPool | None = None
        if agent is None:
            self._pool = quiet_pool(reactor)
            agent = Agent(reactor, connectTimeout=dial_timeout or None, pool=self._pool)
        self._agent = agent
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
            except RpcError as error:
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
        if self._pool is not None:
            closed: Deferred[None] = self._pool.closeCachedConnections()
            return closed
        return None

    async def _poll_once(self, engine: str, url: str) -> list[str]:
        spec = ENGINES[engine]
        sent = self._agent.request(b"GET", (url.rstrip("/") + spec.poll_path).encode(), Headers())
        whole = await fetch(sent, self._clock, self._timeout, MAX_INVENTORY_BODY)
        code = whole.response.code
        if not 200 <= code < 300:
            raise ValueError(f"status {code}")
        models = spec.inventory_models(json.loads(whole.body))
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
