"""The request path after admission: resolve candidates, dispatch, commit, relay.

This is the first round of the spec's loop (§5 steps 1-4 for one candidate): owners are
filtered from the live snapshot, ordered pin → priority → default, and the first one is
dispatched to. The attempt commits at the first body byte (§5.2) and the body is relayed with
backpressure.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.iweb import IResponse

from nvpair.answers import write_error
from nvpair.config import Config
from nvpair.control import ControlState, Node
from nvpair.engines import RouteClass
from nvpair.facade import Admitted, RequestHandler, upstream_headers
from nvpair.headers import end_to_end
from nvpair.relay import BodyRelay
from nvpair.routing import owners, plan
from nvpair.upstream import Upstream


class NoAddress(Exception):
    """The node has no address to dial (a local node before ``node/set-local-backend``)."""


class RequestPath(RequestHandler):
    """Serves admitted requests for every facade (one per process).

    :param clock: for the header and first-body timeouts.
    :param control: the live control state, read per request.
    :param upstream: the process-wide upstream client.
    """

    log = Logger()

    def __init__(
        self, clock: IReactorTime, control: ControlState, upstream: Upstream, config: Config
    ) -> None:
        self._clock = clock
        self._control = control
        self._upstream = upstream
        self._config = config
        self._in_flight: set[Deferred[None]] = set()

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._in_flight)

    def cancel_all(self) -> None:
        """Process shutdown: cancel every request in flight (each ends as cancelled)."""
        for d in list(self._in_flight):
            d.cancel()

    def handle(self, admitted: Admitted, request: Any) -> Deferred[None]:
        d = Deferred.fromCoroutine(self._serve(admitted, request))
        # The requester leaving cancels whatever the request is waiting on; the coroutine's
        # cleanup closes the upstream.
        request.notifyFinish().addErrback(lambda _: d.cancel())
        self._in_flight.add(d)

        def ended(result: object) -> object:
            self._in_flight.discard(d)
            return result

        def cancelled(failure: Failure) -> None:
            failure.trap(CancelledError)
            # Shutdown (or the requester leaving): whoever is still connected sees the
            # connection close rather than wait on an answer that will never come.
            if not request.finished and request.channel is not None:
                request.loseConnection()

        d.addBoth(ended)
        d.addErrback(cancelled)
        return d

    def candidates(self, admitted: Admitted) -> list[Node]:
        """This round's candidates in dispatch order, from the live snapshot."""
        engine = admitted.engine
        discovery = self._control.discovery(engine.id)
        if admitted.route is RouteClass.INFERENCE:
            eligible = owners(discovery, admitted.model_key)
        else:
            # Other routes go to the named model's owners when any node has it, else to any
            # node of the engine (contract, "Inference vs other routes").
            named = owners(discovery, admitted.model_key) if admitted.model_key else []
            eligible = named or list(discovery.nodes)
        ordered = plan(eligible, self._control.pin(engine.id), self._control.priority, {})
        return list(ordered.candidates)

    def base_url(self, engine: str, node: Node) -> str:
        url = self._control.local_backend(engine) if node.local else node.url
        if not url:
            raise NoAddress(f"node {node.id} has no address")
        return url

    async def _serve(self, admitted: Admitted, request: Any) -> None:
        engine = admitted.engine
        candidates = self.candidates(admitted)
        if not candidates:
            write_error(request, engine, "no-owner")
            return
        node = candidates[0]
        headers = Headers()
        for name, values in upstream_headers(request):
            headers.setRawHeaders(name, values)
        timeout = self._config.response_header_timeout
        try:
            base = self.base_url(engine.id, node)
            dispatched = self._upstream.request(
                base, admitted.method, admitted.uri, headers, admitted.body
            )
            if timeout:
                dispatched.addTimeout(timeout, self._clock)
            response: IResponse = await dispatched
        except CancelledError:
            raise
        except Exception as failure:
            self.log.debug(
                "dispatch to {node} failed: {why}",
                engine=engine.id,
                node=node.id,
                why=type(failure).__name__,
            )
            write_error(request, engine, "upstream-transport")
            return

        relay = BodyRelay()
        response.deliverBody(relay)
        first = relay.first
        if timeout:
            first.addTimeout(timeout, self._clock)
        try:
            await first
        except TimeoutError:
            write_error(request, engine, "first-body-timeout")
            return
        except CancelledError:
            raise
        except Exception:
            write_error(request, engine, "upstream-transport")
            return

        request.setResponseCode(response.code, response.phrase)
        for name, values in end_to_end(response.headers.getAllRawHeaders(), request=False):
            request.responseHeaders.setRawHeaders(name, values)
        relay.attach(request)
        try:
            end = await relay.done
        except CancelledError:
            relay.client_gone()
            raise
        self.log.debug(
            "{path} served by {node}: {status} complete={complete}",
            engine=engine.id,
            path=admitted.path,
            node=node.id,
            status=response.code,
            complete=end.complete,
        )
