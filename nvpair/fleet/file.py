"""The standalone fleet file (``--fleet``): parsed and validated once, into a :class:`Fleet`.

The file names the facades to enable and each node's engine URLs
(docs/broker-protocol.md#standalone-fleet-mode). Every problem is reported with the file and
the offending key, never a silent default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from attrs import field, frozen

from nvpair.common.durations import parse_duration
from nvpair.control.affinity import DEFAULT_AFFINITY, AffinityOptions
from nvpair.control.fairqueue import DEFAULT_QUEUE, QueueOptions
from nvpair.engines.modelnames import NO_ALIASES, AliasError, Aliases
from nvpair.engines.table import ENGINES, FACADES, served_engines
from nvpair.facades.ports import ascii_digits, parse_aliases, valid_port
from nvpair.fleet.adminconfig import AdminError, AdminLan, parse_admin
from nvpair.fleet.credentials import Credential, read_credential
from nvpair.fleet.lanconfig import Access, AccessError, parse_access
from nvpair.fleet.queueconfig import parse_parallel, parse_queue


class FleetFileError(ValueError):
    """The fleet file cannot be used; the message names the file and the offending key."""


@frozen
class FacadeSpec:
    port: int
    aliases: tuple[str, ...]


@frozen
class FleetNode:
    """One ``[[nodes]]`` table: each engine's URL and, for those that need one, a credential
    (docs/fleet-scheduling.md#node-credentials)."""

    id: str
    engines: Mapping[str, str]
    credentials: Mapping[str, Credential] = field(factory=dict)
    #: ``[nodes.parallel]``: per engine, the requests it serves at once per model
    #: (docs/fleet-scheduling.md#capacity).
    parallel: Mapping[str, int] = field(factory=dict)


@frozen
class Fleet:
    """A parsed fleet file.

    :ivar access: who besides loopback may call (``[access]``, docs/lan.md); None: nobody.
    """

    inventory_interval: float
    facades: Mapping[str, FacadeSpec]
    nodes: tuple[FleetNode, ...]
    #: ``[models]``: the aliases people may ask for (docs/model-names.md#aliases).
    models: Aliases = NO_ALIASES
    #: ``[access]``: who besides this machine may call (docs/lan.md); None: loopback only.
    access: Access | None = None
    #: ``[scheduling]``: affinity (docs/fleet-scheduling.md#conversations-go-where-their-cache-is).
    affinity: AffinityOptions = DEFAULT_AFFINITY
    #: ``[queue]`` (docs/fleet-scheduling.md#the-queue).
    queue: QueueOptions = DEFAULT_QUEUE
    #: ``[admin]``: the admin listener's LAN address (docs/lan.md#the-admin-view-from-the-lan).
    admin: AdminLan | None = None

    def parallel(self) -> dict[tuple[str, str], int]:
        """(engine, node id) -> ``[nodes.parallel]`` where the file sets one."""
        return {
            (engine, node.id): count
            for node in self.nodes
            for engine, count in node.parallel.items()
        }

    def authorizations(self) -> dict[str, bytes]:
        """Engine URL -> the ``Authorization`` value every request to it carries."""
        return {
            node.engines[engine]: credential.authorization
            for node in self.nodes
            for engine, credential in node.credentials.items()
        }


def _fail(path: Path, where: str, why: str) -> FleetFileError:
    return FleetFileError(f"{path}: {where}: {why}")


def _check_keys(path: Path, where: str, table: Mapping[str, object], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _fail(path, where, f"unknown key(s) {', '.join(unknown)}")


def _port_text(netloc: str) -> str:
    """The port as written in ``netloc`` (``""`` when none)."""
    _, _, host = netloc.rpartition("@")
    if host.startswith("["):
        _, _, host = host.partition("]")
    _, _, port = host.partition(":")
    return port


def _url_problem(url: object) -> str | None:
    """What is wrong with a node's engine URL, or None: an ``http://`` URL with a host and,
    if it names one, a port from 1 to 65535."""
    if not isinstance(url, str):
        return "must be an http:// URL such as http://127.0.0.1:11434"
    try:
        parts = urlsplit(url)
    except ValueError as error:
        # An unclosed IPv6 bracket, say.
        return f"not a URL: {error}"
    if parts.scheme != "http":
        return "must be an http:// URL such as http://127.0.0.1:11434"
    if not parts.hostname:
        return "names no host"
    port = _port_text(parts.netloc)
    if port and not ascii_digits(port):
        return f"port {port!r} is not a number"
    if port and not valid_port(int(port)):
        return f"port {port} is out of range (1-65535)"
    if parts.username is not None or parts.password is not None:
        # It would be logged and shown with the URL; the key goes in the environment instead.
        return (
            "holds a user name or password: a node's secret is named in "
            '[nodes.credentials] as "env:NAME", never written in the file'
        )
    return None


def _unknown_engine(name: str) -> str:
    return f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}"


def _unknown_facade(name: str) -> str:
    return f"unknown facade {name!r}; expected one of {', '.join(FACADES)}"


def base_url_hint(url: str) -> str:
    """What to say of a node URL whose poll answered 404: when it has a path (``/v1``), that
    it should be the engine's base URL, the poll's path being the engine's own
    (docs/fleet-scheduling.md#every-configured-node-is-visible); else nothing."""
    parts = urlsplit(url)
    if parts.path in ("", "/") and not parts.query:
        return ""
    _, _, host = parts.netloc.rpartition("@")
    base = f"{parts.scheme}://{host}"
    extra = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
    return f" (the URL should be the engine's base URL, {base}, without {extra})"


def _one_facade_per_port(path: Path, facades: Mapping[str, FacadeSpec]) -> None:
    """Two facades cannot share a port: said here, naming both, rather than as the second
    one's bind failing at start."""
    holders: dict[int, str] = {}
    for engine, spec in facades.items():
        port = spec.port or FACADES[engine].standalone_port
        holder = holders.setdefault(port, engine)
        if holder != engine:
            default = "" if spec.port else " (its default)"
            raise _fail(
                path,
                f"facades.{engine}.port",
                f"port {port}{default} is also facades.{holder}'s: each facade needs its own",
            )


def _credentials(
    path: Path, where: str, table: object, engines: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, Credential]:
    """A node's ``[nodes.credentials]``: engine = "env:NAME" (or ``file:``, ``credential:``),
    each read now, ``file:`` beside the fleet file."""
    if not isinstance(table, dict):
        raise _fail(path, where, 'must be a table of engine = "env:NAME"')
    credentials: dict[str, Credential] = {}
    for engine, value in table.items():
        if engine not in ENGINES:
            raise _fail(path, f"{where}.{engine}", _unknown_engine(engine))
        if engine not in engines:
            raise _fail(path, f"{where}.{engine}", f"the node has no engines.{engine} URL")
        try:
            credentials[engine] = read_credential(value, environ, path.parent)
        except ValueError as bad:
            raise _fail(path, f"{where}.{engine}", str(bad)) from None
    return credentials


def _one_credential_per_url(path: Path, nodes: list[FleetNode]) -> None:
    """A credential belongs to the engine at a URL: two that differ for one URL cannot both
    be sent. The sources are compared, not the secrets: two that name one secret two ways
    (``env:`` and ``file:``) are refused too, as the next rotation could part them."""
    holders: dict[str, tuple[str, str]] = {}
    for index, node in enumerate(nodes):
        for engine, credential in node.credentials.items():
            url = node.engines[engine]
            where = f"nodes[{index}].credentials.{engine}"
            holder, source = holders.setdefault(url, (where, credential.source))
            if source != credential.source:
                raise _fail(path, where, f"{holder} names another source for the same URL")


def load_fleet(path: Path, environ: Mapping[str, str] | None = None) -> Fleet:
    """Parse and validate a fleet file; :class:`FleetFileError` names what is wrong.

    :param environ: where ``env:NAME`` credentials and ``$CREDENTIALS_DIRECTORY`` are read
        (the process's environment, read now, when None).
    """
    environ = os.environ if environ is None else environ
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise FleetFileError(f"{path}: cannot read: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise FleetFileError(f"{path}: not valid TOML: {error}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively.
        raise FleetFileError(f"{path}: not valid TOML: nested too deeply") from None
    _check_keys(
        path,
        "top level",
        document,
        {"inventory-interval", "facades", "nodes", "models", "access", "scheduling", "queue"}
        | {"admin"},
    )

    interval_text = document.get("inventory-interval", "5s")
    try:
        interval = parse_duration(interval_text) if isinstance(interval_text, str) else -1.0
    except ValueError:
        interval = -1.0
    if interval <= 0:
        raise _fail(path, "inventory-interval", 'must be a positive duration such as "5s"')

    facades_table = document.get("facades", {})
    if not isinstance(facades_table, dict) or not facades_table:
        raise _fail(path, "facades", "name at least one facade, e.g. [facades.ollama]")
    facades: dict[str, FacadeSpec] = {}
    for engine, spec in facades_table.items():
        where = f"facades.{engine}"
        if engine not in FACADES:
            raise _fail(path, where, _unknown_facade(engine))
        if not isinstance(spec, dict):
            raise _fail(path, where, "must be a table")
        _check_keys(path, where, spec, {"port", "aliases"})
        port = spec.get("port", 0)
        if not valid_port(port, zero=True):
            raise _fail(path, f"{where}.port", "must be an integer in 0-65535")
        try:
            aliases = parse_aliases(spec.get("aliases", []))
        except ValueError as bad:
            raise _fail(path, f"{where}.aliases", str(bad)) from None
        facades[engine] = FacadeSpec(port, aliases)
    _one_facade_per_port(path, facades)

    nodes_list = document.get("nodes", [])
    if not isinstance(nodes_list, list):
        raise _fail(path, "nodes", "must be an array of tables ([[nodes]])")
    nodes: list[FleetNode] = []
    seen: set[str] = set()
    for index, item in enumerate(nodes_list):
        where = f"nodes[{index}]"
        if not isinstance(item, dict):
            raise _fail(path, where, "must be a table")
        _check_keys(path, where, item, {"id", "engines", "credentials", "parallel"})
        node_id = item.get("id")
        if not isinstance(node_id, str) or not node_id or node_id in seen:
            raise _fail(path, f"{where}.id", "must be a unique non-empty string")
        seen.add(node_id)
        engines = item.get("engines", {})
        if not isinstance(engines, dict):
            raise _fail(path, f"{where}.engines", "must be a table of engine = URL")
        for engine, url in engines.items():
            if engine not in ENGINES:
                raise _fail(path, f"{where}.engines.{engine}", _unknown_engine(engine))
            problem = _url_problem(url)
            if problem is not None:
                raise _fail(path, f"{where}.engines.{engine}", problem)
        credentials = _credentials(
            path, f"{where}.credentials", item.get("credentials", {}), engines, environ
        )
        try:
            parallel = parse_parallel(f"{where}.parallel", item.get("parallel", {}), engines)
        except ValueError as bad:
            raise FleetFileError(f"{path}: {bad}") from None
        nodes.append(FleetNode(node_id, dict(engines), credentials, parallel))
    _one_credential_per_url(path, nodes)
    try:
        models = Aliases.parse(document.get("models", {}))
    except AliasError as bad:
        raise _fail(path, f"models{bad.where}", bad.why) from None
    try:
        access = parse_access(document.get("access"), path.parent, environ)
    except AccessError as error:
        raise FleetFileError(f"{path}: {error}") from None
    try:
        admin = parse_admin(document.get("admin"), access)
    except AdminError as error:
        raise FleetFileError(f"{path}: {error}") from None
    affinity = _scheduling(path, document.get("scheduling", {}))
    try:
        queue = parse_queue(document.get("queue", {}))
    except ValueError as bad:
        raise FleetFileError(f"{path}: {bad}") from None
    return Fleet(interval, facades, tuple(nodes), models, access, affinity, queue, admin)


#: The largest ``affinity-slack`` taken: past it, every owner is within it anyway.
MAX_SLACK = 1_000_000


def _scheduling(path: Path, table: object) -> AffinityOptions:
    """``[scheduling]``: whether and how far affinity reorders warm owners."""
    if not isinstance(table, dict):
        raise _fail(path, "scheduling", "must be a table")
    _check_keys(path, "scheduling", table, {"affinity", "affinity-slack"})
    enabled = table.get("affinity", True)
    if not isinstance(enabled, bool):
        raise _fail(path, "scheduling.affinity", "must be true or false")
    slack = table.get("affinity-slack", DEFAULT_AFFINITY.slack)
    if isinstance(slack, bool) or not isinstance(slack, int) or not 0 <= slack <= MAX_SLACK:
        raise _fail(path, "scheduling.affinity-slack", f"must be an integer in 0-{MAX_SLACK}")
    return AffinityOptions(enabled, slack)


def unserved(fleet: Fleet, running: Collection[str]) -> list[tuple[str, str, str]]:
    """Each node's engine that no ``running`` facade serves, with why: ``(node, engine, why)``.

    Neither polled nor served, so said rather than silently ignored
    (docs/fleet-scheduling.md#every-configured-node-is-visible).
    """
    return [
        (
            node.id,
            engine,
            "its facade was added to the fleet file and starts with a restart"
            if engine in served_engines(fleet.facades)
            else f"the fleet file has no [facades.{engine}] table",
        )
        for node in fleet.nodes
        for engine in node.engines
        if engine not in running
    ]


def restart_needed(running: Fleet, reread: Fleet) -> list[str]:
    """What a re-read fleet file changes that a running process cannot apply live.

    A facade's listener is bound once, as is the admin listener's LAN address; nodes and the
    poll interval are live (docs/fleet-scheduling.md#the-fleet-file-re-read). Each entry names
    the change. An ``[admin]`` removed is none: its LAN callers are refused at once.
    """
    changes: list[str] = []
    bind, rebind = (fleet.admin.bind if fleet.admin else None for fleet in (running, reread))
    if rebind is not None and bind != rebind:
        changes.append(f"admin.bind {bind} -> {rebind}" if bind else "admin added")
    for engine in sorted(set(running.facades) | set(reread.facades)):
        was, now = running.facades.get(engine), reread.facades.get(engine)
        if was is None:
            changes.append(f"facades.{engine} added")
        elif now is None:
            changes.append(f"facades.{engine} removed")
        else:
            if was.port != now.port:
                changes.append(f"facades.{engine}.port {was.port} -> {now.port}")
            if was.aliases != now.aliases:
                changes.append(f"facades.{engine}.aliases changed")
    return changes
