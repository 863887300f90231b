"""One simulated node in a process of its own, with the knobs the bench needs.

``python -m bench.simnode PORT CONTROL_PORT --tokens N --interval S --fault KIND``
(a llama.cpp node serving ``tiny``), or for the cold-start mix
``... --dialect ollama --models a:1b,b:7b --load-delay 2 --keep-alive 30 --max-loaded 2 --cold
--paced``; ``--parallel N`` gives the engine N places per model (llama.cpp's slots, Ollama's
``OLLAMA_NUM_PARALLEL``), past which it queues as the real engine does.

``nvpair.sim``'s command line has no tokens or fault knobs, so the bench drives
:class:`~nvpair.sim.SimEngine` itself. Besides the engine's port it serves a control port:
``GET /count`` answers how many inference POSTs (``count``) and other requests (``other``: the
inventory polls) the engine has received, so a failover run can tell which requests really met
the fault, how many answers their client abandoned (``abandoned``), and how many model loads
(cold starts) the engine has started (``loads``, :attr:`nvpair.sim.memory.Memory.loads`), how
many models it unloaded to make room for another (``evictions``, with ``--max-loaded``), and how
many answers hold one of its places now (``running``) and wait for one (``waiting``). The
*refused* fault is this process ending after the proxy's first inventory poll found the node:
the port then refuses and every pooled connection to it is gone.

``--paced`` (Ollama's native routes): a non-streamed answer's body comes as long after its
headers as its tokens would have taken to stream, as a real engine generates before it answers;
the simulator alone would answer it at once, so it would never occupy its node.

The engine listens with a deep backlog: held streams open 500 connections a second, and a
dropped SYN would cost the client a one-second retransmit that is no proxy's doing.
"""

from __future__ import annotations

import argparse
import json
import signal
from typing import cast

from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.interfaces import IReactorThreads
from twisted.internet.task import LoopingCall
from twisted.web import http
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site

from nvpair.sim import DIALECTS, SimEngine

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
            {
                "count": self.count,
                "other": self.other,
                "abandoned": self.engine.abandoned,
                "loads": self.engine.memory.loads,
                "evictions": self.engine.memory.evictions,
                "running": self.engine.running,
                "waiting": self.engine.queued,
            }
        ).encode()


class Paced(Resource):
    """The engine's resource, with a non-streamed Ollama answer's body held back for as long as
    its tokens would have streamed (``chunk_interval`` each)."""

    isLeaf = True

    def __init__(self, engine: SimEngine) -> None:
        Resource.__init__(self)
        self.engine = engine
        self.inner = engine.resource()

    def render(self, request: Request) -> bytes | int:
        body = b""
        if request.content is not None:
            request.content.seek(0)
            body = request.content.read()
            request.content.seek(0)
        # The knobs are read when the request arrives, and render runs to that point at once:
        # setting them here shapes exactly this request.
        self.engine.faults.first_byte_delay = generation_seconds(
            request.method, request.path, body, len(self.engine.tokens), self.engine.chunk_interval
        )
        answer: bytes | int = self.inner.render(request)
        return answer


def generation_seconds(
    method: bytes, path: bytes, body: bytes, tokens: int, interval: float
) -> float:
    """How long a non-streamed Ollama answer generates: its tokens (``tokens``, or fewer under
    ``options.num_predict``) ``interval`` apart; 0 for anything else (streamed, not Ollama's
    native inference, not a JSON object)."""
    if method != b"POST" or path not in (b"/api/generate", b"/api/chat"):
        return 0.0
    try:
        parsed = json.loads(body)
    except ValueError:
        return 0.0
    # Ollama streams unless told not to.
    if not isinstance(parsed, dict) or parsed.get("stream", True) is not False:
        return 0.0
    options = parsed.get("options")
    limit = options.get("num_predict") if isinstance(options, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < tokens:
        tokens = limit
    return tokens * interval


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
    parser.add_argument("--dialect", choices=DIALECTS, default="llamacpp")
    parser.add_argument("--models", default="tiny", help="comma-separated")
    parser.add_argument("--load-delay", type=float, default=0.0, help="seconds a load takes")
    parser.add_argument("--keep-alive", type=float, help="seconds idle before an unload")
    parser.add_argument("--max-loaded", type=int, help="models in memory at once (evicts)")
    parser.add_argument("--cold", action="store_true", help="start with no model in memory")
    parser.add_argument("--paced", action="store_true", help="pace non-streamed answers")
    parser.add_argument(
        "--parallel", type=int, help="answers run at once per model (the engine's default)"
    )
    args = parser.parse_args()
    from twisted.internet import reactor

    engine = SimEngine(
        reactor,
        args.dialect,
        models=[m for m in args.models.split(",") if m],
        node=args.node,
        tokens=[" tok"] * args.tokens,
        chunk_interval=args.interval,
        load_delay=args.load_delay,
        keep_alive=args.keep_alive,
        warm=() if args.cold else None,
        max_loaded=args.max_loaded,
        parallel=args.parallel,
    )
    if args.fault == "503":
        engine.faults.status = 503
    elif args.fault == "reset":
        engine.faults.reset_before_headers = True
    elif args.fault == "stall":
        engine.faults.stall = True
    control = Control(engine)
    LoopingCall(control.collect).start(1.0)
    served = cast(IResource, Paced(engine)) if args.paced else engine.resource()
    for port, root in ((args.port, served), (args.control, control)):
        endpoint = TCP4ServerEndpoint(reactor, port, backlog=4096, interface="127.0.0.1")
        endpoint.listen(QuietSite(root))

    def stop(signum: int, frame: object) -> None:
        IReactorThreads(reactor).callFromThread(reactor.stop)

    signal.signal(signal.SIGTERM, stop)
    reactor.run()


if __name__ == "__main__":
    main()
