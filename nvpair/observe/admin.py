"""The admin surface (``--admin-port``, on loopback; on a LAN address too with the fleet's
``[admin]``, :mod:`nvpair.observe.adminguard`): health, status, metrics and the live status page.

klein is fine here and kept off the proxy hot path. Everything shown is operational state —
ports, node ids, counts — never request content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from klein import Klein
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from twisted.web.server import Site

from nvpair.control.state import ControlState
from nvpair.facades.manager import FacadeManager
from nvpair.observe.exposition import LiveState, MetricsCollector
from nvpair.observe.metrics import Metrics
from nvpair.observe.recent import RecentWorkloads
from nvpair.observe.status import FacadeView, FleetView, fleet_nodes_up, readiness, status_document
from nvpair.observe.statuspage import CONTENT_SECURITY_POLICY, PAGE


class Admin:
    """The admin routes over the live process state.

    :param in_flight: how many proxied requests are in flight right now.
    :param reservations: node id -> reservations held right now (nodes with none omitted).
    :param node_in_flight: this process's dispatches in flight to (engine, node).
    :param tls: whether the facades admit peers over mutual TLS now (cluster membership).
    :param fleet: standalone fleet mode's poll reports and scheduler; None in broker mode.
    :param expected: the facades that must listen to be ready (the fleet file's); None: those
        the broker enabled.
    :param recent: the last workloads the request path recorded (``recent`` in ``/status``).
    :param metrics: what the request path counted (``/metrics``).
    :param live: (engine, node) -> this process's dispatches in flight.
    :param lan: fleet mode's ``[access]`` in force, as ``/status`` shows it per facade (None:
        loopback callers only).
    """

    app = Klein()

    def __init__(
        self,
        control: ControlState,
        facades: FacadeManager,
        in_flight: Callable[[], int],
        reservations: Callable[[], Mapping[str, int]] = dict,
        *,
        clock: IReactorTime,
        node_in_flight: Callable[[str, str], int] = lambda engine, node: 0,
        tls: Callable[[], bool] = lambda: False,
        fleet: FleetView | None = None,
        expected: Sequence[str] | None = None,
        recent: RecentWorkloads | None = None,
        metrics: Metrics | None = None,
        live: Callable[[], Mapping[tuple[str, str], int]] = dict,
        lan: Callable[[], Mapping[str, object] | None] = lambda: None,
    ) -> None:
        self._control = control
        self._facades = facades
        self._in_flight = in_flight
        self._reservations = reservations
        self._clock = clock
        self._node_in_flight = node_in_flight
        self._tls = tls
        self._lan = lan
        self._fleet = fleet
        self._expected = expected
        self._recent = recent
        self._registry = CollectorRegistry(auto_describe=False)
        # The process's own CPU, memory and descriptors, beside what the proxy counts.
        ProcessCollector(registry=self._registry)
        self._registry.register(
            MetricsCollector(
                metrics or Metrics(),
                LiveState(
                    facades=self._facade_ports,
                    discovery=lambda engine: len(control.discovery(engine).nodes),
                    in_flight=live,
                    reservations=reservations,
                    requests_in_flight=in_flight,
                    nodes_up=self._nodes_up,
                    queue_depth=self._queue_depth,
                ),
            )
        )

    def _queue_depth(self) -> dict[tuple[str, str], int]:
        queue = self._fleet.queue if self._fleet is not None else None
        return {} if queue is None else queue.depths()

    def _facade_ports(self) -> dict[str, int | None]:
        """Every facade that listens or should (None: it does not)."""
        listening = self._facades.facades
        ports: dict[str, int | None] = dict.fromkeys(self._expected or ())
        ports.update((engine, live.port) for engine, live in listening.items())
        return ports

    def _nodes_up(self) -> dict[tuple[str, str], bool]:
        if self._fleet is None:
            return {}
        return fleet_nodes_up(self._fleet, self._clock.seconds())

    def _views(self) -> dict[str, FacadeView]:
        tls = self._tls()
        lan = self._lan()
        lan_tls = bool(lan and lan.get("tls"))
        return {
            engine: FacadeView(live.port, tuple(live.aliases), (tls and live.peers) or lan_tls, lan)
            for engine, live in self._facades.facades.items()
        }

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"status": "ok"}).encode()

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        listening = self._views()
        if self._fleet is not None:
            received = self._fleet.polled()
        else:
            # Broker mode: every facade the broker enabled has had its discovery snapshot.
            received = bool(listening) and all(self._control.reported(e) for e in listening)
        expected = self._expected if self._expected is not None else sorted(listening)
        ready, body = readiness(expected, listening, received, self._control)
        request.setResponseCode(200 if ready else 503)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(body).encode()

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        body = status_document(
            self._views(),
            self._control,
            self._reservations(),
            self._node_in_flight,
            self._in_flight(),
            self._fleet,
            self._clock.seconds(),
            self._recent,
        )
        return json.dumps(body).encode()

    @app.route("/", methods=["GET"])
    def page(self, request: IRequest) -> bytes:
        """The live status page: one document, its style and script inline, reading
        ``/status`` (docs/operations.md#the-status-page)."""
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", CONTENT_SECURITY_POLICY)
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"referrer-policy", b"no-referrer")
        request.setHeader(b"cache-control", b"no-store")
        return PAGE

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: IRequest) -> bytes:
        """Prometheus text (docs/operations.md#metrics), read when scraped."""
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
        return generate_latest(self._registry)


class QuietSite(Site):
    """The admin listener's Site: a monitor polling ``/status`` is no news at info level.

    Here, not in :mod:`nvpair.service`: ``twisted.web.server`` is loaded only by a process with
    an admin listener (docs/performance.md#memory)."""

    noisy = False
    _logger = Logger(namespace="nvpair.observe.admin")

    def __init__(self, resource: IResource, host: str, port: int) -> None:
        """:param host: and :param port: where it listens, for the line that says so."""
        super().__init__(resource)  # type: ignore[no-untyped-call]
        self._where = (host, port)

    def startFactory(self) -> None:
        # Its port is bound by now (Twisted starts a factory once its socket is); this line
        # stands for Twisted's own "QuietSite starting on …", which the log drops.
        super().startFactory()
        host, port = self._where
        self._logger.info("admin listener on {host}:{port}", host=host, port=port)

    def log(self, request: object) -> None:
        """No access log (docs/README.md#logging: per-request lines stay below info)."""
