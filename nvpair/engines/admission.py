"""Pure admission decisions: what a facade can tell from a request alone, without I/O.

The loopback gate, Ollama's DNS-rebinding guard on ``Host``, and the model an inference body
names (the request target's form is HTTP's, in :mod:`nvpair.wire.server.site`). The facade
(:mod:`nvpair.facades.facade`) applies them; keeping them here means each is tested as a plain
function (docs/request-path.md#admission).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import socket
from typing import NamedTuple
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

from twisted.internet.address import IPv4Address, IPv6Address

from nvpair.common.jsonscan import is_key, members
from nvpair.common.reasons import Reason
from nvpair.engines.table import Dialect, RouteClass


def is_loopback(address: object) -> bool:
    """Whether a peer address is loopback, unwrapping IPv4-mapped IPv6 (``::ffff:127.0.0.1``).

    On Python 3.11 ``ip_address("::ffff:127.0.0.1").is_loopback`` is False, and a dual-stack
    listener on ``::`` reports IPv4 peers in exactly that form.
    """
    if not isinstance(address, IPv4Address | IPv6Address):
        # UNIX sockets and in-memory transports are local by construction.
        return True
    return _loopback_host(address.host)


@functools.lru_cache(maxsize=4096)
def _loopback_host(host: str) -> bool:
    # Cached: parsing the same few client addresses on every request showed in profiles.
    ip = parse_ip(host)
    return ip is not None and ip.is_loopback


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as a peer's host gives it, without a zone and with an IPv4-mapped IPv6
    address unwrapped; None when it is none."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def target_host(target: bytes, host_header: bytes | None) -> str:
    """The host a request names: an absolute-form target's authority wins over ``Host``."""
    if not target.startswith(b"/"):
        try:
            netloc = urlsplit(target.decode("ascii")).netloc
        except (UnicodeDecodeError, ValueError):
            netloc = ""
        if netloc:
            return netloc
    return host_header.decode("latin-1") if host_header is not None else ""


#: Name suffixes Ollama accepts in ``Host`` whatever they resolve to.
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")

#: The private ranges Go's ``netip.Addr.IsPrivate`` means (RFC 1918 and RFC 4193); Python's
#: ``is_private`` is broader.
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)


@functools.lru_cache(maxsize=1)
def this_machine() -> tuple[str, frozenset[str]]:
    """This machine's hostname (lower-case) and the addresses it resolves to.

    Resolved once; the process primes it at start (the lookup may block), so no request
    waits on it.
    """
    name = socket.gethostname().lower()
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        infos = []
    return name, frozenset(str(host) for *_, (host, *_port) in infos)


@functools.lru_cache(maxsize=1024)
def ollama_host_allowed(host: str) -> bool:
    """Ollama's DNS-rebinding guard on a loopback listener (its ``allowedHostsMiddleware``).

    Allowed: no host at all; an IP literal that is loopback, private, unspecified or this
    machine's own; ``localhost``; this machine's hostname; a name under ``.localhost``,
    ``.local`` or ``.internal``. Anything else is what a rebound DNS name looks like.

    :param host: the ``Host`` value as sent, with or without a port.
    """
    host = host.strip().lower()
    if not host:
        return True
    name = _without_port(host)
    ip = parse_ip(name)
    hostname, addresses = this_machine()
    if ip is not None:
        return (
            ip.is_loopback
            or ip.is_unspecified
            or any(ip in network for network in _PRIVATE)
            or str(ip) in addresses
        )
    return name in ("localhost", hostname) or name.endswith(_LOCAL_SUFFIXES)


def _without_port(host: str) -> str:
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    name, sep, port = host.rpartition(":")
    if sep and port.isascii() and port.isdigit() and ":" not in name:
        return name
    return host


class BadBody(Exception):
    """The body cannot be admitted: carries the answer's reason (``bad-json``, ...)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason)
        self.reason = reason


class Read(NamedTuple):
    """What admission reads of a body (:func:`read_body`).

    :ivar model: the model the request is routed on (None: it names none).
    :ivar document: the body as parsed (None when it is no JSON), for whoever reads more of it
        (fleet mode's affinity).
    :ivar member: the member ``model`` was read from, as the body spells it (``model``, an
        Ollama body's ``Model``, ``name``): the one a node's own name is written into.
    :ivar others: every other model the body names (a copy's ``source`` and ``destination``,
        a create's ``from``, an unused ``name``), judged against a key as the routed one is.
    :ivar opaque: the body is there but no JSON object this proxy reads, so what model it
        names (an engine's decoder may read one) cannot be judged.
    """

    model: str | None
    document: object
    member: str = "model"
    others: tuple[str, ...] = ()
    opaque: bool = False


#: The top-level members that name a model, on some route of some engine
#: (docs/lan.md#what-a-key-can-and-cannot-do).
MODEL_MEMBERS = ("model", "name", "source", "destination", "from")


def _document(body: bytes | str) -> object:
    """The body as parsed, None when it is no JSON; ``body`` may be given as its text already
    decoded from UTF-8 (lone surrogates passed), as a large one is
    (:meth:`nvpair.wire.server.request.FacadeRequest.read_json`)."""
    try:
        if isinstance(body, str):
            return json.loads(body)
        if body[:1] == b"{" and body[1:2] != b"\0":
            # What json.loads would decode it as (no BOM, no NUL in the second byte: UTF-8),
            # without its Python-level look at the first bytes on every request.
            return json.loads(body.decode("utf-8", "surrogatepass"))
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: "[[[[..." nested past the parser's limit is no JSON object either.
        return None


@functools.lru_cache(maxsize=256)
def _quoted_text(name: str) -> str:
    """A member name as a body's text spells it without escapes."""
    return json.dumps(name, ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def _quoted(name: str) -> bytes:
    """A member name as a body spells it without escapes."""
    return _quoted_text(name).encode()


def _exactly_repeated(body: bytes | str, spelled: list[str]) -> frozenset[str]:
    """Which of the top-level member names ``spelled`` the body holds more than once (JSON
    keeps the last; an engine whose decoder keeps another would read another model).

    Counting each name's quoted bytes settles most bodies at C speed: a name that occurs once
    cannot be repeated at the top level. A body with ``\\u`` escapes (a name can be spelled
    ``"\\u006dodel"``) or a name that occurs elsewhere too has its top level read where it
    lies, member by member: a second document beside the first would cost the body again
    (docs/robustness.md#what-a-request-body-costs).
    """
    if isinstance(body, str):
        if "\\u" not in body and all(body.count(_quoted_text(name)) <= 1 for name in spelled):
            return frozenset()
    elif b"\\u" not in body and all(body.count(_quoted(name)) <= 1 for name in spelled):
        return frozenset()
    seen: set[str] = set()
    repeated: set[str] = set()
    try:
        for key, _, _ in members(body):
            for name in spelled:
                if is_key(key, name):
                    (repeated if name in seen else seen).add(name)
    except (ValueError, RecursionError):
        return frozenset()
    return frozenset(repeated)


def _members(engine: Dialect, body: bytes | str, document: dict[str, object]) -> dict[str, str]:
    """The members of ``document`` that name a model, each as the body spells it, by the
    name the engine matches it under (:data:`MODEL_MEMBERS`).

    :raises BadBody: ``bad-json`` when one of them appears twice as the engine compares
        member names (Ollama's decoder folds case: ``{"model":"a","Model":"b"}`` is ``b`` to
        it, ``a`` to a reader that does not): the proxy would judge and route one model and
        the engine serve another (docs/lan.md#what-a-key-can-and-cannot-do).
    """
    found: dict[str, str] = {}
    if engine.member_names_fold:
        for key in document:
            folded = key.casefold()
            if folded in MODEL_MEMBERS:
                if folded in found:
                    raise BadBody(Reason.BAD_JSON)
                found[folded] = key
    else:
        found = {name: name for name in MODEL_MEMBERS if name in document}
    if found and _exactly_repeated(body, list(found.values())):
        raise BadBody(Reason.BAD_JSON)
    return found


def model_from_body(engine: Dialect, route: RouteClass, path: str, body: bytes | str) -> str | None:
    """The model an inference (or model-naming other) body names (:func:`read_body`)."""
    return read_body(engine, route, path, body).model


def read_body(engine: Dialect, route: RouteClass, path: str, body: bytes | str) -> Read:
    """The model an inference (or model-naming other) body names, the other models it names,
    and the body as parsed (:class:`Read`).

    Inference bodies must be JSON objects (``bad-json`` otherwise); Ollama requires a model
    (``model-missing``), the others serve whatever they have loaded. An "other" body that is
    no JSON object is forwarded verbatim whatever it holds. Any JSON object body that names a
    model twice over, as the engine reads member names, is refused (:func:`_members`).
    """
    document = _document(body)
    if not isinstance(document, dict):
        if route is RouteClass.INFERENCE:
            raise BadBody(Reason.BAD_JSON)
        return Read(None, document, opaque=bool(body))
    members = _members(engine, body, document)
    if not members:
        if route is RouteClass.INFERENCE and engine.model_required:
            raise BadBody(Reason.MODEL_MISSING)
        return Read(None, document)
    member = members.get("model")
    if member is not None and member != "model" and engine.spans_engines:
        # Ollama's decoder reads "Model" as the model; llama-server's and LM Studio's read
        # nothing there and serve what they have loaded: one body, two readings.
        raise BadBody(Reason.BAD_JSON)
    named = document.get(member) if member is not None else None
    if (
        not (isinstance(named, str) and named)
        and route is not RouteClass.INFERENCE
        and path in engine.named_model_paths
        and "name" in members
    ):
        member = members["name"]
        named = document.get(member)
    if not (isinstance(named, str) and named):
        if route is RouteClass.INFERENCE and engine.model_required:
            raise BadBody(Reason.MODEL_MISSING)
        member, named = None, None
    others = tuple(
        value
        for spelled in members.values()
        if spelled != member and isinstance(value := document.get(spelled), str) and value
    )
    return Read(named, document, member or "model", others)


def query_models(target: bytes) -> tuple[str, ...]:
    """Every non-empty ``model`` parameter of a request target's query, decoded as a server
    decodes it (names too: ``mod%65l`` is ``model``; ``+`` is a space)."""
    query = target.partition(b"?")[2].partition(b"#")[0]
    if not query:
        return ()
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, encoding="utf-8")
    return tuple(value for name, value in pairs if name == "model" and value)


#: ``%uXXXX``: no standard escape, but one llama-server's HTTP library decodes in a path and a
#: query (``/models/lo%u0061d`` is ``/models/load`` to it).
_WIDE_ESCAPE = re.compile(rb"%[uU]")


def wide_escape(target: bytes) -> bool:
    """Whether a request target holds a ``%u`` escape: refused, since the proxy and an engine
    would read it as different routes or parameters (docs/lan.md#what-a-key-can-and-cannot-do)."""
    return b"%" in target and _WIDE_ESCAPE.search(target) is not None


def routing_path(path: bytes) -> str:
    """The path a request is routed on: percent-decoded, as the engines route it (Go's
    ``net/http`` and gin, llama-server's HTTP library), so that ``/api/p%75ll`` is the pull it
    is to Ollama. The target itself is sent on as the client wrote it."""
    if b"%" not in path:
        return path.decode("latin-1")
    return unquote_to_bytes(path).decode("latin-1")
