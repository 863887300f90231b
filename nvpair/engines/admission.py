"""Pure admission decisions: what a facade can tell from a request alone, without I/O.

The loopback gate, Ollama's DNS-rebinding guard on ``Host``, and the model an inference body
names (the request target's form is HTTP's, in :mod:`nvpair.wire.facade_server`). The facade
(:mod:`nvpair.facades.facade`) applies them; keeping them here means each is tested as a plain
function (docs/request-path.md#admission).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import socket
from urllib.parse import urlsplit

from twisted.internet.address import IPv4Address, IPv6Address

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
    return name, frozenset(str(info[4][0]) for info in infos)


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


def _document(body: bytes | str) -> object:
    """The body as parsed, None when it is no JSON; ``body`` may be given as its text already
    decoded from UTF-8 (lone surrogates passed), as a large one is
    (:meth:`nvpair.wire.facade_request.FacadeRequest.read_json`)."""
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


def model_from_body(engine: Dialect, route: RouteClass, path: str, body: bytes | str) -> str | None:
    """The model an inference (or model-naming other) body names (:func:`read_body`)."""
    return read_body(engine, route, path, body)[0]


def read_body(
    engine: Dialect, route: RouteClass, path: str, body: bytes | str
) -> tuple[str | None, object]:
    """The model an inference (or model-naming other) body names, and the body as parsed (None
    when it is no JSON), for whoever reads more of it (fleet mode's affinity).

    Inference bodies must be JSON objects (``bad-json`` otherwise); Ollama requires a model
    (``model-missing``), the others serve whatever they have loaded. An "other" body is only
    looked at, never refused: it is forwarded verbatim whatever it holds.
    """
    document = _document(body)
    if route is not RouteClass.INFERENCE:
        if not isinstance(document, dict):
            return None, document
        named = document.get("model")
        if not (isinstance(named, str) and named) and path in engine.named_model_paths:
            named = document.get("name")
        return (named if isinstance(named, str) and named else None), document
    if not isinstance(document, dict):
        raise BadBody(Reason.BAD_JSON)
    named = document.get("model")
    if isinstance(named, str) and named:
        return named, document
    if engine.model_required:
        raise BadBody(Reason.MODEL_MISSING)
    return None, document
