"""Standalone fleet mode: a TOML file in place of the broker
(docs/broker-protocol.md#standalone-fleet-mode).

The file names the facades to enable and each node's engine URLs. Each node's inventory is its
engine's own model list, polled; a node whose poll fails leaves discovery until it answers
again. There is no scheduler: with each inventory the poll also reads the engine's load state
(models in memory, busy slots, loading) for the fleet's own scheduling
(docs/fleet-scheduling.md). Every configured (node, engine) has a report
(:mod:`nvpair.fleet.pairs`) an operator can read (``/status``) and whose changes are logged;
SIGHUP hands a re-read file to :meth:`FleetService.reload`
(docs/fleet-scheduling.md#the-fleet-file-re-read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from attrs import evolve
from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.control.state import ControlState
from nvpair.engines.loadstate import UNKNOWN, LoadState
from nvpair.engines.table import FACADES, served_engines
from nvpair.facades.manager import FacadeError
from nvpair.fleet.discovery import FleetDiscovery
from nvpair.fleet.file import Fleet, restart_needed, unserved
from nvpair.fleet.liveness import LivenessProbes
from nvpair.fleet.nodepoll import POLL_GRACE, NodePoll
from nvpair.fleet.pairs import Pair, PairReport, PollState
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.wire.web import UpstreamClient

T = TypeVar("T")


class Facades(Protocol):
    """What the fleet needs of :class:`nvpair.facades.manager.FacadeManager`."""

    def enable(
        self, engine_id: str, port: int | None, aliases: Sequence[str], ignore_persisted: bool
    ) -> object: ...


class FleetService(Service):
    """Enables the file's facades and keeps each engine's discovery from polled inventories.

    Every (node, engine) pair is polled on its own schedule: at start, then every
    ``inventory-interval``, never twice at once. One poll asks for the model list and, at the
    same time, the engine's load routes; each request is bounded as a whole
    (:class:`~nvpair.fleet.nodepoll.NodePoll`), so a node that stalls delays only its own next
    poll, never another node's. The two readings are recorded as each arrives
    (:class:`~nvpair.fleet.discovery.FleetDiscovery`), and neither failing spoils the other —
    except that a node whose model list fails while its engine says it is loading keeps its
    last known models, so it stays in discovery as loading rather than leaving
    (docs/fleet-scheduling.md#load-state).

    :param clock: the poll schedule and bounds.
    :param upstream: the process's shared upstream client (its pool is closed by the
        process's shutdown, with everything else's).
    :param dial_timeout: connect timeout for each poll.
    :param scheduler: where load states go; None polls inventories only.
    :param liveness: probes every pair for a hang; a hung node is out of discovery until it
        answers again (docs/fleet-scheduling.md#hung-nodes). None: no probes.
    :param cannot_serve: ends the process, given why: a facade of the file that cannot bind
        (docs/ports.md#bind-failures). None only logs it (a fleet built without a process).
    :param credentials: given each node URL's ``Authorization`` value, at once and at each
        reload (the upstream client's
        :meth:`~nvpair.wire.client.upstream.Upstream.set_credentials`).
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
        *,
        cannot_serve: Callable[[str], None] | None = None,
        liveness: LivenessProbes | None = None,
        credentials: Callable[[Mapping[str, bytes]], None] = lambda by_url: None,
    ) -> None:
        self._clock = clock
        self._credentials = credentials
        credentials(fleet.authorizations())
        self._liveness = liveness
        self._cannot_serve = cannot_serve
        self._fleet = fleet
        self._control = control
        self._facades = facades
        self._ask = NodePoll(upstream, clock, (dial_timeout or 10.0) + POLL_GRACE)
        self._scheduler = scheduler
        # The engines whose nodes this process's facades reach (every engine's with the openai
        # facade): a reload cannot change them (a port is bound).
        self._engines = served_engines(fleet.facades)
        self._discovery = FleetDiscovery(
            clock,
            control,
            self._engines,
            self.log,
            self._urls,
            self._end_first_round,
            lambda: self._fleet.models,
            scheduler,
            liveness,
        )
        if liveness is not None:
            liveness.changed = lambda engine, node: self._discovery.publish(engine)
        if scheduler is not None:
            scheduler.awaited = self._awaited
        # (node id, engine) -> the pair, in the file's order
        self._pairs: dict[tuple[str, str], Pair] = {}
        #: Latched once every pair has answered or failed (:attr:`polled`).
        self._first_round_done = False

    # -- what an operator reads ---------------------------------------------------------------

    def reports(self) -> Mapping[str, tuple[PairReport, ...]]:
        """Every configured (node, engine) of each running facade, in the file's order: every
        engine with a facade of its own, and each other engine a facade reaches (the ``openai``
        facade) that has a node."""
        out: dict[str, list[PairReport]] = {
            engine: [] for engine in self._engines if engine in self._fleet.facades
        }
        for pair in self._pairs.values():
            out.setdefault(pair.engine, []).append(pair.report)
        return {engine: tuple(reports) for engine, reports in out.items()}

    @property
    def polled(self) -> bool:
        """Whether the first round is done: every pair configured at start polled to the end
        once. It stays so: a node a reload adds is not polled yet, and readiness must not go
        with it (docs/operations.md#is-it-healthy)."""
        return self._first_round_done

    # -- lifecycle ----------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        for engine, spec in self._fleet.facades.items():
            try:
                self._facades.enable(engine, spec.port or None, spec.aliases, False)
            except FacadeError as error:
                why = f"{FACADES[engine].display_name} facade not enabled: {error.message}"
                if self._cannot_serve is None:
                    self.log.error("{why}", engine=engine, why=why)
                    continue
                # No broker to tell and retry on another port: a server that cannot serve
                # what its file names ends, non-zero, rather than run with a facade missing.
                # Nothing more starts; the process's shutdown closes what did.
                self._cannot_serve(why)
                return
        self._warn_unserved(self._fleet)
        # Every pair exists before the first poll starts: a poll answered at once must not
        # find the first round done while pairs are still to come.
        pairs = [
            Pair(node, engine, url) for (node, engine), url in self._wanted(self._fleet).items()
        ]
        self._pairs = {(pair.node, pair.engine): pair for pair in pairs}
        for pair in pairs:
            self._schedule(pair, now=True)
            self._probe(pair)
        self._end_first_round()  # nothing to poll: done at once

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        # Closes the polls' connections; their results are dropped (the service is no longer
        # running), so a shutdown does not read as every node leaving.
        for pair in self._pairs.values():
            pair.stop()
        if self._liveness is not None:
            self._liveness.stop()
        return None

    def reload(self, fleet: Fleet) -> None:
        """Apply a re-read fleet file (SIGHUP) without touching requests in flight.

        Nodes, their URLs, the poll interval and ``[models]`` change now. A node that stays
        with the same URL keeps its place in discovery, its health and its schedule (a new
        interval takes effect at its next poll); a node whose URL changed stays in discovery at
        its new URL, starts afresh (no health, no load state) and is polled at once; a removed
        node leaves discovery; an added one is polled at once. What cannot change live — the
        facades, their ports and aliases, the admin listener's LAN address — is logged as
        needing a restart and left as it is.
        """
        touched: set[str] = set()
        for change in restart_needed(self._fleet, fleet):
            self.log.warn("fleet file reloaded: {change} needs a restart", change=change)
        self._warn_unserved(fleet)
        # Before any poll of the new file: every request from now on carries its credentials.
        self._credentials(fleet.authorizations())
        interval = fleet.inventory_interval != self._fleet.inventory_interval
        if fleet.models != self._fleet.models:
            # Every snapshot's other names change with the aliases (docs/model-names.md).
            touched.update(e for e in self._engines if self._control.reported(e))
        self._fleet = evolve(fleet, facades=self._fleet.facades, admin=self._fleet.admin)
        wanted = self._wanted(fleet)
        for key, pair in list(self._pairs.items()):
            url = wanted.get(key)
            if url == pair.url:
                if interval and pair.loop is not None and pair.loop.running:
                    # The poll in flight (if any) still finishes and is recorded.
                    pair.loop.stop()
                    self._schedule(pair, now=False)
                continue
            self._drop(pair, moved=url is not None)
            touched.add(pair.engine)
            if url is None:
                self.log.info(
                    "{node} removed from the fleet file: left {engine} discovery",
                    node=pair.node,
                    engine=pair.engine,
                )
            else:
                self.log.info(
                    "{node}'s {engine} moved to {url}",
                    node=pair.node,
                    engine=pair.engine,
                    url=url,
                )
        # In the file's order, new pairs where the file puts them.
        pairs, self._pairs = self._pairs, {}
        for key, url in wanted.items():
            if key in pairs:
                self._pairs[key] = pairs[key]
            else:
                self._add(key, url, now=True)
                _, engine = key
                touched.add(engine)
        for engine in touched:
            self._discovery.publish(engine)
        # A reload before the first round ended may have removed what it waited for.
        self._end_first_round()

    def _warn_unserved(self, fleet: Fleet) -> None:
        """Nothing silently ignored: at start and at each re-read
        (docs/fleet-scheduling.md#every-configured-node-is-visible)."""
        for node, engine, why in unserved(fleet, self._engines):
            self.log.warn(
                "{node}'s {engine} is ignored, neither polled nor served: {why}",
                node=node,
                engine=engine,
                why=why,
            )

    def _wanted(self, fleet: Fleet) -> dict[tuple[str, str], str]:
        """(node id, engine) -> URL of every pair of ``fleet`` whose facade runs here."""
        return {
            (node.id, engine): url
            for node in fleet.nodes
            for engine, url in node.engines.items()
            if engine in self._engines
        }

    def _awaited(self, engine: str) -> bool:
        """Whether a pair of ``engine`` is still to answer its first poll, or its engine says it
        is loading (docs/fleet-scheduling.md#before-the-first-poll)."""
        return any(
            p.engine == engine and p.report.state in (PollState.PENDING, PollState.LOADING)
            for p in self._pairs.values()
        )

    def _urls(self, engine: str) -> dict[str, str]:
        """Node id -> URL of each configured node of ``engine``."""
        return {p.node: p.url for p in self._pairs.values() if p.engine == engine}

    def _add(self, key: tuple[str, str], url: str, now: bool) -> None:
        node, engine = key
        pair = Pair(node, engine, url)
        self._pairs[key] = pair
        self._schedule(pair, now)
        self._probe(pair)

    def _probe(self, pair: Pair) -> None:
        if self._liveness is not None:
            self._liveness.watch(pair.engine, pair.node, pair.url)

    def _schedule(self, pair: Pair, now: bool) -> None:
        # One loop per pair: a LoopingCall waits for its poll's Deferred before it schedules
        # the next, so a slow poll is never duplicated and holds up nobody else's.
        loop = LoopingCall(self._poll, pair)
        loop.clock = self._clock
        pair.loop = loop
        loop.start(self._fleet.inventory_interval, now=now).addErrback(
            lambda failure: self.log.failure("inventory polling stopped", failure)
        )

    def _drop(self, pair: Pair, moved: bool) -> None:
        """Forget a pair the file no longer has (or, ``moved``, has at another URL)."""
        # Gone from the map first: a poll the stop cancels then counts for nothing.
        del self._pairs[(pair.node, pair.engine)]
        pair.stop()
        if self._liveness is not None:
            self._liveness.forget(pair.engine, pair.node)
        if not moved:
            self._discovery.forget(pair.engine, pair.node)
        # Else same id, new place: it stays in discovery, dialled at the new URL, until its
        # first poll there says otherwise.
        if self._scheduler is not None:
            self._scheduler.forget(pair.engine, pair.node)

    def _live(self, pair: Pair) -> bool:
        """Whether what ``pair``'s poll learned still counts: running, and not reloaded away."""
        return bool(self.running) and self._pairs.get((pair.node, pair.engine)) is pair

    # -- one poll -----------------------------------------------------------------------------

    async def _probe_load(self, engine: str, url: str) -> LoadState:
        if self._scheduler is None:
            return UNKNOWN
        return await self._ask.load(engine, url)

    def _track(self, pair: Pair, d: Deferred[T]) -> Deferred[T]:
        """Remember ``d`` until it settles, so a shutdown or reload can cancel it."""
        pair.polling.add(d)

        def settled(result: T) -> T:
            pair.polling.discard(d)
            return result

        return d.addBoth(settled)

    def _poll(self, pair: Pair) -> Deferred[None]:
        if pair.polling:
            # A reload rescheduled the pair while a poll of its old schedule was still out.
            return defer.succeed(None)

        def done(result: object) -> None:
            if isinstance(result, Failure) and self.running and not result.check(CancelledError):
                # Swallowed so this pair's loop keeps running.
                self.log.failure(
                    "recording {node}'s {engine} poll failed",
                    result,
                    node=pair.node,
                    engine=pair.engine,
                )

        return Deferred.fromCoroutine(self._poll_pair(pair)).addBoth(done)

    async def _poll_pair(self, pair: Pair) -> None:
        engine, url = pair.engine, pair.url
        # What this proxy dispatched after this moment the answer cannot have seen
        # (docs/fleet-scheduling.md#dispatched-is-loading).
        asked_at = self._clock.seconds()
        inventory = self._track(pair, Deferred.fromCoroutine(self._ask.models(engine, url)))
        load = self._track(pair, Deferred.fromCoroutine(self._probe_load(engine, url)))

        def record_load(result: object) -> LoadState:
            if isinstance(result, Failure):
                # Cancelled by a shutdown or a reload, or a bug reading the answers: nothing
                # known; only the bug is news. Both cancel a pair's polls only once it is no
                # longer live (stopService, _drop).
                if self._live(pair):
                    self.log.failure(
                        "reading {node}'s {engine} load", result, node=pair.node, engine=engine
                    )
                return UNKNOWN
            assert isinstance(result, LoadState)
            # As soon as it arrives, whatever the inventory is doing.
            if self._live(pair) and self._scheduler is not None:
                self._scheduler.record_load(engine, pair.node, result, asked_at)
            return result

        loaded = load.addBoth(record_load)
        try:
            models = await inventory
        except CancelledError:
            raise
        except Exception as error:
            # Whether the node left or is loading is this round's load reading's to say.
            state = await loaded
            if self._live(pair):
                self._discovery.failed(pair, str(error) or type(error).__name__, state.loading)
            return
        if self._live(pair):
            assert isinstance(models, list)
            self._discovery.answered(pair, tuple(models))
        await loaded

    def _end_first_round(self) -> None:
        if not self._first_round_done:
            self._first_round_done = all(
                p.report.state is not PollState.PENDING for p in self._pairs.values()
            )
