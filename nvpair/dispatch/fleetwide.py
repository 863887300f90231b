"""Fleet-wide requests: model lists and CORS preflights, answered from every node at once.

Every node of the engine is asked concurrently (bounded per node, see
:func:`nvpair.wire.client.fanout.ask_all`) — for the ``openai`` facade every node of every
engine, each at its own engine's URL (docs/openai-facade.md#models). What the answers mean is
decided by the pure modules: :mod:`nvpair.engines.inventory` merges model lists,
:mod:`nvpair.engines.cors` intersects browser permissions (docs/inventories.md,
docs/browser-policy.md). No reservations and no workload events: nothing is dispatched for
inference.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError

from nvpair.common.reasons import Reason
from nvpair.control.keyscope import KeyScope
from nvpair.control.state import Node
from nvpair.dispatch.job import Job, Services
from nvpair.engines.cors import Reply, inventory_grant, preflight
from nvpair.engines.inventory import InvalidInventory, merge_inventories
from nvpair.engines.modelnames import OtherName
from nvpair.engines.table import ENGINES, Dialect, InventoryRoute
from nvpair.wire.client.fanout import NodeReply, ask_all
from nvpair.wire.message import COMPLETE, Fields, ResponseHead

#: Caller credentials never sent along with a preflight (docs/browser-policy.md).
_CREDENTIALS = (b"cookie", b"authorization", b"proxy-authorization", b"x-api-key")


async def _ask_every_node(
    services: Services, job: Job, method: bytes, path: str | None, fields: Fields
) -> list[tuple[str, NodeReply]]:
    """Every node the facade reaches, concurrently, in candidate order; responders only, each
    with its engine.

    :param path: the path asked, with the client's query; None: the client's own target, as
        it wrote it (never the decoded path the request was routed on, which may hold bytes
        no request line can, docs/request-path.md#admission).
    """
    candidates = services.candidates
    target = job.admitted.uri
    if path is not None:
        query = target.partition(b"?")[2]
        target = path.encode("latin-1") + (b"?" + query if query else b"")
    nodes = candidates.every_node(job.admitted)
    bases = [candidates.maybe_base_url(node.engine, node) for node in nodes]
    replies = await ask_all(
        services.upstream,
        services.clock,
        services.bounds.dial_timeout,
        bases,
        method,
        target,
        fields,
    )
    if job.cancelled():
        raise CancelledError()
    return [
        (node.engine, reply)
        for node, reply in zip(nodes, replies, strict=True)
        if reply is not None
    ]


def _read_as(facade: Dialect, path: str, engines: list[str]) -> list[InventoryRoute] | None:
    """How each responder's list is read: as its own engine's on the same route when the
    facade reaches other engines' nodes (Ollama says ``"data": null`` for none), else (None) as
    the facade's own."""
    if not facade.spans_engines:
        return None
    return [ENGINES[engine].inventory[path] for engine in engines]


def _other_names(facade: Dialect, nodes: list[Node]) -> list[OtherName]:
    """The names the fleet knows ``nodes``' models by besides theirs (docs/model-names.md),
    keyed as the facade compares names: a facade reaching several engines lists one alias
    once, though each engine keys it its own way."""
    names = [other for node in nodes for other in node.other_names]
    if not facade.spans_engines:
        return names
    key = facade.model_key
    return [
        OtherName(other.name, key(other.name), other.reported, key(other.reported))
        for other in names
    ]


async def serve_inventory(services: Services, job: Job) -> None:
    """The fleet's model list: every node asked, merged."""
    admitted, request = job.admitted, job.request
    engine = admitted.engine
    route = engine.inventory[admitted.path]
    origin = request.head.fields.first(b"Origin")
    # A HEAD is decided like a GET (validity needs the bodies) and answered without one.
    # The route's own path: the one the table holds (its key, or the path the engine serves
    # it at), whatever escapes the client wrote it with.
    responders = await _ask_every_node(
        services, job, b"GET", route.upstream_path or admitted.path, job.outgoing.fields
    )
    if not responders:
        job.refuse(Reason.NO_RESPONDERS)
        return
    answers = [reply for _, reply in responders]
    replies = [Reply(a.status, a.headers) for a in answers]
    grant = inventory_grant(origin, replies) if origin is not None else None
    # With an Origin, only granting responders are judged for validity; a denial is a
    # denial, not an invalid list.
    judged = [
        (node_engine, a)
        for (node_engine, a), r in zip(responders, replies, strict=True)
        if origin is None or inventory_grant(origin, [r]).granted
    ]
    merged = b""
    invalid = any(not 200 <= a.status < 300 for _, a in judged)
    # A key with model patterns sees only the models it may use, judged as a request for
    # each would be (docs/lan.md#what-a-key-can-and-cannot-do).
    caller = admitted.caller
    allowed = (
        KeyScope(caller.models, engine, services.control.discovery).allows
        if caller is not None and caller.models
        else None
    )
    if not invalid:
        # The names the fleet knows its nodes' models by besides theirs (docs/model-names.md).
        names = _other_names(engine, services.candidates.every_node(admitted))
        try:
            merged = merge_inventories(
                engine,
                admitted.path,
                [a.body for _, a in judged],
                names,
                _read_as(engine, admitted.path, [e for e, _ in judged]),
                allowed,
                lan=caller is not None and caller.lan,
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
    fields = Fields()
    fields.put(b"Content-Type", b"application/json; charset=utf-8")
    fields.put(b"Content-Length", b"%d" % len(merged))
    for name, value in grant.headers if grant is not None else ():
        fields.add(name, value)
    request.respond(ResponseHead(200, fields=fields))
    if admitted.method != b"HEAD":
        request.data(merged)
    request.end(COMPLETE)


async def serve_preflight(services: Services, job: Job) -> None:
    """A CORS preflight: every node asked without credentials, permissions intersected."""
    request = job.request
    origin = request.head.fields.first(b"Origin") or b""
    # A copy: what the job sends is the same for every attempt, and only this one goes
    # without credentials.
    sent = job.outgoing.fields.copy()
    for name in _CREDENTIALS:
        sent.drop(name)
    answers = await _ask_every_node(services, job, b"OPTIONS", None, sent)
    if not answers:
        job.refuse(Reason.NO_RESPONDERS)
        return
    decision = preflight(origin, [Reply(a.status, a.headers) for _, a in answers])
    # A denial passes through as a denial: the engine's status, nothing else. It is not
    # proxy-generated, so it carries no X-Nvpair-Error: served, as a grant is.
    job.served(decision.status)
    fields = Fields()
    fields.put(b"Content-Length", b"0")
    for name, value in decision.headers:
        fields.add(name, value)
    request.respond(ResponseHead(decision.status, fields=fields))
    request.end(COMPLETE)
