# -*- test-case-name: tests.sim.test_sim -*-
"""Run simulated engines on loopback until SIGINT/SIGTERM (``make demo``).

``python -m nvpair.sim --serve ollama 21434 node-a llama3:latest,qwen2:7b --serve ...``

``--cold --load-delay 2 --keep-alive 30`` starts every engine with no model in memory: a model's
first request waits two seconds for its load, and a model unused for thirty seconds is unloaded.
``--max-loaded 2`` holds at most two models in memory per engine, as a GPU's memory does: a
third evicts one first (:mod:`nvpair.sim.memory`). ``--cache-ram 0`` turns llama.cpp's RAM
prompt cache off (:mod:`nvpair.sim.promptcache`), as ``llama-server --cache-ram 0`` does.

``--parallel 2`` runs two answers at once per model on every engine, the rest waiting their turn
in order (:mod:`nvpair.sim.turns`): llama.cpp's ``-np`` (default 4, as ``-np auto``), Ollama's
``OLLAMA_NUM_PARALLEL`` (default 1), LM Studio's Max Concurrent Predictions (default 4).
``--max-queue 8`` is Ollama's ``OLLAMA_MAX_QUEUE`` (default 512): requests for models not in
memory past that many waiting are answered 503. ``--cold --load-delay 3 --max-loaded 1`` makes
an Ollama a small box that swaps its one model, in arrival order.

Two of the fault knobs (:class:`~nvpair.sim.engine.Faults`) are worked by signal while it runs,
for every engine of the process: ``SIGUSR1`` turns failing on and off (each inference answers
503), ``SIGUSR2`` turns "gone" on and off (connections refused, as a machine that went away).
``make demo`` runs one process per node, so ``kill -USR1 PID`` fails one node.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorThreads
from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from nvpair.sim.engine import DIALECTS, SimEngine
from nvpair.sim.ollama import DEFAULT_MAX_QUEUE
from nvpair.sim.promptcache import DEFAULT_CACHE_RAM_MIB

#: The status every inference answers while SIGUSR1 has the process failing.
FAIL_STATUS = 503

EPILOG = f"""\
fault knobs, by signal, for every engine of this process (send the same signal again to undo):
  kill -USR1 PID   failing: every inference request is answered {FAIL_STATUS}
  kill -USR2 PID   gone: connections are refused (the model-list poll fails too)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nvpair.sim",
        description="Serve simulated Ollama / LM Studio / llama.cpp engines on 127.0.0.1.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--serve",
        nargs=4,
        action="append",
        required=True,
        metavar=("ENGINE", "PORT", "NODE", "MODELS"),
        help=f"one engine: ENGINE in {{{','.join(DIALECTS)}}}, PORT (0 = any free), NODE name, "
        "MODELS comma-separated (may be empty)",
    )
    parser.add_argument(
        "--chunk-interval",
        type=float,
        default=0.05,
        metavar="SECONDS",
        help="delay between streamed chunks (default 0.05, so a demo visibly streams)",
    )
    parser.add_argument(
        "--load-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long a model not in memory takes to load (default 0)",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        metavar="SECONDS",
        help="unload a model this long after its last request ends (default: never)",
    )
    parser.add_argument(
        "--max-loaded",
        type=int,
        default=None,
        metavar="N",
        help="at most N models in memory per engine (OLLAMA_MAX_LOADED_MODELS); loading one "
        "more evicts one first (default: any number)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="answers each engine runs at once per model, the rest waiting in order "
        "(default: the engine's own: llama.cpp -np auto 4, OLLAMA_NUM_PARALLEL 1, "
        "LM Studio Max Concurrent Predictions 4)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help="Ollama's OLLAMA_MAX_QUEUE: requests for models not in memory that may wait; one "
        f"more is answered 503 (default {DEFAULT_MAX_QUEUE})",
    )
    parser.add_argument(
        "--cache-ram",
        type=int,
        default=DEFAULT_CACHE_RAM_MIB,
        metavar="MIB",
        help="llama.cpp's RAM prompt cache, as llama-server's --cache-ram: 0 off, -1 no limit "
        f"(default {DEFAULT_CACHE_RAM_MIB})",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start with no model in memory (default: every model loaded)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.load_delay < 0 or (args.keep_alive is not None and args.keep_alive < 0):
        parser.error("--load-delay and --keep-alive must not be negative")
    if args.max_loaded is not None and args.max_loaded < 1:
        parser.error("--max-loaded must be at least 1")
    if args.parallel is not None and args.parallel < 1:
        parser.error("--parallel must be at least 1")
    if args.max_queue < 0:
        parser.error("--max-queue must not be negative")
    if args.cache_ram < -1:
        parser.error("--cache-ram is MiB, 0 (off) or -1 (no limit)")
    specs: list[tuple[str, int, str, list[str]]] = []
    for engine, port, node, models in args.serve:
        if engine not in DIALECTS:
            parser.error(f"unknown ENGINE {engine!r}; choose from {', '.join(DIALECTS)}")
        if not port.isdigit() or int(port) > 65535:
            parser.error(f"PORT must be 0-65535, got {port!r}")
        names = [m.strip() for m in models.split(",") if m.strip()]
        specs.append((engine, int(port), node, names))

    # The one place the global reactor is imported: this is the program's edge.
    from twisted.internet import reactor

    # Warnings and failures (a dialect raising, say) go to stderr next to the listener lines;
    # stdout stays untouched.
    observer = FilteringLogObserver(
        textFileLogObserver(sys.stderr), [LogLevelFilterPredicate(LogLevel.warn)]
    )
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)

    engines: list[SimEngine] = []
    for engine, port, node, names in specs:
        sim = SimEngine(
            reactor,
            engine,
            models=names,
            node=node,
            chunk_interval=args.chunk_interval,
            load_delay=args.load_delay,
            keep_alive=args.keep_alive,
            warm=() if args.cold else None,
            max_loaded=args.max_loaded,
            cache_ram=args.cache_ram,
            parallel=args.parallel,
            max_queue=args.max_queue,
        )
        try:
            bound = sim.listen(port, "127.0.0.1")
        except Exception as e:  # a bind failure (port in use, ...) ends the run with a message
            sys.stderr.write(f"nvpair.sim: cannot listen for {engine} {node} on {port}: {e}\n")
            for started in engines:
                started.stop()
            return 1
        engines.append(sim)
        sys.stderr.write(
            f"nvpair.sim: {engine} node {node} on {sim.url} (port {bound}) "
            f"models: {', '.join(names) or '(none)'}\n"
        )
        sys.stderr.flush()

    def shutdown() -> Deferred[object]:
        return DeferredList([sim.stop() for sim in engines]).addCallback(lambda _: None)

    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        # Once: a Ctrl-C and a SIGTERM close together would otherwise stop a stopped reactor.
        if reactor.running and not stopping:
            stopping.append(signum)
            # callFromThread wakes the reactor out of its poll; a bare stop() would wait for it.
            IReactorThreads(reactor).callFromThread(reactor.stop)

    # Our own handlers: reactor.run leaves SIGINT alone when it starts out ignored, which is how
    # a shell starts a background job (``python -m nvpair.sim ... &`` in a Makefile).
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for signum, knob in ((signal.SIGUSR1, toggle_failing), (signal.SIGUSR2, toggle_gone)):
        signal.signal(signum, _on_reactor(reactor, knob, engines))
    reactor.addSystemEventTrigger("before", "shutdown", shutdown)
    reactor.run()
    return 0


def _on_reactor(
    reactor: object,
    knob: Callable[[Sequence[SimEngine]], Deferred[str]],
    engines: Sequence[SimEngine],
) -> Callable[[int, object], None]:
    """A signal handler that turns ``knob`` as a reactor event of its own, then says so (once
    the change has taken effect)."""

    def said(news: str) -> None:
        sys.stderr.write(f"nvpair.sim: {news}\n")
        sys.stderr.flush()

    def turn() -> None:
        knob(engines).addCallback(said)

    # The handler runs between bytecodes of whatever the reactor is doing.
    return lambda signum, frame: IReactorThreads(reactor).callFromThread(turn)


def _names(engines: Sequence[SimEngine]) -> str:
    return ", ".join(f"{sim.dialect} {sim.node}" for sim in engines)


def toggle_failing(engines: Sequence[SimEngine]) -> Deferred[str]:
    """SIGUSR1: every inference answers :data:`FAIL_STATUS`, or no longer does."""
    failing = not all(sim.faults.status == FAIL_STATUS for sim in engines)
    for sim in engines:
        sim.faults.status = FAIL_STATUS if failing else None
    state = f"failing (inference answers {FAIL_STATUS})" if failing else "healthy"
    return succeed(f"{_names(engines)}: {state}")


def toggle_gone(engines: Sequence[SimEngine]) -> Deferred[str]:
    """SIGUSR2: stop listening (connections refused), or listen again on the same ports."""
    if any(sim.listening for sim in engines):
        closed = DeferredList([sim.refuse() for sim in engines])
        return closed.addCallback(lambda _: f"{_names(engines)}: gone (connections refused)")
    for sim in engines:
        sim.resume()
    return succeed(f"{_names(engines)}: back")


if __name__ == "__main__":
    raise SystemExit(main())
