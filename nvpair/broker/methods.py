"""The broker's methods: validate each message's params and apply it to the process.

Every refusal names the offending field (``-32602``, ``error.data.field``). Handlers are small
and synchronous: they update control state or a facade and return the method's result
(docs/broker-protocol.md#broker-to-proxy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from urllib.parse import urlsplit

from twisted.logger import Logger

from nvpair.broker.link import (
    BIND_FAILED,
    INTERNAL_ERROR,
    Address,
    Handler,
    MethodTable,
    Params,
    RpcError,
    invalid_params,
)
from nvpair.common.logs import LogObserver, parse_level
from nvpair.control.state import ControlState, Node, PriorityEntry
from nvpair.engines.table import ENGINES, Engine
from nvpair.facades.manager import FacadeError, FacadeManager
from nvpair.facades.ports import parse_aliases, valid_port

#: The largest generation accepted: a scheduler's counter fits an int64. A bigger one is no real
#: generation, and once applied it would make every later snapshot look stale for good.
MAX_GENERATION = 2**63 - 1


def _port(params: Params, name: str = "port") -> int:
    value = params.get(name, 0)
    if value is None:
        value = 0
    if not isinstance(value, int) or not valid_port(value, zero=True):
        raise invalid_params(name, f"{name} must be an integer in 0-65535")
    return value


def _string(params: Params, name: str, *, nullable: bool = False) -> str | None:
    value = params.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or not value:
        raise invalid_params(name, f"{name} must be a non-empty string")
    return value


def _url(value: object, name: str, schemes: tuple[str, ...], message: str) -> str:
    """An absolute URL of ``schemes`` that the upstream client can dial by appending a path.

    Checked here rather than where it is used: a port that does not parse only raises when
    ``urlsplit(...).port`` is read, and that happens per peer connection and per request.
    """
    if not isinstance(value, str) or not (value.isascii() and value.isprintable()):
        raise invalid_params(name, message)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:  # an unbalanced IPv6 bracket, a port that is no number in 0-65535
        raise invalid_params(name, message) from None
    if (
        parts.scheme not in schemes
        or not parts.hostname
        or port == 0
        # The request's own path and query are appended to this URL, and a node address
        # has no business carrying credentials (they would also end up in logs).
        or any(c in value for c in " ?#")
        or "@" in parts.netloc
    ):
        raise invalid_params(name, message)
    return value


def _load(value: object, name: str) -> float:
    """A scheduler load figure: finite and >= 0, since routing adds and compares them."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
        if math.isfinite(number) and number >= 0:
            return number
    raise invalid_params(name, f"{name} must be a finite number >= 0")


def parse_nodes(engine: Engine, params: Params) -> list[Node]:
    """A ``discovery:nodes`` snapshot; each node needs an id and either ``local`` or a URL."""
    raw = params.get("nodes")
    if not isinstance(raw, list):
        raise invalid_params("nodes", "nodes must be a list")
    nodes: list[Node] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"nodes[{index}]"
        if not isinstance(item, dict):
            raise invalid_params(where, f"{where} must be an object")
        node_id = item.get("id")
        if not isinstance(node_id, str) or not node_id or node_id in seen:
            raise invalid_params(f"{where}.id", f"{where}.id must be a unique non-empty string")
        seen.add(node_id)
        local = item.get("local", False)
        if not isinstance(local, bool):
            raise invalid_params(f"{where}.local", f"{where}.local must be a boolean")
        url = item.get("url")
        if url is not None:
            url = _url(
                url, f"{where}.url", ("http", "https"), f"{where}.url must be an http(s) URL"
            )
        if not local and url is None:
            raise invalid_params(f"{where}.url", f"{where} is neither local nor has a url")
        models = item.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise invalid_params(f"{where}.models", f"{where}.models must be a list of strings")
        nodes.append(
            Node(
                id=node_id,
                local=local,
                url=url,
                models=tuple(models),
                model_keys=frozenset(engine.model_key(m) for m in models),
            )
        )
    return nodes


def parse_priority(params: Params) -> tuple[int, list[PriorityEntry]]:
    """A ``node/set-priority`` snapshot: its generation and the list, best first."""
    generation = params.get("generation")
    if (
        not isinstance(generation, int)
        or isinstance(generation, bool)
        or not 0 <= generation <= MAX_GENERATION
    ):
        raise invalid_params("generation", "generation must be an integer in 0..2^63-1")
    raw = params.get("nodes")
    if not isinstance(raw, list):
        raise invalid_params("nodes", "nodes must be a list")
    entries: list[PriorityEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        where = f"nodes[{index}]"
        node_id = item.get("id") if isinstance(item, dict) else None
        # A node listed twice would have two ranks and two loads.
        if not isinstance(node_id, str) or not node_id or node_id in seen:
            raise invalid_params(f"{where}.id", f"{where}.id must be a unique non-empty string")
        seen.add(node_id)
        pending = _load(item.get("pending", 0), f"{where}.pending")
        pressure = _load(item.get("gpuPressure", 0), f"{where}.gpuPressure")
        entries.append(PriorityEntry(node_id, pending, pressure))
    return generation, entries


def rpc_error(error: FacadeError) -> RpcError:
    """A facade's refusal as the broker protocol states it (docs/broker-protocol.md#errors)."""
    if error.tag == "conflict":
        return invalid_params("port", error.message)
    code = BIND_FAILED if error.tag == "bind" else INTERNAL_ERROR
    return RpcError(
        code, error.message, {"tag": error.tag, "engine": error.engine, "port": error.port}
    )


class BrokerMethods(MethodTable):
    """The broker → proxy methods (docs/broker-protocol.md#broker-to-proxy), bound to this process's
    state.

    :param on_link_lost: called once when the broker closes the link.
    """

    log = Logger()

    def __init__(
        self,
        control: ControlState,
        facades: FacadeManager,
        observer: LogObserver,
        on_link_lost: Callable[[], None],
        on_enabled: Callable[[str], None],
    ) -> None:
        self._control = control
        self._facades = facades
        self._observer = observer
        self._on_link_lost = on_link_lost
        self._on_enabled = on_enabled
        self._process: dict[str, Handler] = {
            "facade/enable": self._enable,
            "node/set-priority": self._set_priority,
            "log/set-level": self._set_level,
        }
        self._facade: dict[str, Handler] = {
            "discovery:nodes": self._discovery_nodes,
            "node/select": self._select,
            "node/set-local-backend": self._set_local_backend,
            "set-port": self._set_port,
        }

    def handler(self, address: Address) -> Handler | None:
        table = self._process if address.engine is None else self._facade
        return table.get(address.method)

    def facade_enabled(self, engine: str) -> bool:
        return self._facades.enabled(engine)

    def link_lost(self) -> None:
        self._on_link_lost()

    # -- process-scoped --------------------------------------------------------------------

    def _enable(self, address: Address, params: Params) -> object:
        engine = params.get("engine")
        if not isinstance(engine, str) or engine not in ENGINES:
            raise invalid_params("engine", f"engine must be one of {', '.join(ENGINES)}")
        port = _port(params)
        try:
            aliases = parse_aliases(params.get("aliases", []))
        except ValueError as bad:
            raise invalid_params("aliases", str(bad)) from None
        ignore = params.get("ignorePersistedPort", False)
        if not isinstance(ignore, bool):
            raise invalid_params("ignorePersistedPort", "ignorePersistedPort must be a boolean")
        already = self._facades.enabled(engine)
        try:
            result = self._facades.enable(engine, port or None, aliases, ignore)
        except FacadeError as error:
            raise rpc_error(error) from None
        if not already:
            self._on_enabled(engine)
        return result

    def _set_priority(self, address: Address, params: Params) -> object:
        generation, entries = parse_priority(params)
        self._control.set_priority(generation, entries)
        return {}

    def _set_level(self, address: Address, params: Params) -> object:
        level = params.get("level")
        try:
            self._observer.set_level(parse_level(level if isinstance(level, str) else ""))
        except ValueError as bad:
            raise invalid_params("level", str(bad)) from None
        return {}

    # -- facade-scoped ---------------------------------------------------------------------

    def _discovery_nodes(self, address: Address, params: Params) -> object:
        assert address.engine is not None
        nodes = parse_nodes(ENGINES[address.engine], params)
        self._control.set_discovery(address.engine, nodes)
        return {}

    def _select(self, address: Address, params: Params) -> object:
        assert address.engine is not None
        if "nodeId" not in params:
            raise invalid_params("nodeId", "nodeId is required (null clears the pin)")
        self._control.set_pin(address.engine, _string(params, "nodeId", nullable=True))
        return {}

    def _set_local_backend(self, address: Address, params: Params) -> object:
        assert address.engine is not None
        url = _string(params, "url", nullable=True)
        if url is not None:
            _url(url, "url", ("http",), "url must be an http:// URL of the local engine")
        self._control.set_local_backend(address.engine, url)
        return {}

    def _set_port(self, address: Address, params: Params) -> object:
        assert address.engine is not None
        if "port" not in params:
            raise invalid_params("port", "port is required")
        port = _port(params) or ENGINES[address.engine].standalone_port
        try:
            return self._facades.set_port(address.engine, port)
        except FacadeError as error:
            raise rpc_error(error) from None
