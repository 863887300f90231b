"""The shared upstream client: one connection pool for every facade, raw Agent on the hot path.

treq would add a shared cookie jar, redirects and content decoding to every proxied request;
a reverse proxy wants none of them, so this is a plain :class:`~twisted.web.client.Agent`.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IConsumer, IStreamClientEndpoint
from twisted.web.client import URI, Agent, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.error import SchemeNotSupported
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer, IPolicyForHTTPS, IResponse
from zope.interface import implementer

#: Idle connections kept per upstream. Twisted's default of 2 limits the idle cache, not
#: concurrency, and halved throughput in a measurement (reference/twisted-notes.md §2.5).
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


class _QuietClientFactory(_HTTP11ClientFactory):
    # One factory per upstream connection: at Twisted's default every connection would log
    # "Starting factory"/"Stopping factory" at info.
    noisy = False


def quiet_pool(reactor: Any) -> HTTPConnectionPool:
    """A persistent pool whose connections do not log their factories' lifecycles."""
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool._factory = _QuietClientFactory
    return pool


@implementer(IAgentEndpointFactory)
class _Endpoints:
    """Endpoints for the Agent, built once per plain ``host:port``.

    Agent asks for an endpoint on every request, pooled connection or not, and building a
    HostnameEndpoint runs IDNA on the host each time: measurable per request. TLS endpoints
    are not kept: which certificate a peer must present follows the live membership.
    """

    def __init__(self, reactor: Any, dial_timeout: float, tls: IPolicyForHTTPS | None) -> None:
        self._reactor = reactor
        # 0 means no dial timeout; HostnameEndpoint wants a number, so "never" is a long one.
        self._timeout = dial_timeout if dial_timeout > 0 else 10.0**9
        self._tls = tls
        self._plain: dict[tuple[bytes, int], IStreamClientEndpoint] = {}

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.host, uri.port)
        if uri.scheme == b"http":
            endpoint = self._plain.get(key)
            if endpoint is None:
                endpoint = HostnameEndpoint(self._reactor, uri.host, uri.port, self._timeout)
                self._plain[key] = endpoint
            return endpoint
        if uri.scheme == b"https" and self._tls is not None:
            creator = self._tls.creatorForNetloc(uri.host, uri.port)
            return wrapClientTLS(
                creator, HostnameEndpoint(self._reactor, uri.host, uri.port, self._timeout)
            )
        raise SchemeNotSupported(f"unsupported scheme: {uri.scheme!r}")


class Upstream:
    """Sends one request to one engine URL through the process-wide pool.

    :param reactor: provides IReactorTCP, IReactorTime (and IReactorSSL for https peers).
    :param dial_timeout: seconds to connect (``--dial-timeout``).
    """

    def __init__(
        self, reactor: Any, dial_timeout: float, tls: IPolicyForHTTPS | None = None
    ) -> None:
        """:param tls: how ``https://`` peers are dialled (pinned mutual TLS)."""
        self._pool = quiet_pool(reactor)
        self._pool.maxPersistentPerHost = MAX_PERSISTENT_PER_HOST
        self._pool.retryAutomatically = False
        self._agent = Agent.usingEndpointFactory(
            reactor, _Endpoints(reactor, dial_timeout, tls), pool=self._pool
        )

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Headers,
        body: bytes | None,
    ) -> Deferred[IResponse]:
        """Dispatch; fires with the response once its headers arrive.

        Cancelling the Deferred before then aborts the upstream connection.

        :param base_url: ``http://host:port`` of the engine (no trailing slash).
        :param uri: the path and query string, exactly as the client sent them.
        """
        # No body at all (rather than an empty one) keeps a GET free of "Content-Length: 0".
        bodiless = not body and method in _BODILESS
        producer = None if body is None or bodiless else BytesBody(body)
        url = base_url.rstrip("/").encode() + uri
        d: Deferred[IResponse] = self._agent.request(method, url, headers, producer)
        return d

    def close(self) -> Deferred[None]:
        """Close idle pooled connections (process shutdown)."""
        d: Deferred[None] = self._pool.closeCachedConnections()
        return d
