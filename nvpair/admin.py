"""The loopback-only admin surface (``--admin-port``): health, status and metrics.

klein is fine here and kept off the proxy hot path. Everything shown is operational state —
ports, node ids, counts — never request content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from klein import Klein
from twisted.web.iweb import IRequest

from nvpair.control import ControlState
from nvpair.facade_manager import FacadeManager


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Admin:
    """The admin routes over the live process state.

    :param in_flight: how many proxied requests are in flight right now.
    :param reservations: node id -> reservations held right now (nodes with none omitted).
    """

    app = Klein()

    def __init__(
        self,
        control: ControlState,
        facades: FacadeManager,
        in_flight: Callable[[], int],
        reservations: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._control = control
        self._facades = facades
        self._in_flight = in_flight
        self._reservations = reservations

    @app.route("/health", methods=["GET"])
    def health(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"status": "ok"}).encode()

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        facades = {
            engine: {"port": live.port, "aliases": list(live.aliases)}
            for engine, live in self._facades.facades.items()
        }
        body = {
            "facades": facades,
            "inFlight": self._in_flight(),
            "reservations": {n: c for n, c in self._reservations().items() if c},
            "control": self._control.snapshot_view(),
        }
        return json.dumps(body).encode()

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
