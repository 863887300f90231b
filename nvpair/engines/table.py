"""Everything engine-specific, one entry per engine (docs/README.md#adding-an-engine).

Identity, ports, the persisted-port file, the route table, model-name normalization, the
model-list envelopes and the error envelope the proxy speaks on each route. Adding an engine
is adding one :class:`Engine` to :data:`ENGINES`; nothing else in the process names an engine.
A facade is a :class:`Dialect`: each engine's is the engine itself, and fleet mode's ``openai``
facade (:data:`OPENAI`), which reaches every engine's nodes, is the one that is no engine
(:data:`FACADES`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping

from attrs import Factory, field, frozen

from nvpair.common.reasons import Reason
from nvpair.engines.loadstate import LLAMACPP_PROBE, LMSTUDIO_PROBE, OLLAMA_PROBE, LoadProbe
from nvpair.engines.managing import (
    llamacpp_manages,
    lmstudio_manages,
    manages_nothing,
    named_after,
    no_path_model,
    ollama_manages,
)
from nvpair.engines.names import ollama_display, ollama_key


class RouteClass(enum.Enum):
    """How a facade treats a route (docs/request-path.md#route-classes)."""

    INFERENCE = "inference"
    INVENTORY = "inventory"
    OTHER = "other"
    #: A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) on any path:
    #: decided by the request, not the route table.
    PREFLIGHT = "preflight"
    #: A pinned cluster peer's request: forwarded to the local engine, never re-routed.
    PEER = "peer"


class ErrorStyle(enum.Enum):
    """The shape of an error body the proxy generates on a route."""

    #: ``{"error": "<message>"}`` — Ollama's native routes.
    PLAIN = "plain"
    #: ``{"error": {"message", "type", "code"}}`` — every OpenAI-shaped route.
    OPENAI = "openai"


@frozen
class InventoryRoute:
    """One model-list route: where its entries live and what identifies one.

    :ivar list_field: the top-level field holding the entries (``models`` or ``data``).
    :ivar key_field: the entry field that identifies a model (``name``, ``id``, ``key``).
    :ivar empty: the engine's own empty envelope, byte for byte what the engine sends.
    :ivar upstream_path: the path asked of each node, when it differs from the client's.
    :ivar newest_first: the timestamp field a merged list stays sorted by, newest first.
    :ivar also_named: other entry fields that repeat the model's name (Ollama's ``model``):
        an entry listed under another name has them renamed too (docs/model-names.md#inventories).
    :ivar companion: a second list the engine's answer also carries (llama.cpp's Ollama-style
        ``models``), merged as this one is where a node sent it, never required
        (docs/inventories.md#llamacpps-two-lists).
    """

    list_field: str
    key_field: str
    empty: Mapping[str, object]
    upstream_path: str | None = None
    newest_first: str | None = None
    also_named: tuple[str, ...] = ()
    companion: InventoryRoute | None = None


def _exact(name: str) -> str:
    return name


def _never(path: str) -> bool:
    return False


def _own_engine(facade: Dialect) -> tuple[str, ...]:
    return (facade.id,)


@frozen(kw_only=True)
class Dialect:
    """What one facade is and speaks: its identity, its port, its route table, its model names
    and the error envelope the proxy answers in.

    Every engine is one (:class:`Engine`, whose facade speaks its own dialect and reaches its
    own nodes); the ``openai`` facade (:data:`OPENAI`) is the one that is not an engine: it
    speaks OpenAI's dialect and reaches the nodes of every engine (docs/openai-facade.md).

    :ivar id: the facade's id: the engine's id in broker addresses (``ollama``), or ``openai``.
    :ivar standalone_port: the facade's port when ``facade/enable`` (or the fleet file) omits
        one (or says 0).
    :ivar port_file: the persisted-port file name inside the state directory.
    :ivar inference_paths: POST routes that carry a model and get the full failover loop.
    :ivar inventory: GET (and HEAD where the engine answers it) model-list routes.
    :ivar model_required: whether an inference body must name its model.
    :ivar model_key: the comparison key of a model name (exact for engines without aliases).
    :ivar model_display: the display form used in events and merged lists.
    :ivar plain_errors: which paths answer errors as ``{"error": "..."}`` rather than
        OpenAI's envelope (Ollama's native routes, not its ``/v1/*`` shims).
    :ivar named_model_paths: "other" routes whose body names a model in ``model``, or
        in the deprecated ``name`` when ``model`` is empty.
    :ivar host_guard: the engine refuses a ``Host`` outside its DNS-rebinding allow-list
        (Ollama), so its facade must too (reason ``forbidden-host``).
    :ivar serves: the engines whose nodes the facade's requests go to: an engine's facade, its
        own; the ``openai`` facade, every engine's.
    :ivar forwards_other: whether a route outside the table is forwarded to a node ("other"),
        or answered 404 ``not-found`` (the ``openai`` facade, which has no engine of its own
        to forward it to).
    :ivar member_names_fold: the engine's JSON decoder matches a body's member names without
        regard to case (Go's: ``Model`` is ``model`` to Ollama), so admission reads them so too
        (docs/lan.md#what-a-key-can-and-cannot-do).
    :ivar manages: whether a route changes what the engine holds (pulls, copies, deletes,
        loads models) or its account: a LAN caller needs a key with ``manage = true`` for it.
    :ivar path_model: the model a route names in its path (Ollama's ``/v1/models/<name>``
        shows it), judged against a key as a body's model is.
    :ivar starting_paths: the engine's health routes, answered as the engine answers them while
        it loads (:attr:`starting_body`, reason ``starting``) before any node serves, while one
        has yet to answer its first poll (docs/fleet-scheduling.md#before-the-first-poll).
    :ivar starting_body: the engine's own body while it loads; None: the proxy's envelope.
    """

    id: str
    display_name: str
    standalone_port: int
    port_file: str
    inference_paths: frozenset[str]
    inventory: Mapping[str, InventoryRoute]
    inventory_methods: frozenset[bytes]
    model_required: bool
    model_key: Callable[[str], str]
    model_display: Callable[[str], str]
    plain_errors: Callable[[str], bool] = _never
    named_model_paths: frozenset[str] = frozenset()
    host_guard: bool = False
    serves: tuple[str, ...] = field(default=Factory(_own_engine, takes_self=True))
    forwards_other: bool = True
    member_names_fold: bool = False
    manages: Callable[[bytes, str], bool] = manages_nothing
    path_model: Callable[[str], str | None] = no_path_model
    starting_paths: frozenset[str] = frozenset()
    starting_body: bytes | None = None

    @property
    def spans_engines(self) -> bool:
        """Whether the facade reaches nodes of engines other than one of its own."""
        return self.serves != (self.id,)

    def classify(self, method: bytes, path: str) -> RouteClass:
        """Classify a route by exact path (no trailing-slash folding, no query string)."""
        if method == b"POST" and path in self.inference_paths:
            return RouteClass.INFERENCE
        if method in self.inventory_methods and path in self.inventory:
            return RouteClass.INVENTORY
        return RouteClass.OTHER

    def error_style(self, path: str) -> ErrorStyle:
        """The error envelope the engine itself would use on ``path``."""
        if self.plain_errors(path):
            return ErrorStyle.PLAIN
        return ErrorStyle.OPENAI

    def error_body(self, path: str, message: str, reason: Reason) -> bytes:
        """A proxy-generated error body in the route's dialect
        (docs/request-path.md#proxy-generated-answers)."""
        if reason is Reason.STARTING and self.starting_body is not None:
            return self.starting_body
        body: dict[str, object]
        if self.error_style(path) is ErrorStyle.PLAIN:
            body = {"error": message}
        else:
            body = {"error": {"message": message, "type": "nvpair_proxy", "code": reason.value}}
        return json.dumps(body, separators=(",", ":")).encode()


@frozen(kw_only=True)
class Engine(Dialect):
    """The identity and dialect of one engine, and what a node running it is asked.

    :ivar own_port: the engine's own client-facing port, which its clients already use.
    :ivar relocated_port: where PAIR moves the engine so the facade can take ``own_port``.
    :ivar poll_path: the model list a standalone fleet polls for each node's inventory.
    :ivar load_probe: what a standalone fleet asks each node, with the inventory, about the
        engine's load: models in memory, slots, loading (docs/fleet-scheduling.md#load-state).
    :ivar liveness_path: the engine's cheapest route, which a standalone fleet asks every 2 s
        to find a hung engine (docs/fleet-scheduling.md#hung-nodes).
    :ivar file_path_ids: its model ids may be file paths (``-m /models/x.gguf``), also known by
        their file names in fleet mode (docs/model-names.md#file-names).
    """

    own_port: int
    relocated_port: int
    poll_path: str
    load_probe: LoadProbe
    liveness_path: str
    file_path_ids: bool = False

    def inventory_models(self, body: object) -> list[str] | None:
        """Model names out of a :attr:`poll_path` answer, or None when it is not the envelope."""
        route = self.inventory[self.poll_path]
        if not isinstance(body, dict):
            return None
        entries = body.get(route.list_field)
        if entries is None:
            # Ollama's /v1/models says "data": null for an empty list.
            return []
        if not isinstance(entries, list):
            return None
        names: list[str] = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get(route.key_field), str):
                return None
            names.append(entry[route.key_field])
        return names


_OPENAI_LIST_EMPTY: Mapping[str, object] = {"object": "list", "data": []}

#: llama-server's ``models`` beside its ``data``: one entry per model, named in ``name`` and
#: ``model`` as Ollama's ``/api/tags`` names them (docs/inventories.md#llamacpps-two-lists).
_LLAMA_MODELS = InventoryRoute("models", "name", {"models": []}, also_named=("model",))

OLLAMA = Engine(
    id="ollama",
    display_name="Ollama",
    own_port=11434,
    relocated_port=11435,
    standalone_port=11435,
    port_file="proxy-port.json",
    inference_paths=frozenset(
        {
            "/api/generate",
            "/api/chat",
            "/api/embed",
            "/api/embeddings",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
        }
    ),
    inventory={
        "/api/tags": InventoryRoute(
            "models", "name", {"models": []}, newest_first="modified_at", also_named=("model",)
        ),
        "/api/ps": InventoryRoute("models", "name", {"models": []}, also_named=("model",)),
        "/v1/models": InventoryRoute("data", "id", {"object": "list", "data": None}),
    },
    inventory_methods=frozenset({b"GET", b"HEAD"}),
    model_required=True,
    model_key=ollama_key,
    model_display=ollama_display,
    poll_path="/api/tags",
    load_probe=OLLAMA_PROBE,
    liveness_path="/",
    plain_errors=lambda path: not path.startswith("/v1/"),
    named_model_paths=frozenset(
        {"/api/show", "/api/pull", "/api/push", "/api/create", "/api/delete"}
    ),
    host_guard=True,
    member_names_fold=True,
    manages=ollama_manages,
    path_model=named_after("/v1/models/"),
)

LMSTUDIO = Engine(
    id="lmstudio",
    display_name="LM Studio",
    own_port=1234,
    relocated_port=1235,
    standalone_port=1234,
    port_file="lmstudio-proxy-port.json",
    inference_paths=frozenset(
        {
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses",
            "/v1/messages",
            "/api/v0/chat/completions",
            "/api/v0/completions",
            "/api/v0/embeddings",
            "/api/v1/chat",
        }
    ),
    inventory={
        "/v1/models": InventoryRoute("data", "id", _OPENAI_LIST_EMPTY),
        "/api/v0/models": InventoryRoute("data", "id", _OPENAI_LIST_EMPTY),
        "/api/v1/models": InventoryRoute("models", "key", {"models": []}),
    },
    inventory_methods=frozenset({b"GET"}),
    model_required=False,
    model_key=_exact,
    model_display=_exact,
    poll_path="/v1/models",
    load_probe=LMSTUDIO_PROBE,
    file_path_ids=True,
    liveness_path="/v1/models",
    manages=lmstudio_manages,
    path_model=named_after("/api/v0/models/"),
)

LLAMACPP = Engine(
    id="llamacpp",
    display_name="llama.cpp",
    own_port=8080,
    relocated_port=8081,
    standalone_port=8080,
    port_file="llamacpp-proxy-port.json",
    inference_paths=frozenset(
        {
            "/completion",
            "/completions",
            "/v1/completions",
            "/chat/completions",
            "/v1/chat/completions",
            "/responses",
            "/v1/responses",
            "/v1/messages",
            "/infill",
            "/embedding",
            "/embeddings",
            "/v1/embeddings",
            "/rerank",
            "/reranking",
            "/v1/rerank",
            "/v1/reranking",
        }
    ),
    inventory={
        # Both aliases ask each node's /models (docs/inventories.md#routes): one handler upstream,
        # which answers llama-server's Ollama-style list beside OpenAI's.
        path: InventoryRoute(
            "data", "id", _OPENAI_LIST_EMPTY, upstream_path="/models", companion=_LLAMA_MODELS
        )
        for path in ("/models", "/v1/models")
    },
    inventory_methods=frozenset({b"GET"}),
    model_required=False,
    model_key=_exact,
    model_display=_exact,
    poll_path="/v1/models",
    load_probe=LLAMACPP_PROBE,
    file_path_ids=True,
    liveness_path="/health",
    manages=llamacpp_manages,
    # Its public health routes; what llama-server answers on every route until its model is
    # loaded (tools/server/server-http.cpp, middleware_server_state), byte for byte.
    starting_paths=frozenset({"/health", "/v1/health"}),
    starting_body=b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}',
)

#: The registry: every engine the process knows, by id. Order is presentation order.
ENGINES: Mapping[str, Engine] = {e.id: e for e in (OLLAMA, LMSTUDIO, LLAMACPP)}

#: The OpenAI-dialect facade of fleet mode: one endpoint for every engine's models, through
#: each engine's own OpenAI-compatible routes, nothing translated (docs/openai-facade.md).
OPENAI = Dialect(
    id="openai",
    display_name="OpenAI",
    standalone_port=4000,
    port_file="openai-proxy-port.json",
    inference_paths=frozenset(
        {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
    ),
    inventory={"/v1/models": InventoryRoute("data", "id", _OPENAI_LIST_EMPTY)},
    inventory_methods=frozenset({b"GET"}),
    # Every engine's node is asked for the model by name: one a body leaves out has no owner.
    model_required=True,
    model_key=_exact,
    model_display=_exact,
    # Every engine with OpenAI's model list: it is the one route of theirs asked for it.
    serves=tuple(engine.id for engine in ENGINES.values() if "/v1/models" in engine.inventory),
    forwards_other=False,
    # An Ollama node reads the body too.
    member_names_fold=True,
)

#: Every facade a fleet file may name, by id: each engine's, then the ``openai`` facade.
FACADES: Mapping[str, Dialect] = {**ENGINES, OPENAI.id: OPENAI}


def served_engines(facades: Iterable[str]) -> tuple[str, ...]:
    """The engines whose nodes the named facades reach, in :data:`ENGINES` order: each engine
    facade its own engine, the ``openai`` facade every engine."""
    served = {engine for facade in facades for engine in FACADES[facade].serves}
    return tuple(engine for engine in ENGINES if engine in served)
