"""One simulated llama.cpp node in a process of its own, with the knobs the bench needs.

``python -m bench.simnode PORT CONTROL_PORT --tokens N --interval S --fault KIND``

``nvpair.sim``'s command line has no tokens or fault knobs, so the bench drives
:class:`~nvpair.sim.SimEngine` itself. Besides the engine's port it serves a control port:
``GET /count`` answers how many inference POSTs (``count``) and other requests (``other``: the
inventory polls) the engine has received, so a failover run can tell which requests really met
the fault, and how many answers their client abandoned (``abandoned``). The *refused* fault is
this process ending after the proxy's first inventory poll found the node: the port then
refuses and every pooled connection to it is gone.

The engine listens with a deep backlog: held streams open 500 connections a second, and a
dropped SYN would cost the client a one-second retransmit that is no proxy's doing.
"""

from __future__ import annotations

import argparse
import json
import signal

from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.task import LoopingCall
from twisted.web import http
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

from nvpair.sim import SimEngine

FAULTS = ("none", "503", "reset", "stall")
"""Applied to every inference request."""


class Control(Resource):
    """The bench's side channel to the node."""

    isLeaf = True

    def __init__(self, engine: SimEngine) -> None:
        Resource.__init__(self)
        self.engine = engine
        self.count = 0
        self.other = 0

    def collect(self) -> None:
        """Count and forget what the engine recorded: its request list would grow unbounded."""
        posts = sum(1 for r in self.engine.requests if r.method == "POST")
        self.count += posts
        self.other += len(self.engine.requests) - posts
        self.engine.requests.clear()

    def render(self, request: Request) -> bytes:
        self.collect()
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {"count": self.count, "other": self.other, "abandoned": self.engine.abandoned}
        ).encode()


class QuietSite(Site):
    def __init__(self, root: IResource) -> None:
        Site.__init__(self, root)

    def log(self, request: http.Request) -> None:
        """No access log."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simnode", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("control", type=int)
    parser.add_argument("--node", default="sim")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    args = parser.parse_args()
    from twisted.internet import reactor

    engine = SimEngine(
        reactor,
        "llamacpp",
        models=["tiny"],
        node=args.node,
        tokens=[" tok"] * args.tokens,
        chunk_interval=args.interval,
    )
    if args.fault == "503":
        engine.faults.status = 503
    elif args.fault == "reset":
        engine.faults.reset_before_headers = True
    elif args.fault == "stall":
        engine.faults.stall = True
    control = Control(engine)
    LoopingCall(control.collect).start(1.0)
    for port, root in ((args.port, engine.resource()), (args.control, control)):
        endpoint = TCP4ServerEndpoint(reactor, port, backlog=4096, interface="127.0.0.1")
        endpoint.listen(QuietSite(root))

    def stop(signum: int, frame: object) -> None:
        IReactorThreads(reactor).callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, stop)
    reactor.run()


if __name__ == "__main__":
    main()
