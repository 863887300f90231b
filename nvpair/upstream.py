"""The shared upstream client: one connection pool for every facade, raw Agent on the hot path.

treq would add a shared cookie jar, redirects and content decoding to every proxied request;
a reverse proxy wants none of them, so this is a plain :class:`~twisted.web.client.Agent`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    HostnameEndpoint,
    TCP4ClientEndpoint,
    TCP6ClientEndpoint,
    wrapClientTLS,
)
from twisted.internet.interfaces import (
    IAddress,
    IConsumer,
    IProtocol,
    IProtocolFactory,
    IReactorTCP,
    IStreamClientEndpoint,
)
from twisted.web._newclient import HTTP11ClientProtocol, Request
from twisted.web.client import URI, Agent, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.error import SchemeNotSupported
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IPolicyForHTTPS, IResponse
from zope.interface import implementer

from nvpair.headers import connection_tokens

#: Idle connections kept per upstream. Twisted's default of 2 limits the idle cache, not
#: concurrency, and halved throughput in a measurement.
MAX_PERSISTENT_PER_HOST = 64


_BODILESS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE", b"TRACE"})


@implementer(IBodyProducer)
class BytesBody:
    """A request body over bytes already in memory.

    Each attempt gets a fresh one: ``FileBodyProducer`` closes its file at EOF, so a failover
    retry could not send the body again.
    """

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._body)
        return defer.succeed(None)

    def pauseProducing(self) -> None:
        """The whole body is written at once: nothing to pause."""

    def resumeProducing(self) -> None:
        """The whole body is written at once: nothing to resume."""

    def stopProducing(self) -> None:
        """The whole body is written at once: nothing to stop."""


class _ProxyClientProtocol(HTTP11ClientProtocol):
    """Twisted's client connection, with the response's hop-by-hop headers fully removed.

    Twisted moves ``Connection`` itself out of ``response.headers`` but keeps the headers it
    names (RFC 9110 §7.6.1 makes those hop-by-hop too); once it is gone nobody downstream can
    tell them apart. They are dropped here, where the ``Connection`` header is still known.
    """

    def request(self, request: Request) -> Deferred[IResponse]:
        d: Deferred[IResponse] = super().request(request)
        parser = getattr(self, "_parser", None)
        if parser is not None and parser.request is request:
            connection = parser.connHeaders
            d.addCallback(_drop_connection_named, connection)
        return d


def _drop_connection_named(response: IResponse, connection: Headers) -> IResponse:
    named = connection_tokens(connection.getRawHeaders(b"connection", []))
    for name in named:
        response.headers.removeHeader(name)
    return response


class _QuietClientFactory(_HTTP11ClientFactory):
    # One factory per upstream connection: at Twisted's default every connection would log
    # "Starting factory"/"Stopping factory" at info.
    noisy = False

    def buildProtocol(self, addr: IAddress | None) -> HTTP11ClientProtocol:
        protocol: HTTP11ClientProtocol = _ProxyClientProtocol(  # type: ignore[no-untyped-call]
            self._quiescentCallback
        )
        return protocol


def quiet_pool(reactor: IReactorTCP) -> HTTPConnectionPool:
    """A persistent pool whose connections do not log their factories' lifecycles."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool._factory = _QuietClientFactory
    return pool


@implementer(IStreamClientEndpoint)
class _Watched:
    """An endpoint that says when its connection is up (the dial budget ends there)."""

    def __init__(self, endpoint: IStreamClientEndpoint, connected: Callable[[], None]) -> None:
        self._endpoint = endpoint
        self._connected = connected
        self.dialled = False

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        self.dialled = True
        d: Deferred[IProtocol] = self._endpoint.connect(protocolFactory)

        def up(protocol: IProtocol) -> IProtocol:
            self._connected()
            return protocol

        return d.addCallback(up)


@implementer(IAgentEndpointFactory)
class _Endpoints:
    """Endpoints for the Agent, built once per plain ``host:port``.

    Agent asks for an endpoint on every request, pooled connection or not, and building a
    HostnameEndpoint runs IDNA on the host each time: measurable per request. TLS endpoints
    are not kept: which certificate a peer must present follows the live membership.

    :ivar watch: set around one ``Agent.request`` call: the endpoint handed out is then
        wrapped to report its connection (Agent asks for it synchronously inside that call).
    """

    def __init__(
        self, reactor: IReactorTCP, dial_timeout: float, tls: IPolicyForHTTPS | None
    ) -> None:
        self._reactor = reactor
        # 0 means no dial timeout; HostnameEndpoint wants a number, so "never" is a long one.
        self._timeout = dial_timeout if dial_timeout > 0 else 10.0**9
        self._tls = tls
        self._plain: dict[tuple[bytes, int], IStreamClientEndpoint] = {}
        self.watch: Callable[[], None] | None = None
        self.watched: _Watched | None = None

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        endpoint = self._endpoint(uri)
        if self.watch is not None:
            self.watched = _Watched(endpoint, self.watch)
            return self.watched
        return endpoint

    def _endpoint(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.host, uri.port)
        if uri.scheme == b"http":
            endpoint = self._plain.get(key)
            if endpoint is None:
                endpoint = self._tcp(uri.host, uri.port)
                self._plain[key] = endpoint
            return endpoint
        if uri.scheme == b"https" and self._tls is not None:
            creator = self._tls.creatorForNetloc(uri.host, uri.port)
            return wrapClientTLS(creator, self._tcp(uri.host, uri.port))
        raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")

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


def _pool(reactor: IReactorTCP) -> HTTPConnectionPool:
    pool = quiet_pool(reactor)
    pool.maxPersistentPerHost = MAX_PERSISTENT_PER_HOST
    # The failover loop decides what is retried, never the pool.
    pool.retryAutomatically = False
    return pool


class Upstream:
    """Sends one request to one engine URL through the process-wide pools.

    Plain engines share one pool. Pinned peers (``https://``) get a pool of their own that is
    retired whenever trust changes (:meth:`trust_changed`): a connection verified against a
    pin is never reused once that pin, or this node's membership, is gone.

    :param reactor: provides IReactorTCP, IReactorTime (and IReactorSSL for https peers).
    :param dial_timeout: seconds to connect (``--dial-timeout``).
    """

    def __init__(
        self, reactor: IReactorTCP, dial_timeout: float, tls: IPolicyForHTTPS | None = None
    ) -> None:
        """:param tls: how ``https://`` peers are dialled (pinned mutual TLS)."""
        self._reactor = reactor
        self._endpoints = _Endpoints(reactor, dial_timeout, tls)
        self._pool = _pool(reactor)
        self._agent = Agent.usingEndpointFactory(reactor, self._endpoints, pool=self._pool)
        self._peer_pool = _pool(reactor)
        self._peer_agent = Agent.usingEndpointFactory(
            reactor, self._endpoints, pool=self._peer_pool
        )

    def trust_changed(self) -> None:
        """Membership or a pin changed: no peer connection made before now is used again.

        Idle ones close now; one still carrying a response closes as soon as it is done
        (a timeout of 0 on the retired pool), and new requests get a fresh pool.
        """
        retired = self._peer_pool
        retired.cachedConnectionTimeout = 0
        retired.closeCachedConnections()
        self._peer_pool = _pool(self._reactor)
        self._peer_agent = Agent.usingEndpointFactory(
            self._reactor, self._endpoints, pool=self._peer_pool
        )

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Headers,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
    ) -> Deferred[IResponse]:
        """Dispatch; fires with the response once its headers arrive.

        Cancelling the Deferred before then aborts the upstream connection. Anything that
        fails while starting (no usable TLS trust, a bad URL) fails the Deferred: it never
        raises.

        :param base_url: ``http://host:port`` of the engine (no trailing slash).
        :param uri: the path and query (origin form, as admission normalized it).
        :param connected: called once the connection is up: at once for a pooled one,
            else when the dial completes (the header budget starts there,
            docs/retry-budget.md#per-attempt-budgets).
        """
        # No body at all (rather than an empty one) keeps a GET free of "Content-Length: 0".
        bodiless = not body and method in _BODILESS
        producer = None if body is None or bodiless else BytesBody(body)
        url = base_url.rstrip("/").encode() + uri
        agent = self._peer_agent if url.startswith(b"https:") else self._agent
        endpoints = self._endpoints
        endpoints.watch = connected
        try:
            d: Deferred[IResponse] = agent.request(method, url, headers, producer)
        except Exception:
            return defer.fail()
        finally:
            watched, endpoints.watch, endpoints.watched = endpoints.watched, None, None
        if connected is not None and (watched is None or not watched.dialled):
            # No dial happened: the pool had a connection ready.
            connected()
        return d

    def close(self) -> Deferred[None]:
        """Close idle pooled connections (process shutdown)."""
        closing = [self._pool.closeCachedConnections(), self._peer_pool.closeCachedConnections()]
        return defer.gatherResults(closing).addCallback(lambda _: None)
