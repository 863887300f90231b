"""The shared upstream client: pooled HTTP/1.1 connections of our own, for every facade.

Agent, its pool and its parser were a fifth of a proxied request's CPU (issue 11's profile:
``_newclient`` 10 %, the pool 4 %, ``Headers`` 4 %, with the Deferreds between them). A
reverse proxy needs little of what they offer, so this client keeps their keep-alive rules and
speaks this proxy's own HTTP types (:mod:`nvpair.wire.message`) on a connection of its own
(:mod:`nvpair.wire.client.connection`) and a pool that is a list per ``(scheme, host, port)``
(:mod:`nvpair.wire.client.pool`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from functools import partial

from attrs import frozen
from twisted.internet import defer
from twisted.internet.abstract import isIPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import (
    IReactorTCP,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import URI
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IPolicyForHTTPS

from nvpair.common.logs import debug_enabled
from nvpair.wire.client.connection import UpstreamConnection
from nvpair.wire.client.framing import request_head
from nvpair.wire.client.pool import IDLE_TIMEOUT, MAX_PERSISTENT_PER_HOST, Pool
from nvpair.wire.client.types import Key, Payload, Resent
from nvpair.wire.message import Answer, Fields
from nvpair.wire.outlet import WINDOW

_BODILESS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE", b"TRACE"})

#: Methods a request of which may be sent twice (RFC 9110 §9.2.2).
_IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

#: Methods whose request states an empty body as ``Content-Length: 0`` (Agent's rule,
#: RFC 9110 §8.6).
_BODY_EXPECTED = frozenset({b"PUT", b"POST"})

_REPARSED = re.compile(rb"[#;]|\?\Z")

#: Base URLs whose parse is kept; a fleet has a few dozen, so past this the cache restarts.
_MAX_TARGETS = 1024

log = Logger(namespace="nvpair.wire.client.upstream")


@frozen
class Target:
    """Where a base URL leads, parsed once.

    :ivar host_header: the ``Host`` value Agent sends: the port only when it is not the
        scheme's default, an IPv6 literal in brackets.
    :ivar plain: the base URL is only scheme and authority, so a request's target is its own
        path and query as given.
    """

    scheme: bytes
    host: bytes
    port: int
    host_header: bytes
    plain: bool
    base: bytes

    @property
    def key(self) -> Key:
        return (self.scheme, self.host, self.port)

    @property
    def tls(self) -> bool:
        return self.scheme == b"https"

    def request_target(self, uri: bytes) -> bytes:
        """The request target for ``uri`` (path and query) on this base, as Agent built it
        from ``base + uri``: a fragment is dropped, a base path is kept in front."""
        # Where urlparse would change nothing: no fragment, no ``;params`` (an empty one is
        # dropped), no empty query.
        if self.plain and uri[:1] == b"/" and not _REPARSED.search(uri):
            return uri
        target: bytes = URI.fromBytes(self.base + uri).originForm
        return target


def parse_target(base_url: str) -> Target:
    """Parse an engine's base URL (``http://host:port``, no trailing slash needed)."""
    base = base_url.rstrip("/").encode()
    uri = URI.fromBytes(base)
    host, port = uri.host, uri.port
    shown = host
    # As Agent's _computeHostValue.
    if isIPv6Address(host.decode("ascii")):
        shown = b"[" + host + b"]"
    if (uri.scheme, port) not in ((b"http", 80), (b"https", 443)):
        shown = b"%b:%d" % (shown, port)
    plain = not (uri.path or uri.params or uri.query or uri.fragment)
    return Target(uri.scheme, host, port, shown, plain, base)


class _Endpoints:
    """Endpoints to dial, built once per plain ``host:port``.

    Building a HostnameEndpoint runs IDNA on the host: measurable per request. TLS endpoints
    are not kept: which certificate a peer must present follows the live membership.
    """

    def __init__(
        self, reactor: IReactorTCP, dial_timeout: float, tls: IPolicyForHTTPS | None
    ) -> None:
        self._reactor = reactor
        # 0 means no dial timeout; HostnameEndpoint wants a number, so "never" is a long one.
        self._timeout = dial_timeout if dial_timeout > 0 else 10.0**9
        self._tls = tls
        self._plain: dict[tuple[bytes, int], IStreamClientEndpoint] = {}

    def endpoint(self, key: Key) -> IStreamClientEndpoint:
        scheme, host, port = key
        if scheme == b"http":
            endpoint = self._plain.get((host, port))
            if endpoint is None:
                endpoint = self._plain[(host, port)] = self._tcp(host, port)
            return endpoint
        if scheme == b"https" and self._tls is not None:
            creator = self._tls.creatorForNetloc(host, port)
            return wrapClientTLS(creator, self._tcp(host, port))
        if scheme == b"https":
            raise SchemeNotSupported(
                "an https:// node is a peer: this node has no cluster directory"
            )
        raise SchemeNotSupported(f"unsupported scheme: {scheme!r}")

    def _tcp(self, host: bytes, port: int) -> IStreamClientEndpoint:
        """A plain TCP endpoint; an IP literal skips the resolver.

        HostnameEndpoint resolves even a literal in a thread and, for one address, reports a
        refused connection only at its next 0.3 s attempt tick; a LAN node that is switched
        off should fail over at once (docs/retry-budget.md#retryable-failures).
        """
        text = host.decode("ascii").strip("[]")
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            return HostnameEndpoint(self._reactor, host, port, self._timeout)
        if ip.version == 4:
            return TCP4ClientEndpoint(self._reactor, text, port, self._timeout)
        return TCP6ClientEndpoint(self._reactor, text, port, self._timeout)


class _Dial:
    """One request that needs a new connection: dial, report it up, then send.

    :ivar result: the request's Deferred. Cancelled while dialling it cancels the dial
        (``ConnectingCancelledError``); once connected, the exchange.
    """

    def __init__(
        self,
        pool: Pool,
        key: Key,
        head: bool,
        data: Payload,
        connected: Callable[[], None] | None,
        result: Deferred[Answer] | None = None,
    ) -> None:
        """:param result: the Deferred to fire, when the request has one already (it is
        sent again, and that Deferred's canceller reaches :meth:`cancel`)."""
        self._pool = pool
        self._key = key
        self._head = head
        self._data = data
        self._connected = connected
        self._dialling: Deferred[UpstreamConnection] | None = None
        self._connection: UpstreamConnection | None = None
        self.result: Deferred[Answer] = Deferred(self.cancel) if result is None else result

    def start(self, endpoint: IStreamClientEndpoint) -> None:
        factory = self._pool.factory(self._key)
        dialling: Deferred[UpstreamConnection] = endpoint.connect(factory)  # type: ignore[assignment]
        self._dialling = dialling
        dialling.addCallbacks(self._up, self._failed)

    def _up(self, connection: UpstreamConnection) -> None:
        self._dialling = None
        self._connection = connection
        try:
            if self._connected is not None:
                # The dial budget ends, the header budget starts (docs/retry-budget.md).
                self._connected()
        except Exception:
            connection.close()
            self.result.errback()
            return
        connection.send(self._head, self._data, self.result)

    def _failed(self, failure: Failure) -> None:
        self._dialling = None
        if not self.result.called:
            self.result.errback(failure)

    def cancel(self, result: Deferred[Answer]) -> None:
        if self._dialling is not None:
            self._dialling.cancel()
        elif self._connection is not None:
            self._connection.cancel(result)


class Upstream:
    """Sends one request to one engine URL through the process-wide pools.

    Plain engines share one pool. Pinned peers (``https://``) get a pool of their own that is
    retired whenever trust changes (:meth:`trust_changed`): a connection verified against a
    pin is never reused once that pin, or this node's membership, is gone. A request is sent
    twice only when a kept-alive connection went before any byte of its answer (see
    :meth:`request`); any other retry is the failover loop's decision.

    :param reactor: provides IReactorTCP, IReactorTime (and IReactorSSL for https peers).
    :param dial_timeout: seconds to connect (``--dial-timeout``).
    """

    def __init__(
        self, reactor: IReactorTCP, dial_timeout: float, tls: IPolicyForHTTPS | None = None
    ) -> None:
        """:param tls: how ``https://`` peers are dialled (pinned mutual TLS)."""
        self._clock = IReactorTime(reactor)
        self._endpoints = _Endpoints(reactor, dial_timeout, tls)
        self._targets: dict[str, Target] = {}
        self._credentials: Mapping[str, bytes] = {}
        self._pool = self._new_pool()
        self._peer_pool = self._new_pool()

    def _new_pool(self) -> Pool:
        return Pool(self._clock, MAX_PERSISTENT_PER_HOST, IDLE_TIMEOUT)

    def set_credentials(self, by_url: Mapping[str, bytes]) -> None:
        """From now on, every request to a base URL of ``by_url`` carries its ``Authorization``
        value in place of any the caller's headers hold (fleet mode's node credentials,
        docs/fleet-scheduling.md#node-credentials). Every request to a node passes here —
        inference, other routes, inventories, preflights, polls — so none goes without it,
        and none sends one node's credential to another."""
        self._credentials = dict(by_url)

    def trust_changed(self) -> None:
        """Membership or a pin changed: no peer connection made before now is used again.

        Idle ones close now; one still carrying a response closes as soon as it is done, and
        new requests get a fresh pool.
        """
        self._peer_pool.retire()
        self._peer_pool = self._new_pool()

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        fields: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        """Dispatch; fires with the response once its headers arrive.

        Cancelling the Deferred before then aborts the upstream connection. Anything that
        fails while starting (no usable TLS trust, a bad URL, a header that cannot be sent)
        fails the Deferred: it never raises.

        A request sent on a pooled connection that goes before any byte of the answer (the
        engine closed it as idle just then) is sent once more on a fresh connection, when its
        method is idempotent or ``resend`` says it may be
        (docs/robustness.md#engine-answers); a fresh connection's request never is.

        :param base_url: ``http://host:port`` of the engine (no trailing slash).
        :param uri: the path and query (origin form, as admission normalized it).
        :param connected: called once the connection is up: at once for a pooled one,
            else when the dial completes (the header budget starts there,
            docs/retry-budget.md#per-attempt-budgets). Not again for a resend.
        :param resend: the caller may have this request sent twice.
        """
        try:
            target = self._targets.get(base_url)
            if target is None:
                target = self._target(base_url)
            path = target.request_target(uri)
            authorization = self._credentials.get(base_url)
            data: Payload
            if body is None or (not body and method in _BODILESS):
                # No body at all (rather than an empty one) keeps a GET free of
                # "Content-Length: 0".
                length = 0 if method in _BODY_EXPECTED else None
                data = request_head(method, path, target.host_header, fields, length, authorization)
            else:
                head = request_head(
                    method, path, target.host_header, fields, len(body), authorization
                )
                # A large body is not copied behind its head: the two go out as one request
                # (docs/robustness.md#what-a-request-body-costs).
                data = head + body if len(body) < WINDOW else (head, body)
            pool = self._peer_pool if target.tls else self._pool
            connection = pool.take(target.key)
            endpoint = None if connection is not None else self._endpoints.endpoint(target.key)
        except Exception:
            return defer.fail()
        if connection is not None:
            sent: Deferred[Answer] = Deferred(connection.cancel)
            to_head = method == b"HEAD"
            again = None
            if resend or method in _IDEMPOTENT:
                again = partial(self._redial, pool, target.key, to_head, data)
            connection.send(to_head, data, sent, again)
            if connected is not None:
                # No dial: the header budget starts now.
                connected()
            return sent
        assert endpoint is not None
        dial = _Dial(pool, target.key, method == b"HEAD", data, connected)
        dial.start(endpoint)
        return dial.result

    def _redial(
        self, pool: Pool, key: Key, head: bool, data: Payload, deferred: Deferred[Answer]
    ) -> Resent:
        """A pooled connection went before answering: the same request on a fresh one.

        Neither an attempt nor a failure of the node: only a debug line says it happened.
        """
        if debug_enabled():
            _, host, port = key
            log.debug(
                "a kept-alive connection to {host}:{port} closed before answering: "
                "sending again on a new one",
                host=host.decode("ascii", "replace"),
                port=port,
            )
        dial = _Dial(pool, key, head, data, None, deferred)
        try:
            # Trust may have been withdrawn since (a peer): failing here fails the request.
            dial.start(self._endpoints.endpoint(key))
        except Exception:
            if not deferred.called:
                deferred.errback()
        return dial.cancel

    def _target(self, base_url: str) -> Target:
        target = parse_target(base_url)
        if len(self._targets) >= _MAX_TARGETS:
            self._targets.clear()
        self._targets[base_url] = target
        return target

    def close(self) -> Deferred[None]:
        """Close idle pooled connections (process shutdown)."""
        closing = [self._pool.close_idle(), self._peer_pool.close_idle()]
        return defer.gatherResults(closing).addCallback(lambda _: None)
