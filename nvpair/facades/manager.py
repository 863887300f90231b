"""Facade lifecycle: enabling an engine's listener, its aliases, moving it, persisting its port.

Each facade's failures stay its own (docs/ports.md#bind-failures): a lost bind race is reported
against that engine, and no other facade's listener is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from attrs import define, field
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorTCP, IReactorTime
from twisted.logger import Logger

from nvpair.control.outbox import Outbox
from nvpair.engines.table import FACADES, Dialect
from nvpair.facades.access import NO_ACCESS_LOG, NO_REFUSALS, AccessLog, RefusalCounter
from nvpair.facades.facade import LOOPBACK_ONLY, CallerGate, Facade, RequestHandler, no_prefix
from nvpair.facades.peer import PeerFacade
from nvpair.facades.ports import (
    PortCorrupt,
    PortFound,
    parse_alias,
    read_persisted_port,
    write_persisted_port,
)
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.site import FacadeSite, Gate
from nvpair.wire.trust.cluster import Membership
from nvpair.wire.trust.connbounds import ConnectionCounts
from nvpair.wire.trust.sniffing import SniffingFactory


class FacadeError(Exception):
    """A facade could not be enabled or moved; everything else is left as it was.

    The broker edge turns it into a JSON-RPC error, fleet mode into a log line
    (docs/ports.md#bind-failures).

    :ivar tag: ``bind`` (the port is taken), ``persist`` (the state directory cannot be
        written) or ``conflict`` (enabled already, on another port).
    """

    def __init__(self, tag: str, engine: str, port: int, message: str) -> None:
        super().__init__(message)
        self.tag = tag
        self.engine = engine
        self.port = port
        self.message = message


@define(eq=False)
class LiveFacade:
    """An enabled facade: its engine, its listening factory and where it listens.

    :ivar peers: whether it has the cluster personality: a facade that reaches several
        engines' nodes (``openai``) has no local engine to serve a pinned peer.
    """

    engine: Dialect
    factory: SniffingFactory
    port: int
    listener: IListeningPort
    aliases: list[str] = field(factory=list)
    alias_listeners: list[IListeningPort] = field(factory=list)
    peers: bool = True


def _no_membership() -> Membership | None:
    return None


class FacadeManager:
    """Enables, moves and stops facades; one per process.

    :param reactor: where listeners are opened.
    :param handler: the request path every facade hands admitted requests to.
    :param outbox: where ``ready``, ``error`` and ``errors:report`` go.
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorTCP,
        handler: RequestHandler,
        outbox: Outbox,
        *,
        state_dir: Path,
        bind: str,
        max_request_body: int,
        bodies: BodyBudget,
        head_timeout: float = 30.0,
        idle_timeout: float = 300.0,
        backlog: int = 4096,
        membership: Callable[[], Membership | None] = lambda: None,
        access_log: AccessLog = NO_ACCESS_LOG,
        refusals: RefusalCounter = NO_REFUSALS,
        lan: CallerGate = LOOPBACK_ONLY,
        prefix_of: Callable[[object], tuple[int, ...]] = no_prefix,
        bounds: ConnectionCounts | None = None,
    ) -> None:
        """:param reactor: listens, and (as IReactorTime) times slow and idle clients.
        :param bodies: the request bodies held at once, every facade's together
            (``--max-body-memory``).
        :param membership: the live cluster membership (None: plaintext personality only).
        :param access_log: where each facade writes the requests it refuses.
        :param refusals: where each facade counts them.
        :param lan: fleet mode's ``[access]``, which lets LAN callers in (:data:`LOOPBACK_ONLY`:
            nobody).
        :param prefix_of: fleet mode's affinity: an inference body's prefix keys.
        :param bounds: fleet mode's count of connections from every address but loopback,
            shared by every facade port (None: no bound;
            docs/robustness.md#connection-bounds)."""
        self._reactor = reactor
        self._clock = IReactorTime(reactor)
        self._membership = membership
        self._handler = handler
        self._outbox = outbox
        self._state_dir = state_dir
        self._bind = bind
        self._max_request_body = max_request_body
        self._bodies = bodies
        self._head_timeout = head_timeout
        self._idle_timeout = idle_timeout
        self._backlog = backlog
        self._access = access_log
        self._refusals = refusals
        self._lan = lan
        self._prefix_of = prefix_of
        self._bounds = bounds
        self.facades: dict[str, LiveFacade] = {}

    def enabled(self, engine: str) -> bool:
        return engine in self.facades

    def _port_file(self, engine: Dialect) -> Path:
        return self._state_dir / engine.port_file

    def _persisted(self, engine: Dialect) -> int | None:
        read = read_persisted_port(self._port_file(engine))
        if isinstance(read, PortCorrupt):
            message = f"persisted port file {engine.port_file} ignored: {read.reason}"
            self.log.warn("{message}", engine=engine.id, message=message)
            self._outbox.notify(
                f"{engine.id}:errors:report",
                {"severity": "warn", "code": "port-file-corrupt", "message": message},
            )
            return None
        return read.port if isinstance(read, PortFound) else None

    def enable(
        self,
        engine_id: str,
        port: int | None,
        aliases: Sequence[str],
        ignore_persisted: bool,
    ) -> dict[str, object]:
        """Open ``engine_id``'s facade (docs/ports.md#choosing-the-port-at-enable); the broker's
        ``facade/enable``.

        :raises FacadeError: ``conflict`` for a re-enable on another port, ``bind`` when the
            port is taken.
        """
        engine = FACADES[engine_id]
        wanted = port or engine.standalone_port
        if not ignore_persisted:
            wanted = self._persisted(engine) or wanted
        live = self.facades.get(engine_id)
        if live is not None:
            if live.port != wanted:
                raise FacadeError(
                    "conflict",
                    engine_id,
                    wanted,
                    f"{engine_id} is already enabled on port {live.port}",
                )
            return self._result(live)
        peers = not engine.spans_engines
        membership = self._membership if peers else _no_membership
        pinned = PeerFacade(
            engine, self._handler, membership, access_log=self._access, refusals=self._refusals
        )
        factory = SniffingFactory(
            self._clock,
            self._site(self._facade(engine, tls=False)),
            self._site(pinned),
            membership,
            # LAN callers over TLS are served as over plaintext, under the same rules, but
            # for their own facade's knowing the connection is TLS (docs/lan.md#tls). Without
            # [access] the gate has no TLS context, and this site is never handed a connection.
            lan=self._site(self._facade(engine, tls=True)),
            lan_tls=lambda: self._lan.tls,
            bounds=self._bounds,
        )
        listener = self._listen(engine, wanted, factory)
        live = LiveFacade(engine, factory, wanted, listener, peers=peers)
        self.facades[engine_id] = live
        self.log.info("{engine} facade listening on {port}", engine=engine_id, port=wanted)
        for alias in aliases:
            self._listen_alias(live, alias)
        self._ready(live)
        return self._result(live)

    def _facade(self, engine: Dialect, *, tls: bool) -> Facade:
        return Facade(
            engine,
            self._handler,
            access_log=self._access,
            refusals=self._refusals,
            lan=self._lan,
            prefix_of=self._prefix_of,
            tls=tls,
        )

    def _site(self, facade: Gate) -> FacadeSite:
        return FacadeSite(
            facade,
            self._max_request_body,
            head_timeout=self._head_timeout,
            idle_timeout=self._idle_timeout,
            clock=self._clock,
            bodies=self._bodies,
        )

    def _ready(self, live: LiveFacade) -> None:
        tls = live.peers and self._membership() is not None
        params: dict[str, object] = {"port": live.port, "aliases": list(live.aliases), "tls": tls}
        self._outbox.notify(f"{live.engine.id}:ready", params)

    def membership_changed(self) -> None:
        """Joining or leaving the cluster changes every facade's ``tls``: announce it."""
        for live in self.facades.values():
            self._ready(live)

    def set_port(self, engine_id: str, port: int) -> dict[str, object]:
        """Move a live facade and persist the choice, as one step (``<engine>:set-port``).

        The new port is bound, then the choice persisted, and only then is the old port let
        go: a failure at either step leaves the facade serving where it was, and the broker
        is told so. No step here closes a listener before its replacement listens, which is
        why this process never has a port to re-listen (the ``relisten`` error tag).

        :raises FacadeError: ``bind`` when the port is taken, ``persist`` when the state
            directory cannot be written.
        """
        live = self.facades[engine_id]
        if port == live.port:
            self._persist(live.engine, port)
            return {"engine": engine_id, "port": port}
        listener = self._listen(live.engine, port, live.factory)
        try:
            self._persist(live.engine, port)
        except FacadeError:
            listener.stopListening()
            raise
        old = live.listener
        live.listener, live.port = listener, port
        old.stopListening()
        self.log.info("{engine} facade moved to {port}", engine=engine_id, port=port)
        self._ready(live)
        return {"engine": engine_id, "port": port}

    def _persist(self, engine: Dialect, port: int) -> None:
        try:
            write_persisted_port(self._port_file(engine), port)
        except OSError as error:
            message = f"cannot persist port {port}: {error.strerror or error}"
            self.log.warn("{message}", engine=engine.id, message=message)
            raise FacadeError("persist", engine.id, port, message) from None

    def _listen(self, engine: Dialect, port: int, factory: SniffingFactory) -> IListeningPort:
        holder = next((live.engine for live in self.facades.values() if live.port == port), None)
        if holder is not None and holder is not engine:
            # Said as it is, rather than as the address in use the bind would report.
            why = f"the {holder.display_name} facade listens there"
        else:
            try:
                listener: IListeningPort = self._reactor.listenTCP(
                    port, factory, backlog=self._backlog, interface=self._bind
                )
            except CannotListenError as error:
                why = str(error.socketError)
            else:
                return listener
        message = f"cannot listen on port {port}: {why}"
        self.log.warn("{message}", engine=engine.id, message=message)
        self._outbox.notify(f"{engine.id}:error", {"tag": "bind", "port": port, "message": message})
        raise FacadeError("bind", engine.id, port, message)

    def _listen_alias(self, live: LiveFacade, alias: str) -> None:
        host, port = parse_alias(alias)
        try:
            # Aliases are loopback-only and plaintext: the clients of an inherited host
            # variable, entering the same routing path. (Twisted's factory generic is
            # invariant, so its stub rejects any Site here.)
            plain = live.factory.plain
            listen = self._reactor.listenTCP
            listener = listen(port, plain, self._backlog, host)  # type: ignore[arg-type]
        except CannotListenError as error:
            # Non-fatal (docs/ports.md#aliases): the alias's current owner is untouched and the
            # primary listener stays up.
            message = f"alias {alias} is occupied: {error.socketError}"
            self.log.warn("{message}", engine=live.engine.id, message=message)
            self._outbox.notify(
                f"{live.engine.id}:errors:report",
                {"severity": "warn", "code": "alias-occupied", "message": message},
            )
            return
        live.aliases.append(alias)
        live.alias_listeners.append(listener)
        self.log.info(
            "{engine} facade also listening on {alias}", engine=live.engine.id, alias=alias
        )

    def _result(self, live: LiveFacade) -> dict[str, object]:
        return {"engine": live.engine.id, "port": live.port, "aliases": list(live.aliases)}

    def stop(self) -> Deferred[None]:
        """Stop accepting on every facade listener."""
        stops = [
            defer.maybeDeferred(listener.stopListening)
            for live in self.facades.values()
            for listener in [live.listener, *live.alias_listeners]
        ]
        self.facades.clear()
        return defer.gatherResults(stops, consumeErrors=True).addCallback(lambda _: None)
