"""Fleet-wide requests: model lists and CORS preflights, answered from every node at once.

Every node of the engine is asked concurrently (bounded per node, see
:func:`nvpair.wire.fanout.ask_all`); what the answers mean is decided by the pure modules:
:mod:`nvpair.engines.inventory` merges model lists, :mod:`nvpair.engines.cors` intersects browser
permissions (docs/inventories.md, docs/browser-policy.md). No reservations and no workload events:
nothing is dispatched for inference.
"""

from __future__ import annotations

from functools import partial

from twisted.internet.defer import CancelledError
from twisted.web.http_headers import Headers

from nvpair.common.reasons import Reason
from nvpair.dispatch.job import Job, Services
from nvpair.engines.caller import may_use
from nvpair.engines.cors import Reply, inventory_grant, preflight
from nvpair.engines.inventory import InvalidInventory, merge_inventories
from nvpair.wire.fanout import NodeReply, ask_all

#: Caller credentials never sent along with a preflight (docs/browser-policy.md).
_CREDENTIALS = (b"cookie", b"authorization", b"proxy-authorization", b"x-api-key")


async def _ask_every_node(
    services: Services, job: Job, method: bytes, path: str, headers: Headers
) -> list[NodeReply]:
    """Every node of the engine, concurrently, in candidate order; responders only."""
    engine = job.admitted.engine.id
    candidates = services.candidates
    query = job.admitted.uri[len(job.admitted.path.encode("latin-1")) :]
    bases = [candidates.maybe_base_url(engine, node) for node in candidates.every_node(engine)]
    replies = await ask_all(
        services.upstream,
        services.clock,
        services.bounds.dial_timeout,
        bases,
        method,
        path.encode("latin-1") + query,
        headers,
    )
    if job.cancelled():
        raise CancelledError()
    return [reply for reply in replies if reply is not None]


async def serve_inventory(services: Services, job: Job) -> None:
    """The fleet's model list: every node asked, merged."""
    admitted, request = job.admitted, job.request
    engine = admitted.engine
    route = engine.inventory[admitted.path]
    origin = request.requestHeaders.getRawHeaders(b"origin", [None])[0]
    # A HEAD is decided like a GET (validity needs the bodies) and answered without one.
    answers = await _ask_every_node(
        services, job, b"GET", route.upstream_path or admitted.path, job.outgoing().headers
    )
    if not answers:
        job.refuse(Reason.NO_RESPONDERS)
        return
    replies = [Reply(a.status, a.headers) for a in answers]
    grant = inventory_grant(origin, replies) if origin is not None else None
    # With an Origin, only granting responders are judged for validity; a denial is a
    # denial, not an invalid list.
    judged = [
        a
        for a, r in zip(answers, replies, strict=True)
        if origin is None or inventory_grant(origin, [r]).granted
    ]
    merged = b""
    invalid = any(not 200 <= a.status < 300 for a in judged)
    # A key with model patterns sees only the models it may use (docs/lan.md#keys).
    caller = admitted.caller
    allowed = partial(may_use, caller.models, engine) if caller and caller.models else None
    if not invalid:
        # The names the fleet knows its nodes' models by besides theirs (docs/model-names.md).
        names = [o for n in services.candidates.every_node(engine.id) for o in n.other_names]
        try:
            merged = merge_inventories(
                engine, admitted.path, [a.body for a in judged], names, allowed
            )
        except InvalidInventory:
            invalid = True
    if invalid:
        # No partial list. CORS headers only when every responder granted.
        cors = grant.headers if grant is not None and grant.granted else ()
        job.refuse(Reason.INVENTORY_INVALID, cors=cors)
        return
    if grant is not None and not grant.granted:
        job.refuse(Reason.CORS_DENIED)
        return
    job.served(200)
    headers = request.responseHeaders
    request.setResponseCode(200)
    headers.setRawHeaders(b"content-type", [b"application/json; charset=utf-8"])
    headers.setRawHeaders(b"content-length", [b"%d" % len(merged)])
    for name, value in grant.headers if grant is not None else ():
        headers.addRawHeader(name, value)
    if admitted.method != b"HEAD":
        request.write(merged)
    request.finish()


async def serve_preflight(services: Services, job: Job) -> None:
    """A CORS preflight: every node asked without credentials, permissions intersected."""
    request = job.request
    origin = request.requestHeaders.getRawHeaders(b"origin", [b""])[0]
    headers = job.outgoing().headers
    for name in _CREDENTIALS:
        headers.removeHeader(name)
    answers = await _ask_every_node(services, job, b"OPTIONS", job.admitted.path, headers)
    if not answers:
        job.refuse(Reason.NO_RESPONDERS)
        return
    decision = preflight(origin, [Reply(a.status, a.headers) for a in answers])
    # A denial passes through as a denial: the engine's status, nothing else. It is not
    # proxy-generated, so it carries no X-Nvpair-Error: served, as a grant is.
    job.served(decision.status)
    request.setResponseCode(decision.status)
    request.responseHeaders.setRawHeaders(b"content-length", [b"0"])
    for name, value in decision.headers:
        request.responseHeaders.addRawHeader(name, value)
    request.finish()
