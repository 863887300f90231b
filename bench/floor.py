"""The floor: the least a Twisted reverse proxy does, so nvpair's own stack has a yardstick.

``python -m bench.floor PORT UPSTREAM UPSTREAM [--ordered]``: a ``Site`` with one leaf resource
that forwards each request (method, target, headers minus hop-by-hop, body) with a raw ``Agent``
over a persistent pool, round robin over the upstreams (``--ordered``: always the first first),
and relays the body with ``deliverBody`` -> ``request.write`` under ``registerProducer``
backpressure. On a 503 or a connection error it tries the next upstream once. No access log, no
routing, no timeouts: everything nvpair does beyond this is what the bench puts a price on.
"""

from __future__ import annotations

import argparse
import itertools
import resource

from twisted.internet import defer
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import (
    IConsumer,
    IPushProducer,
    IReactorTCP,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.client import URI, Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IAgentEndpointFactory, IBodyProducer, IResponse
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site
from zope.interface import implementer

HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade"}
HOP |= {b"transfer-encoding", b"host", b"content-length"}


@implementer(IBodyProducer)
class Body:
    """A request body over bytes in memory (a failover sends it again)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.length = data, len(data)

    def startProducing(self, consumer: IConsumer) -> defer.Deferred[None]:
        consumer.write(self.data)
        return defer.succeed(None)

    def pauseProducing(self) -> None: ...

    def resumeProducing(self) -> None: ...

    def stopProducing(self) -> None: ...


class Relay(Protocol):
    """Upstream body -> client, pausing the upstream while the client is slow."""

    def __init__(self, request: Request, exchange: Exchange) -> None:
        self.request, self.exchange = request, exchange

    def connectionMade(self) -> None:
        self.exchange.upstream = IPushProducer(self.transport)
        self.request.registerProducer(self.transport, True)

    def dataReceived(self, data: bytes) -> None:
        if not self.exchange.gone:
            self.request.write(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self.exchange.gone:  # finish() after a disconnect raises
            return
        self.request.unregisterProducer()
        if reason.check(ResponseDone, PotentialDataLoss):
            self.request.finish()
        else:  # cut mid-body: the client must not take it for a whole answer
            self.request.loseConnection()


class Discard(Protocol):
    """Reads a 503's body so its connection goes back to the pool, or drops it (``close``)."""

    def __init__(self, close: bool = False) -> None:
        self.close = close

    def connectionMade(self) -> None:
        if self.close:
            IPushProducer(self.transport).stopProducing()


class Exchange:
    """One client request and its (at most two) upstream attempts."""

    def __init__(self, agent: Agent, request: Request, order: list[bytes]) -> None:
        self.agent, self.request, self.order = agent, request, order
        self.body = request.content.read() if request.content is not None else b""
        self.headers = Headers()
        for name, values in request.requestHeaders.getAllRawHeaders():
            if name.lower() not in HOP:
                self.headers.setRawHeaders(name, values)
        self.gone = False
        self.pending: defer.Deferred[IResponse] | None = None
        self.upstream: IPushProducer | None = None
        request.notifyFinish().addErrback(self.client_gone)

    def client_gone(self, _: Failure) -> None:
        self.gone = True
        if self.pending is not None:
            self.pending.cancel()
        if self.upstream is not None:
            self.upstream.stopProducing()

    def attempt(self, index: int) -> None:
        url = self.order[index] + self.request.uri
        self.pending = self.agent.request(self.request.method, url, self.headers, Body(self.body))
        self.pending.addCallbacks(
            self.respond, self.failed, callbackArgs=(index,), errbackArgs=(index,)
        )

    def respond(self, response: IResponse, index: int) -> None:
        self.pending = None
        if self.gone:
            response.deliverBody(Discard(close=True))
        elif response.code == 503 and index + 1 < len(self.order):
            response.deliverBody(Discard())
            self.attempt(index + 1)
        else:
            self.relay(response)

    def relay(self, response: IResponse) -> None:
        self.request.setResponseCode(response.code, response.phrase)
        for name, values in response.headers.getAllRawHeaders():
            if name.lower() not in HOP:
                self.request.responseHeaders.setRawHeaders(name, values)
        if response.length is not UNKNOWN_LENGTH:  # Twisted keeps it out of the headers
            self.request.setHeader(b"content-length", b"%d" % response.length)
        response.deliverBody(Relay(self.request, self))

    def failed(self, failure: Failure, index: int) -> None:
        self.pending = None
        if self.gone:
            return
        if index + 1 < len(self.order):
            self.attempt(index + 1)
        else:
            self.request.setResponseCode(502)
            self.request.finish()


class Forward(Resource):
    isLeaf = True

    def __init__(self, agent: Agent, upstreams: list[bytes], ordered: bool) -> None:
        Resource.__init__(self)
        self.agent, self.upstreams = agent, upstreams
        self.turn = itertools.cycle([0] if ordered else range(len(upstreams)))

    def render(self, request: Request) -> int:
        start = next(self.turn)
        order = self.upstreams[start:] + self.upstreams[:start]
        Exchange(self.agent, request, order[:2]).attempt(0)
        return NOT_DONE_YET


@implementer(IAgentEndpointFactory)
class Endpoints:
    """Upstreams are IP literals, dialled as such: the Agent's default ``HostnameEndpoint``
    sends even ``127.0.0.1`` through the threaded resolver on every new connection."""

    def __init__(self, reactor: IReactorTCP) -> None:
        self.reactor = reactor
        self.cache: dict[tuple[bytes, int], IStreamClientEndpoint] = {}

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        key = (uri.host, uri.port)
        if key not in self.cache:
            self.cache[key] = TCP4ClientEndpoint(self.reactor, uri.host.decode(), uri.port, 10)
        return self.cache[key]


class QuietSite(Site):
    def __init__(self, root: Resource) -> None:
        Site.__init__(self, root)

    def log(self, request: http.Request) -> None:
        """No access log: the floor measures the proxying alone."""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("port", type=int)
    parser.add_argument("upstreams", nargs="+", help="base URLs, e.g. http://127.0.0.1:8081")
    parser.add_argument("--ordered", action="store_true", help="always try the first first")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # held streams need ~2 fds each
    from twisted.internet import reactor

    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 4096
    pool.retryAutomatically = False
    upstreams = [url.rstrip("/").encode("ascii") for url in args.upstreams]
    agent = Agent.usingEndpointFactory(reactor, Endpoints(reactor), pool=pool)
    site = QuietSite(Forward(agent, upstreams, args.ordered))
    TCP4ServerEndpoint(reactor, args.port, backlog=4096, interface="127.0.0.1").listen(site)
    reactor.run()


if __name__ == "__main__":
    main()
