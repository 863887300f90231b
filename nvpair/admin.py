"""The loopback-only admin surface (``--admin-port``): health, status, metrics and the live
status page.

klein is fine here and kept off the proxy hot path. Everything shown is operational state —
ports, node ids, counts — never request content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from klein import Klein
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IRequest

from nvpair.control import ControlState
from nvpair.facade_manager import FacadeManager
from nvpair.recent import RecentWorkloads
from nvpair.status import FacadeView, FleetView, readiness, status_document
from nvpair.statuspage import CONTENT_SECURITY_POLICY, PAGE


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
    ) -> None:
        self._control = control
        self._facades = facades
        self._in_flight = in_flight
        self._reservations = reservations
        self._clock = clock
        self._node_in_flight = node_in_flight
        self._tls = tls
        self._fleet = fleet
        self._expected = expected
        self._recent = recent

    def _views(self) -> dict[str, FacadeView]:
        tls = self._tls()
        return {
            engine: FacadeView(live.port, tuple(live.aliases), tls)
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
        request.setHeader(b"content-type", b"text/plain; version=0.0.4")
        lines = [
            "# HELP nvpair_requests_in_flight Proxied requests in flight.",
            "# TYPE nvpair_requests_in_flight gauge",
            f"nvpair_requests_in_flight {self._in_flight()}",
            "# HELP nvpair_facade_port The port each enabled facade listens on.",
            "# TYPE nvpair_facade_port gauge",
        ]
        for engine, live in sorted(self._facades.facades.items()):
            lines.append(f'nvpair_facade_port{{engine="{_label(engine)}"}} {live.port}')
        lines += [
            "# HELP nvpair_discovery_nodes Nodes in each engine's discovery snapshot.",
            "# TYPE nvpair_discovery_nodes gauge",
        ]
        for engine in sorted(self._facades.facades):
            count = len(self._control.discovery(engine).nodes)
            lines.append(f'nvpair_discovery_nodes{{engine="{_label(engine)}"}} {count}')
        return ("\n".join(lines) + "\n").encode()
