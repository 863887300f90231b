"""What the admin surface shows, as plain JSON-able values (docs/operations.md#status).

Pure: every function here reads values it is handed — the control state, counts, the fleet's
poll reports — and builds a document; the admin listener only serves it. Operational state
only: ids, URLs, counts, states and reasons, never request content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from attrs import frozen

from nvpair.control.affinity import CacheShare
from nvpair.control.state import ControlState
from nvpair.dispatch.queueing import FleetQueue
from nvpair.engines.loadstate import LoadState
from nvpair.engines.table import ENGINES, FACADES
from nvpair.fleet.pairs import PairReport, PollState
from nvpair.fleet.scheduling import FleetScheduler
from nvpair.observe.queueview import queue_document
from nvpair.observe.recent import RecentWorkloads
from nvpair.observe.recentview import recent_document


@frozen
class FacadeView:
    """An enabled facade as the status shows it.

    :ivar tls: it serves TLS: to pinned peers (mTLS) or to LAN callers.
    :ivar lan: fleet mode's ``[access]`` as it admits LAN callers to it (``networks``, whether
        a key is required, TLS, TLS required); None: loopback callers only.
    """

    port: int
    aliases: tuple[str, ...]
    tls: bool
    lan: Mapping[str, object] | None = None


@frozen
class FleetView:
    """What the status reads of standalone fleet mode.

    :ivar reports: every configured (node, engine)'s poll report, per engine
        (:meth:`nvpair.fleet.polls.FleetService.reports`).
    :ivar polled: whether every configured pair has been polled once.
    :ivar scheduler: load states and passive health.
    :ivar queue: the requests waiting (docs/fleet-scheduling.md#the-queue); None: none kept.
    """

    reports: Callable[[], Mapping[str, tuple[PairReport, ...]]]
    polled: Callable[[], bool]
    scheduler: FleetScheduler
    queue: FleetQueue | None = None


def _when(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _load(state: LoadState) -> dict[str, object]:
    return {
        "loading": state.loading,
        # "all": llama.cpp serves the one model it loaded; None: the engine did not say.
        "inMemory": "all"
        if state.warm_all
        else (sorted(state.warm) if state.warm is not None else None),
        "slots": state.slots,
        "busySlots": state.busy,
        # A llama.cpp router's: the models it is loading, and each loaded one's own slots.
        "loadingModels": sorted(state.loading_models),
        "modelSlots": {
            model: {"slots": slots, "busySlots": busy} for model, slots, busy in state.model_slots
        },
        # llama.cpp --sleep-idle-seconds: the server (or a router's model) is asleep, its
        # model out of memory until a request wakes it (docs/fleet-scheduling.md#sleeping-servers).
        "sleeping": state.sleeping,
        "sleepingModels": sorted(state.sleeping_models),
    }


def shown_url(url: str | None) -> str | None:
    """``url`` without a user name or password, if it holds any: the status is read by anyone
    on the machine, and a broker may hand over such a URL. Never fails, whatever the text."""
    if url is None or "@" not in url:
        return url
    scheme, sep, rest = url.partition("://")
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority = rest[:end]
    if not sep or "@" not in authority:
        return url
    _, _, host = authority.rpartition("@")
    return f"{scheme}://***@{host}{rest[end:]}"


def _counts(
    engine: str,
    node: str,
    reservations: Mapping[str, int],
    in_flight: Callable[[str, str], int],
) -> dict[str, object]:
    return {"reservations": reservations.get(node, 0), "inFlight": in_flight(engine, node)}


def broker_nodes(
    engine: str,
    control: ControlState,
    reservations: Mapping[str, int],
    in_flight: Callable[[str, str], int],
) -> list[dict[str, object]]:
    """An engine's discovery snapshot with the scheduler's figures for each node."""
    priority = control.priority
    out: list[dict[str, object]] = []
    for node in control.discovery(engine).nodes:
        entry = priority.entry(node.id)
        # Before any scheduler snapshot every node counts as listed with no load.
        listed = priority.entries is None or entry is not None
        out.append(
            {
                "id": node.id,
                "local": node.local,
                "url": shown_url(node.url),
                "models": list(node.models),
                "listed": listed,
                "pending": entry.pending if entry is not None else 0,
                "gpuPressure": entry.gpu_pressure if entry is not None else 0,
                **_counts(engine, node.id, reservations, in_flight),
            }
        )
    return out


def fleet_state(report: PairReport, held: bool, hung: bool = False) -> str:
    """The one word an operator reads first: ``up``, ``down``, ``loading``, ``held-back``,
    ``hung``, ``pending`` (not polled yet). Hung outranks the rest: its poll, still waiting,
    has not said so yet, or says it timed out. Held back outranks what the poll says: the node
    is being passed over now."""
    if hung:
        return "hung"
    if held:
        return "held-back"
    return report.state.value


#: The states of :func:`fleet_state` in which a node counts as up (``nvpair_node_up``): its
#: engine answers, a model load included. Down, held back, hung and not yet polled are not.
UP_STATES = frozenset({"up", "loading"})


class Hung(NamedTuple):
    """Why a node is hung (its liveness probe), and since when (clock time)."""

    why: str
    since: float


def _hung(fleet: FleetView, engine: str, node: str) -> Hung | None:
    """Why the node is hung and since when; None while it is not."""
    probes = fleet.scheduler.liveness
    if probes is None:
        return None
    why, since = probes.why(engine, node), probes.of(engine, node).hung_since
    return None if why is None or since is None else Hung(why, since)


def fleet_nodes_up(fleet: FleetView, now: float) -> dict[tuple[str, str], bool]:
    """(engine, node) -> whether it is up, for every configured node (``nvpair_node_up``)."""
    health = fleet.scheduler.health
    return {
        (engine, report.node): fleet_state(
            report,
            health.of(engine, report.node).held(now),
            _hung(fleet, engine, report.node) is not None,
        )
        in UP_STATES
        for engine, reports in fleet.reports().items()
        for report in reports
    }


def fleet_nodes(
    engine: str,
    reports: Sequence[PairReport],
    fleet: FleetView,
    now: float,
    reservations: Mapping[str, int],
    in_flight: Callable[[str, str], int],
) -> list[dict[str, object]]:
    """Every configured node of ``engine``, in discovery or not, with why it is where it is."""
    out: list[dict[str, object]] = []
    passive = fleet.scheduler.health
    for report in reports:
        health = passive.of(engine, report.node)
        held = health.held(now)
        hung = _hung(fleet, engine, report.node)
        state = fleet_state(report, held, hung is not None)
        last_failure = passive.last_failure(engine, report.node)
        if hung is not None:
            why: str | None = hung.why
        elif held:
            why = f"{health.failures} failed attempts in a row (last: {last_failure})"
        elif report.state in (PollState.DOWN, PollState.LOADING):
            why = report.last_error
        else:
            why = None
        out.append(
            {
                "id": report.node,
                "url": shown_url(report.url),
                "state": state,
                "why": why,
                "since": _when(hung.since if hung is not None else report.since),
                "lastPoll": _when(report.last_poll),
                "lastError": report.last_error,
                "models": list(report.models),
                "pending": 0,
                "gpuPressure": 0,
                **_counts(engine, report.node, reservations, in_flight),
                "load": _load(fleet.scheduler.load(engine, report.node)),
                "health": {
                    "failuresInARow": health.failures,
                    "heldUntil": _when(health.held_until) if held else None,
                    "lastFailure": last_failure,
                },
                "cache": _cache(fleet.scheduler.caches.share(engine, report.node, now)),
            }
        )
    return out


def _cache(share: CacheShare | None) -> dict[str, object] | None:
    """What a node's answers said of its cache
    (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity); None before any said."""
    if share is None:
        return None
    ratio = share.share
    return {
        "share": None if ratio is None else round(ratio, 3),
        "answers": share.answers,
        "promptTokens": share.prompt_tokens,
        "cachedTokens": share.cached_tokens,
        "suspendedUntil": _when(share.suspended_until),
    }


def affinity_document(scheduler: FleetScheduler) -> dict[str, object]:
    """``affinity``: fleet mode's ``[scheduling]`` and its table's fill."""
    return {
        "enabled": scheduler.affinity.enabled,
        "slack": scheduler.affinity.slack,
        "entries": len(scheduler.table),
        "bound": scheduler.table.bound,
    }


def status_document(
    facades: Mapping[str, FacadeView],
    control: ControlState,
    reservations: Mapping[str, int],
    in_flight: Callable[[str, str], int],
    total_in_flight: int,
    fleet: FleetView | None,
    now: float,
    recent: RecentWorkloads | None = None,
) -> dict[str, object]:
    """``GET /status`` (docs/operations.md#status)."""
    nodes: dict[str, list[dict[str, object]]]
    # Nodes are per engine: the openai facade has none of its own (its engines' are listed).
    engines = {engine for engine in facades if engine in ENGINES}
    if fleet is not None:
        reports = fleet.reports()
        nodes = {
            engine: fleet_nodes(
                engine, reports.get(engine, ()), fleet, now, reservations, in_flight
            )
            for engine in sorted(engines | set(reports))
        }
    else:
        nodes = {
            engine: broker_nodes(engine, control, reservations, in_flight)
            for engine in sorted(engines)
        }
    return {
        "mode": "fleet" if fleet is not None else "broker",
        "facades": {
            engine: {
                "port": view.port,
                "aliases": list(view.aliases),
                "tls": view.tls,
                **({} if view.lan is None else {"lan": view.lan}),
            }
            for engine, view in sorted(facades.items())
        },
        "nodes": nodes,
        "pin": {engine: control.pin(engine) for engine in sorted(facades)},
        "priorityGeneration": control.priority.generation,
        "inFlight": total_in_flight,
        "reservations": {node: count for node, count in reservations.items() if count},
        "recent": recent_document(recent),
        **({} if fleet is None else {"affinity": affinity_document(fleet.scheduler)}),
        **(
            {}
            if fleet is None or fleet.queue is None
            else {"queue": queue_document(fleet.queue, now)}
        ),
    }


def nodes_up(facade: str, control: ControlState) -> bool:
    """Whether any engine the facade reaches (its own, or every one for ``openai``) has a node
    in discovery."""
    serves = FACADES[facade].serves if facade in FACADES else (facade,)
    return any(control.discovery(engine).nodes for engine in serves)


def readiness(
    expected: Sequence[str],
    listening: Mapping[str, FacadeView],
    control_received: bool,
    control: ControlState,
) -> tuple[bool, dict[str, object]]:
    """``GET /readyz``: ready once every expected facade listens and control state arrived.

    :param expected: the facades that should be listening (the fleet file's; in broker mode
        the ones the broker enabled).
    :param control_received: a broker discovery snapshot for each, or the fleet's first round
        of polls.
    :returns: whether ready, and the body that says what is still awaited. Engines with no
        node up are named either way: the process is ready, but that engine answers
        ``no-owner``.
    """
    waiting = [f"facade {engine} not listening" for engine in expected if engine not in listening]
    if not control_received:
        waiting.append("control state not received yet")
    without = [engine for engine in sorted(listening) if not nodes_up(engine, control)]
    return not waiting, {
        "ready": not waiting,
        "waitingFor": waiting,
        "enginesWithoutNodes": without,
    }


__all__ = [
    "FacadeView",
    "FleetView",
    "broker_nodes",
    "fleet_nodes",
    "fleet_nodes_up",
    "fleet_state",
    "readiness",
    "status_document",
]
