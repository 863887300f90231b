"""The real request path and upstream client in front of one llama.cpp node serving ``m``: what
the tests that drive a facade over loopback put behind it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.internet import reactor as _reactor

from nvpair.config import Config
from nvpair.control.reservations import Reservations
from nvpair.control.state import ControlState, Node
from nvpair.dispatch.activity import NodeActivity
from nvpair.dispatch.requestpath import RequestPath
from nvpair.dispatch.seams import PriorityScheduling
from nvpair.dispatch.workload import Emit, Workloads
from nvpair.service import request_bounds
from nvpair.wire.client.upstream import Upstream

#: The global reactor, untyped: its listen*/connect* generics reject our factories.
reactor: Any = _reactor


def _nowhere(method: str, params: Any) -> None:
    """Workload events nobody reads."""


def one_node_path(tmp_path: Path, url: str, emit: Emit = _nowhere) -> tuple[RequestPath, Upstream]:
    """A request path whose discovery is node ``gpu-1`` at ``url``, and its upstream client
    (closed by the caller); workload events go to ``emit``."""
    control = ControlState()
    control.set_discovery("llamacpp", [Node("gpu-1", False, url, ("m",), frozenset({"m"}))])
    upstream = Upstream(reactor, 5.0)
    path = RequestPath(
        reactor,
        control,
        upstream,
        request_bounds(Config(state_dir=tmp_path)),
        Reservations(),
        Workloads(emit, lambda: 0),
        NodeActivity(reactor, _nowhere),
        PriorityScheduling(control),
    )
    return path, upstream
