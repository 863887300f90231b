"""Pure reading of what an engine says about its own load (docs/fleet-scheduling.md#load-state).

Standalone fleet mode has no scheduler, so each poll also asks every engine what it holds in
memory and how busy it is: Ollama ``GET /api/ps``, LM Studio ``GET /api/v0/models``,
llama.cpp ``GET /health``, ``GET /props`` and ``GET /v1/models``, then ``/metrics`` or ``/slots``
unless it sleeps (:mod:`nvpair.engines.llamametrics`; for a router, ``/slots?model=`` of each
loaded model: :mod:`nvpair.engines.llamarouter`). This module turns those answers into one
:class:`LoadState` value. Anything it cannot read — a failed request, a status it does not
expect, a body that is not JSON, the wrong shape, deep nesting, a number that overflows —
gives :data:`UNKNOWN`, never an exception: a node's load is a hint for the order, and a
hostile or broken answer must cost nothing but the hint. Asking is the caller's job
(:mod:`nvpair.fleet.polls`); this module only sees statuses and bytes.

A poll comes every few seconds, so a load this proxy itself has just set off is not in the last
reading yet: :meth:`LoadState.assuming` counts the models it has dispatched since in memory, and
:func:`unseen` says which dispatches a poll's answer cannot speak for
(docs/fleet-scheduling.md#dispatched-is-loading).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from attrs import evolve, frozen

from nvpair.common import strictjson
from nvpair.engines import llamametrics, llamarouter

__all__ = [
    "LISTING_LAG",
    "LLAMACPP_PROBE",
    "LMSTUDIO_PROBE",
    "OLLAMA_PROBE",
    "UNKNOWN",
    "Answer",
    "LoadProbe",
    "LoadState",
    "unseen",
]


@frozen
class LoadState:
    """One engine's load on one node, as its last poll reported it.

    :ivar loading: the engine says it is loading a model and serves nothing until it is done
        (llama.cpp ``/health`` answering 503).
    :ivar warm: the keys of the models it holds in memory; None when it did not say.
    :ivar warm_all: every model the node lists is in memory (llama.cpp serves the one model it
        loaded at start).
    :ivar slots: how many requests it runs at once, where it says (llama.cpp).
    :ivar busy: how many of those slots are generating for someone other than this proxy (the
        poller subtracts the proxy's own requests in flight to that engine).
    :ivar loading_models: a llama.cpp router's models it is loading now: in memory soon, in
        :attr:`warm` already, no slot free yet.
    :ivar model_slots: a llama.cpp router's ``(model key, slots, busy)`` for each loaded
        model whose own slots it reported; :attr:`busy` is their sum.
    :ivar sleeping: a llama.cpp server asleep (``--sleep-idle-seconds``): its model is out of
        memory until a request wakes it (docs/fleet-scheduling.md#sleeping-servers).
    :ivar sleeping_models: a llama.cpp router's models whose instances sleep (cold as well).
    """

    loading: bool = False
    warm: frozenset[str] | None = None
    warm_all: bool = False
    slots: int | None = None
    busy: int = 0
    loading_models: frozenset[str] = frozenset()
    model_slots: tuple[tuple[str, int, int], ...] = ()
    sleeping: bool = False
    sleeping_models: frozenset[str] = frozenset()

    def in_memory(self, model_key: str | None, listed: frozenset[str]) -> bool | None:
        """Whether the model is in memory: True, False, or None when the engine did not say.

        :param model_key: the requested model's key; None for a model-less request, which the
            engine answers with whatever it has loaded.
        :param listed: the model keys the node's inventory lists.
        """
        if self.loading:
            return False
        if self.warm_all:
            return bool(listed) if model_key is None else model_key in listed
        if self.warm is None:
            return None
        return bool(self.warm) if model_key is None else model_key in self.warm

    def free_slot(self, reserved: int, model_key: str | None = None) -> bool:
        """Whether a slot is free with ``reserved`` of this proxy's own requests on the node.

        Ollama and LM Studio do not say how many requests they run at once; both run one per
        model by default, so one slot is assumed for them. A llama.cpp router's model has the
        slots of its own server instance, and one it is still loading has none free.
        """
        if model_key is not None:
            if model_key in self.loading_models:
                return False
            for key, slots, busy in self.model_slots:
                if key == model_key:
                    return busy + reserved < slots
        capacity = self.slots if self.slots else 1
        return self.busy + reserved < capacity

    def assuming(
        self, dispatched: Collection[str] | Mapping[str, float], room: int | None = None
    ) -> LoadState:
        """This reading with the ``dispatched`` model keys counted in memory as well.

        They are the models this proxy has sent a request for since the reading was asked: an
        engine that loads on demand is loading them (or has them), and lists them at its next
        poll. An engine loading as a whole stays loading (it serves nothing yet), and one that
        serves every model it lists (llama.cpp) has nothing to add. Without a reading
        (:data:`UNKNOWN`) the dispatched models are the only ones known to be in memory.

        :param room: how many models the engine holds at once, as far as is known. A load that
            takes it past that evicts a model this reading does not say which: then only the
            dispatched models count (the ``room`` sent last, where ``dispatched`` maps each to
            when it was sent), and the reading's others not until a poll says
            (docs/fleet-scheduling.md#dispatched-is-loading).
        """
        if not dispatched or self.loading or self.warm_all:
            return self
        if self.warm is None:
            return evolve(self, warm=frozenset(dispatched))
        if self.warm.issuperset(dispatched):
            return self
        warm = self.warm.union(dispatched)
        if room is not None and len(warm) > room:
            if isinstance(dispatched, Mapping):
                newest = sorted(dispatched, key=dispatched.__getitem__, reverse=True)
                warm = frozenset(newest[: max(1, room)])
            else:
                warm = frozenset(dispatched)
        return evolve(self, warm=warm)


#: Nothing known: the engine did not answer, or not in a way this module reads.
UNKNOWN = LoadState()

#: Seconds an engine may take to list a request's model after the request reached it. Ollama
#: puts a model in ``/api/ps`` only once its scheduler has read the model file's metadata and
#: started the runner that loads it, so a poll asked a moment after a dispatch (or that
#: overtook the dispatch on its way) can still answer without the model.
LISTING_LAG = 1.0


def unseen(
    dispatched: Mapping[str, float], asked_at: float, lag: float = LISTING_LAG
) -> dict[str, float]:
    """The dispatches a poll asked at ``asked_at`` does not speak for: those made after it was
    asked, or less than ``lag`` before, when the engine may not list them yet.

    :param dispatched: model key -> clock time of this proxy's latest dispatch of it to the
        engine.
    :return: the entries of ``dispatched`` still to be counted in memory on top of the poll's
        reading. A poll answered late (asked before a dispatch, answered after it) keeps that
        dispatch: its answer is older than the dispatch.
    """
    since = asked_at - lag
    return {key: at for key, at in dispatched.items() if at > since}


@frozen
class Answer:
    """One load route's answer: its status and whole body."""

    status: int
    body: bytes


Reader = Callable[[Sequence[Answer | None], Callable[[str], str]], LoadState]

#: The routes to ask once the first answers are in, each for one model or (None) for the
#: whole engine: ``(model, path)``.
FollowUp = Callable[[Sequence[Answer | None]], tuple[tuple[str | None, str], ...]]

#: The first reading completed with the follow-up's answers, each beside its model.
FollowUpReader = Callable[
    [LoadState, Sequence[tuple[str | None, Answer | None]], Callable[[str], str]], LoadState
]


def _no_follow_up(answers: Sequence[Answer | None]) -> tuple[tuple[str | None, str], ...]:
    return ()


def _as_read(
    state: LoadState,
    answers: Sequence[tuple[str | None, Answer | None]],
    key: Callable[[str], str],
) -> LoadState:
    return state


@frozen
class LoadProbe:
    """How to ask one engine for its load.

    :ivar paths: the GET routes to ask, all at once.
    :ivar read: turns their answers (in ``paths`` order; None for one that failed in transit
        or past its bounds) and the engine's model-key function into a :class:`LoadState`.
    :ivar follow_up: the routes those answers say to ask next, one at a time (a llama.cpp
        router: each loaded model's slots); none for most engines.
    :ivar read_follow_up: adds their answers to the reading.
    """

    paths: tuple[str, ...]
    read: Reader
    follow_up: FollowUp = _no_follow_up
    read_follow_up: FollowUpReader = _as_read


def _json(answer: Answer | None) -> object:
    """The body of a 2xx answer as strict JSON; None when there is none to read."""
    if answer is None or not 200 <= answer.status < 300:
        return None
    try:
        return strictjson.loads(answer.body)
    except ValueError:
        # JSONDecodeError, bad UTF-8, integers over Python's digit limit, NaN or 1e400, and
        # nesting deep enough to exhaust the parser's stack.
        return None


def _names(
    entries: object, key_field: str, wanted: Callable[[dict[str, object]], bool]
) -> list[str] | None:
    """The ``key_field`` of each entry ``wanted`` accepts, or None when the list is malformed."""
    if not isinstance(entries, list):
        return None
    names: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get(key_field), str):
            return None
        if wanted(entry):
            names.append(entry[key_field])
    return names


def read_ollama(answers: Sequence[Answer | None], key: Callable[[str], str]) -> LoadState:
    """``GET /api/ps``: ``{"models": [{"name", "expires_at", "size_vram", ...}]}``.

    Every model listed is in memory, a loading one included (Ollama lists a runner as soon as
    it starts loading it). ``expires_at`` is not used to age a model out between polls: while
    a request runs on a model Ollama keeps the old expiry and restarts the timer only when the
    request ends, so a past ``expires_at`` does not mean the model is gone; the next poll does.
    """
    document = _json(answers[0])
    if not isinstance(document, dict) or "models" not in document:
        return UNKNOWN
    # Ollama writes [] for none; null is read the same way rather than as "unknown".
    entries = document.get("models")
    names = _names([] if entries is None else entries, "name", lambda entry: True)
    if names is None:
        return UNKNOWN
    return LoadState(warm=frozenset(key(name) for name in names))


def read_lmstudio(answers: Sequence[Answer | None], key: Callable[[str], str]) -> LoadState:
    """``GET /api/v0/models``: ``{"data": [{"id", "state": "loaded" | "not-loaded", ...}]}``.

    A version without REST v0 answers 200 with an "Unexpected endpoint" error object, which has
    no ``data``: unknown, as is any ``state`` that is not a string.
    """
    document = _json(answers[0])
    if not isinstance(document, dict):
        return UNKNOWN
    entries = document.get("data")
    if isinstance(entries, list) and not all(
        isinstance(entry, dict) and isinstance(entry.get("state"), str) for entry in entries
    ):
        return UNKNOWN
    names = _names(entries, "id", lambda entry: entry.get("state") == "loaded")
    if names is None:
        return UNKNOWN
    return LoadState(warm=frozenset(key(name) for name in names))


def read_llamacpp(answers: Sequence[Answer | None], key: Callable[[str], str]) -> LoadState:
    """``GET /health``, ``GET /props`` and ``GET /v1/models``: none of them wakes a sleeping
    server or counts as work that keeps it awake (docs/fleet-scheduling.md#sleeping-servers).

    ``/health`` answers 503 while the server loads its model (every other route does too), and
    200 once it serves. ``/props`` says ``is_sleeping`` (builds before late 2025 do not say:
    awake), and ``role: "router"`` for a router. A server that sleeps has its model out of
    memory: cold, not asked its ``/slots``. An awake one serves the model it loaded at start;
    its ``/metrics`` or ``/slots`` (:func:`read_llamacpp_slots`) says how busy it is.

    A router (:mod:`nvpair.engines.llamarouter`) says each model's state in ``/v1/models``:
    loaded is in memory, loading is in memory with no slot free yet, anything else (sleeping
    included) is not. With its model list unreadable nothing is known.
    """
    health, props_answer, listing = answers
    if health is not None and health.status == 503:
        return LoadState(loading=True)
    statuses = llamarouter.router_statuses(_json(listing))
    if statuses is not None:
        loaded = {key(m) for m, status in statuses if status == llamarouter.LOADED}
        loading = frozenset(key(m) for m, status in statuses if status == llamarouter.LOADING)
        asleep = frozenset(key(m) for m, status in statuses if status == llamarouter.SLEEPING)
        return LoadState(warm=loading.union(loaded), loading_models=loading, sleeping_models=asleep)
    props = _json(props_answer)
    if isinstance(props, dict) and props.get("role") == "router":
        # A router whose model list said nothing this time.
        return UNKNOWN
    if isinstance(props, dict) and props.get("is_sleeping") is True:
        return LoadState(warm=frozenset(), sleeping=True)
    ready = health is not None and 200 <= health.status < 300
    # Single-model mode: what it lists is what it loaded at start; /props may say its slots.
    return LoadState(warm_all=True, slots=llamametrics.metrics_slots(props)) if ready else UNKNOWN


def llamacpp_follow_up(answers: Sequence[Answer | None]) -> tuple[tuple[str | None, str], ...]:
    """A router's loaded models and the route of each one's slots; a single server's own
    ``/metrics`` when ``/props`` says it is on, else its ``/slots``, unless it sleeps (one
    ``/slots`` request wakes it and reloads its model, and each keeps it awake: ``/metrics``
    does neither); nothing for a server loading as a whole."""
    health, props_answer, listing = answers
    if health is not None and health.status == 503:
        return ()
    statuses = llamarouter.router_statuses(_json(listing))
    if statuses is not None:
        return llamarouter.slot_reads(statuses)
    props = _json(props_answer)
    if isinstance(props, dict) and (props.get("role") == "router" or props.get("is_sleeping")):
        return ()
    return ((None, "/slots" if llamametrics.metrics_slots(props) is None else "/metrics"),)


def read_llamacpp_slots(
    state: LoadState,
    answers: Sequence[tuple[str | None, Answer | None]],
    key: Callable[[str], str],
) -> LoadState:
    """The first reading with the slots asked after it: a single server's ``/metrics``, when
    the first reading has its slot count (from ``/props``, only then), or its ``/slots``, a
    list with one object per slot, ``is_processing`` true while it generates (builds before
    late 2024 said ``state``: 0 idle, 1 processing) — a server started with ``--no-slots``
    answers an error there, and its slot count stays unknown; or a router's per-model ones."""
    model, answer = answers[0] if answers else ("", None)  # none at all: read as a router's
    if model is not None:  # a single server's first reading names no model
        return read_router_slots(state, answers, key)
    if state.slots is not None:
        body = answer.body if answer is not None and answer.status == 200 else b""
        busy = llamametrics.requests_processing(body, state.slots)
        return evolve(state, slots=None) if busy is None else evolve(state, busy=busy)
    if answer is not None and answer.status == 400:
        # A router (a server with one model never answers 400 here) that said so nowhere
        # else this time.
        return UNKNOWN
    slots = _slots(_json(answer))
    if slots is None:
        return state
    total, busy = slots
    return LoadState(warm_all=True, slots=total, busy=busy)


def _slots(document: object) -> tuple[int, int] | None:
    """(slots, busy) from a ``/slots`` list, or None when it is not one."""
    if not isinstance(document, list) or not document:
        return None
    busy = 0
    for slot in document:
        if not isinstance(slot, dict):
            return None
        processing = slot.get("is_processing")
        if processing is None:
            state = slot.get("state")
            # bool is an int: a boolean "state" is no legacy slot either.
            if not isinstance(state, int) or isinstance(state, bool) or state not in (0, 1):
                return None
            processing = state == 1
        if not isinstance(processing, bool):
            return None
        busy += processing
    return len(document), busy


def read_router_slots(
    state: LoadState,
    answers: Sequence[tuple[str | None, Answer | None]],
    key: Callable[[str], str],
) -> LoadState:
    """Each loaded model's own slots, where its ``/slots?model=`` answered a slot list (one
    unloaded since answers 400: its slots stay unknown until the next poll says it is gone)."""
    read: list[tuple[str, int, int]] = []
    for model, answer in answers:
        slots = _slots(_json(answer))
        if model is not None and slots is not None:
            read.append((key(model), *slots))
    if not read:
        return state
    return evolve(state, busy=sum(busy for _, _, busy in read), model_slots=tuple(read))


OLLAMA_PROBE = LoadProbe(("/api/ps",), read_ollama)
LMSTUDIO_PROBE = LoadProbe(("/api/v0/models",), read_lmstudio)
LLAMACPP_PROBE = LoadProbe(
    ("/health", "/props", "/v1/models"), read_llamacpp, llamacpp_follow_up, read_llamacpp_slots
)
