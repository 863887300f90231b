"""Wires the process together: ``build(reactor, config) -> MultiService``.

Everything is constructed here from injected pieces, so a test builds the same process
in-memory that ``twistd -n nvpair-proxy`` runs.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from typing import IO

from twisted.application.service import IServiceCollection, MultiService
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorCore, IReactorTCP, IReactorThreads, IReactorTime
from twisted.logger import ILogObserver, Logger
from twisted.python.components import Componentized
from twisted.web.iweb import IPolicyForHTTPS

from nvpair.broker.link import BrokerProtocol
from nvpair.broker.methods import BrokerMethods
from nvpair.broker.outboxes import BrokerOutbox, LogOutbox
from nvpair.cli_actions import version
from nvpair.common.logs import LogObserver, chosen_format
from nvpair.common.twistedlines import TwistedLines, event_loop
from nvpair.config import Config
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState
from nvpair.control_services import BrokerLinkService, FleetReloadService
from nvpair.dispatch.activity import NodeActivity
from nvpair.dispatch.budget import Bounds
from nvpair.dispatch.queueing import NO_QUEUE, FleetQueue
from nvpair.dispatch.requestpath import RequestPath
from nvpair.dispatch.seams import NOT_COUNTED, NOT_RECORDED, PriorityScheduling, Scheduling
from nvpair.dispatch.workload import Workloads
from nvpair.engines.admission import this_machine
from nvpair.facades.access import NO_ACCESS_LOG, NO_REFUSALS, AccessLog
from nvpair.facades.facade import LOOPBACK_ONLY, no_prefix
from nvpair.facades.manager import FacadeManager
from nvpair.fleet.health import HealthPolicy
from nvpair.fleet.langate import LanGate
from nvpair.fleet.liveness import LivenessProbes
from nvpair.fleet.polls import FleetService
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.observe.listener import AdminListener
from nvpair.observe.metrics import Metrics
from nvpair.observe.recent import RecentWorkloads
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.trust.cluster import ClusterWatch
from nvpair.wire.trust.connbounds import ConnectionCounts, lan_capacity


def raise_fd_limit(
    get: Callable[[int], tuple[int, int]] = resource.getrlimit,
    set_: Callable[[int, tuple[int, int]], None] = resource.setrlimit,
) -> int:
    """Raise the soft open-files limit to the hard one; returns the limit now in force.

    Every client and upstream connection is a descriptor, and the usual soft default of
    1024 is what thousands of idle or slow clients would exhaust first: accept() would then
    fail for everyone, however idle the reactor.
    """
    soft, hard = get(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        set_(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        return soft
    return hard


class ProxyService(MultiService):
    """The root service: owns the request path, the facades and the shared pool.

    In ``setServiceParent`` it registers the log observer on the twistd Application, so
    every line twistd itself logs goes to stderr too (twistd -n would otherwise log to stdout,
    which belongs to the broker).
    """

    log = Logger()

    def __init__(
        self,
        observer: LogObserver,
        facades: FacadeManager,
        request_path: RequestPath,
        upstream: Upstream,
        cluster: ClusterWatch,
        clock: IReactorTime,
        core: IReactorCore | None = None,
        bounds: ConnectionCounts | None = None,
    ) -> None:
        """:param bounds: the connections from every address but loopback (fleet mode), whose
        share of the open-files limit is set once the limit is raised."""
        super().__init__()
        self.cluster = cluster
        self.bounds = bounds
        self._clock = clock
        self._core = core
        #: The process's exit status: 0 unless :meth:`fail` ended it.
        self.exit_status = 0
        #: Flushes and closes the broker link's output (set in broker mode).
        self.close_broker: Callable[[], Deferred[None]] = lambda: defer.succeed(None)
        self.observer = observer
        self.facades = facades
        self.request_path = request_path
        self.upstream = upstream

    def setServiceParent(self, parent: IServiceCollection) -> None:
        if isinstance(parent, Componentized):
            parent.setComponent(ILogObserver, self.observer)
        super().setServiceParent(parent)

    def startService(self) -> None:
        limit = raise_fd_limit()
        self.log.debug("open files limit {limit}", limit=limit)
        if self.bounds is not None:
            # The rest is the reserve no LAN flood can take (docs/robustness.md#connection-bounds).
            self.bounds.capacity = lan_capacity(limit)
        this_machine()  # Ollama's Host allow-list needs it; resolved before any request
        super().startService()
        self.cluster.start()

    def fail(self, why: str, status: int = 1) -> None:
        """End the process with a non-zero ``status``: log ``why`` (on stderr), then the one
        ordered shutdown, as a signal would start it.

        For what has no one else to tell: in fleet mode a facade that cannot bind
        (docs/ports.md#bind-failures), in either mode the admin listener's port. The reactor
        is stopped rather than the process left at once, so facades already listening, polls
        and the pool close in order; whoever runs the process turns :attr:`exit_status` into
        the exit status (:func:`nvpair.tap.exit_with_status`, :func:`nvpair.cli.main`).
        """
        self.log.error("{why}: ending the process", why=why)
        if self.exit_status:
            return
        self.exit_status = status
        if self._core is not None:
            # Called from startService, the reactor may not run yet: stop it once it does.
            self._core.callWhenRunning(self._core.stop)

    def stopService(self) -> Deferred[None]:
        return Deferred.fromCoroutine(self._shutdown())

    async def _shutdown(self) -> None:
        """The one ordered shutdown: stop listening → cancel what is in flight → flush its
        terminal events → close the broker link → close the pool."""
        self.cluster.stop()
        # Stop listening: every facade, the admin listener; the fleet's polls stop too.
        children = defer.maybeDeferred(super().stopService)
        await defer.gatherResults([children, self.facades.stop()], consumeErrors=True)
        # Cancel what is in flight: each job's cleanup emits its terminal event now.
        self.request_path.cancel_all()
        # Those events are the last frames: flushed before the link closes (bounded).
        try:
            await self.close_broker().addTimeout(5, self._clock)
        except Exception:
            self.log.failure("closing the broker link")
        await self.upstream.close()


def _link_broker(
    core: IReactorCore,
    endpoint: str,
    root: ProxyService,
    control: ControlState,
    facades: FacadeManager,
    outbox: BrokerOutbox,
) -> None:
    """Broker mode: the JSON-RPC link drives the process; its EOF shuts it down."""

    def link_lost() -> None:
        # Broker EOF is the graceful shutdown signal: stop serving, close the pool, exit 0.
        # A link that the shutdown itself closed (a signal, ProxyService.fail) has nothing left
        # to stop: the reactor, already stopping, would refuse a second stop with an error.
        if not root.running:
            return
        root.log.info("broker link closed: shutting down")
        if core.running:
            core.stop()

    def enabled(engine: str) -> None:
        d = outbox.call(f"{engine}:discovery:subscribe", {})
        d.addErrback(
            lambda f: root.log.warn(
                "discovery:subscribe failed: {why}", engine=engine, why=f.getErrorMessage()
            )
        )

    methods = BrokerMethods(control, facades, root.observer, link_lost, enabled)
    protocol = BrokerProtocol(methods)
    outbox.protocol = protocol
    root.close_broker = protocol.close_output
    BrokerLinkService(core, endpoint, protocol).setServiceParent(root)


def _peer_tls(
    config: Config, cluster: ClusterWatch, control: ControlState
) -> IPolicyForHTTPS | None:
    """How ``https://`` peers are dialled: pinned TLS for a node with a cluster directory; a
    node without one dials no peer and never loads pyOpenSSL (docs/performance.md#memory)."""
    if config.cluster_dir is None:
        return None
    from nvpair.wire.trust.tls import PinnedPeers

    return PinnedPeers(lambda: cluster.membership, control.node_for_address)


def _observer(reactor: object, config: Config, out: IO[str]) -> LogObserver:
    """The log: text for a person at a terminal, else JSON (``--log-format``); Twisted's own
    lines in the process's words either way."""
    text = chosen_format(config.log_format, out) == "text"
    lines = TwistedLines(version(), event_loop(reactor))
    return LogObserver(out, config.log_level, text=text, readable=lines)


def request_bounds(config: Config) -> Bounds:
    """What bounds each request's effort, from the command line."""
    return Bounds(
        response_header_timeout=config.response_header_timeout,
        dial_timeout=config.dial_timeout,
        job_deadline=config.job_deadline,
        max_dispatch_attempts=config.max_dispatch_attempts,
        retry_backoff=config.retry_backoff,
        client_write_timeout=config.client_write_timeout,
    )


def build(
    reactor: IReactorTCP,
    config: Config,
    *,
    log_out: IO[str] | None = None,
) -> ProxyService:
    """Construct the whole process.

    :param reactor: the reactor: TCP, and (adapted) time and process control.
    :param log_out: where log lines go (stderr by default).
    """
    clock, core = IReactorTime(reactor), IReactorCore(reactor)
    observer = _observer(reactor, config, log_out or sys.stderr)
    access_log = AccessLog() if config.access_log else None
    # Fleet mode's [access]: who besides loopback may call (docs/lan.md).
    lan = LanGate(clock, config.fleet.access, config.fleet.admin) if config.fleet else None
    # Fleet mode bounds what the LAN may hold before anything is known of a caller; broker mode,
    # whose peers may hold more, counts nothing (docs/robustness.md#connection-bounds).
    bounds = ConnectionCounts() if config.fleet is not None else None
    control = ControlState()
    cluster = ClusterWatch(clock, config.cluster_dir)
    upstream = Upstream(reactor, config.dial_timeout, _peer_tls(config, cluster, control))
    reservations = Reservations()
    # A newer scheduler snapshot already counts the work reserved before it
    # (docs/candidate-order.md#reservations).
    control.on_priority(lambda priority: reservations.new_snapshot(priority.generation))
    outbox: BrokerOutbox | LogOutbox = LogOutbox() if config.fleet else BrokerOutbox()
    workloads = Workloads(outbox.notify, lambda: int(clock.seconds() * 1000), wanted=outbox.wanted)
    activity = NodeActivity(clock, outbox.notify, wanted=outbox.wanted)
    # Fleet mode has no scheduler: the proxy ranks nodes itself (docs/fleet-scheduling.md),
    # and finds hung nodes itself (docs/fleet-scheduling.md#hung-nodes).
    liveness = LivenessProbes(clock, upstream) if config.fleet is not None else None
    scheduler = (
        FleetScheduler(
            clock,
            HealthPolicy(config.fail_threshold, config.cooldown, config.cooldown_max),
            activity.in_flight,
            liveness,
            owner_wait=config.owner_wait,
            affinity=config.fleet.affinity,
        )
        if config.fleet is not None
        else None
    )
    scheduling: Scheduling = PriorityScheduling(control) if scheduler is None else scheduler
    # Fleet mode holds what cannot start now in a queue of its own (docs/fleet-scheduling.md
    # #the-queue); broker mode's scheduler decides and the engines queue.
    queue: FleetQueue | None = None
    if scheduler is not None and config.fleet is not None:
        queue = FleetQueue(
            clock,
            lambda node: scheduler.standing(*node).load,
            config.fleet.queue,
            config.fleet.parallel(),
        )
        # Capacity may free when a poll reads a node or a node joins.
        scheduler.load_changed = queue.pump
        control.on_discovery(lambda engine, snapshot: queue.pump() if queue else None)
    # Only an admin listener reads the last workloads: without one nothing records them.
    recent = RecentWorkloads() if config.admin_port is not None else None
    metrics = Metrics() if config.admin_port is not None else None
    request_path = RequestPath(
        clock,
        control,
        upstream,
        request_bounds(config),
        reservations,
        workloads,
        activity,
        scheduling,
        own_id=lambda: cluster.membership.node_id if cluster.membership else None,
        recorder=NOT_RECORDED if recent is None else recent,
        counter=NOT_COUNTED if metrics is None else metrics,
        access=access_log,
        queue=NO_QUEUE if queue is None else queue,
    )
    facades = FacadeManager(
        reactor,
        request_path,
        outbox,
        state_dir=config.state_dir,
        bind=config.bind,
        max_request_body=config.max_request_body,
        bodies=BodyBudget(config.max_body_memory),
        head_timeout=config.request_head_timeout,
        idle_timeout=config.idle_timeout,
        backlog=config.listen_backlog,
        membership=lambda: cluster.membership,
        access_log=NO_ACCESS_LOG if access_log is None else access_log,
        refusals=NO_REFUSALS if metrics is None else metrics,
        lan=LOOPBACK_ONLY if lan is None else lan,
        prefix_of=no_prefix if scheduler is None else scheduler.prefix_of,
        bounds=bounds,
    )

    def membership_changed(_: object) -> None:
        # Trust withdrawn means connections closed (docs/cluster.md#trust-withdrawn), then the news.
        upstream.trust_changed()
        facades.membership_changed()

    cluster.on_change = membership_changed
    root = ProxyService(observer, facades, request_path, upstream, cluster, clock, core, bounds)

    fleet: FleetService | None = None
    if config.fleet is not None:
        assert scheduler is not None
        fleet = FleetService(
            clock,
            config.fleet,
            control,
            facades,
            upstream,
            config.dial_timeout,
            scheduler,
            cannot_serve=root.fail,
            liveness=liveness,
            credentials=upstream.set_credentials,
        )
        fleet.setServiceParent(root)
        if config.fleet_file is not None and IReactorThreads.providedBy(reactor):
            assert lan is not None
            also = (
                lambda reread: lan.reload(reread.access, reread.admin),
                lambda reread: scheduler.reconfigure(reread.affinity),
                lambda reread: (
                    queue.reconfigure(reread.queue, reread.parallel()) if queue else None
                ),
            )
            FleetReloadService(reactor, config.fleet_file, fleet, also).setServiceParent(root)
    else:
        assert isinstance(outbox, BrokerOutbox)
        _link_broker(core, config.broker, root, control, facades, outbox)

    if config.admin_port is not None:
        # Imported only when asked for: klein and werkzeug are 6 MB of a resident set that
        # every held stream adds to (bench/README.md, held streams).
        from nvpair.observe.admin import Admin, QuietSite
        from nvpair.observe.status import FleetView

        admin = Admin(
            control,
            facades,
            lambda: request_path.in_flight,
            lambda: reservations.counts,
            clock=clock,
            node_in_flight=activity.in_flight,
            tls=lambda: cluster.membership is not None,
            lan=(lambda: lan.shown()) if lan is not None else (lambda: None),
            fleet=FleetView(fleet.reports, lambda: fleet.polled, scheduler, queue)
            if fleet is not None and scheduler is not None
            else None,
            expected=sorted(config.fleet.facades) if config.fleet is not None else None,
            recent=recent,
            metrics=metrics,
            live=activity.counts,
        )
        site = QuietSite(admin.app.resource(), "127.0.0.1", config.admin_port)
        on_lan = None
        if lan is not None and lan.admin is not None:
            # Its LAN address, every caller judged there (docs/lan.md#the-admin-view-from-the-lan).
            from nvpair.observe.adminguard import lan_factory

            where = (lan.admin.bind, config.admin_port)
            on_lan = (lan.admin.bind, lan_factory(clock, site.resource, lan, bounds, where))
        AdminListener(reactor, config.admin_port, site, root.fail, on_lan).setServiceParent(root)
    return root
