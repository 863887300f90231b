"""Responses the proxy generates itself (docs/request-path.md#proxy-generated-answers).

Each answers for a :class:`~nvpair.common.reasons.Reason` (its status, its default message): it
carries ``X-Nvpair-Error`` and a body in the route's dialect, and grants no CORS permission:
its head's fields are its own, never an engine's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from twisted.web.http import RESPONSES

from nvpair.common.reasons import Reason
from nvpair.engines.table import Dialect
from nvpair.wire.message import COMPLETE, Fields, ResponseHead
from nvpair.wire.web import ProxiedRequest

#: Reason phrases, with those Twisted's table lacks (RFC 6585's 429).
_PHRASES = {**RESPONSES, 429: b"Too Many Requests"}


def reason_phrase(status: int) -> bytes:
    """The reason phrase of a status the proxy answers with."""
    return _PHRASES.get(status, b"Error")


#: The longest model name an answer quotes back (a name, not a body, but bounded all the same).
_QUOTED_MODEL = 200


def _quoted(model: str) -> str:
    return json.dumps(model[:_QUOTED_MODEL], ensure_ascii=False)


#: The most node ids an answer names; the rest are counted.
_NAMED_NODES = 8


def _nodes(ids: Sequence[str]) -> str:
    named = ", ".join(ids[:_NAMED_NODES])
    rest = len(ids) - _NAMED_NODES
    return f"{named} and {rest} more" if rest > 0 else named


def no_owner_message(model: str | None, down: Sequence[str] = ()) -> str:
    """``no-owner`` for an inference request: which model nobody advertises, as named; or,
    when the nodes that last listed it are all down (``down``), that they are."""
    if down:
        which = f"model {_quoted(model)}" if model is not None else "a model"
        return f"every node that serves {which} is down: {_nodes(down)}"
    if model is None:
        return Reason.NO_OWNER.message
    return f"no node advertises model {_quoted(model)}"


def no_owner_timeout_message(model: str | None, bound: str) -> str:
    """``no-owner-timeout``: no owner came back within ``bound``, the wait that ran out as the
    option that set it (``the owner wait (--owner-wait 30s)``)."""
    which = f"model {_quoted(model)}" if model is not None else "this model"
    return f"no node serving {which} came back within {bound}"


def forbidden_model_message(model: str | None) -> str:
    """``forbidden-model``: the model the key may not use, as named (or that none was)."""
    if model is None:
        return "this key may use only some models: the request must name one"
    return f"this key may not use model {_quoted(model)}"


def no_node_message(engine: Dialect, model: str | None) -> str:
    """``no-owner`` for another route: the engine has no node at all (and the model named)."""
    message = f"no {engine.display_name} node is available"
    return message if model is None else f"{message} for model {_quoted(model)}"


def error_answer(
    engine: Dialect, path: str, reason: Reason, message: str | None = None
) -> tuple[int, bytes]:
    """The status and dialect body of the proxy-generated answer ``reason`` on ``path``."""
    return reason.status, engine.error_body(path, message or reason.message, reason)


def head_refusal(
    engine: Dialect,
    path: str,
    reason: Reason,
    message: str | None = None,
    *,
    head_only: bool,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> bytes:
    """A whole HTTP/1.1 answer for a request refused at its head, closing the connection.

    Written straight to the transport before the body is read (docs/robustness.md, refusals at the
    request head), so it is framed here rather than through ``twisted.web``'s Request.

    :param extra: header fields the answer also carries (fixed values, never request content).
    """
    status, body = error_answer(engine, path, reason, message)
    phrase = reason_phrase(status)
    fields = b"".join(b"%s: %s\r\n" % field for field in extra)
    head = (
        b"HTTP/1.1 %d %s\r\n"
        b"Content-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: %d\r\n"
        b"X-Nvpair-Error: %s\r\n"
        b"%s"
        b"Connection: close\r\n\r\n"
    ) % (status, phrase, len(body), reason.value.encode("ascii"), fields)
    return head if head_only else head + body


def write_error(
    request: ProxiedRequest,
    engine: Dialect,
    reason: Reason,
    *,
    retry_after: int | None = None,
    message: str | None = None,
    cors: Sequence[tuple[bytes, bytes]] = (),
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer ``request`` with the proxy-generated error ``reason`` and finish it.

    :param request: a request whose answer's head has not gone out; a head it was given
        (an engine's) is replaced, fields and all.
    :param retry_after: seconds for ``Retry-After`` (503 answers), at least 1.
    :param cors: the one exception to "no CORS headers": ``inventory-invalid`` carries the
        intersected headers when every responder granted
        (docs/browser-policy.md#the-proxys-own-answers).
    :param extra: header fields the answer also carries (``WWW-Authenticate``).
    """
    status, body = error_answer(engine, request.path.decode("latin-1"), reason, message)
    fields = Fields()
    fields.put(b"Content-Type", b"application/json; charset=utf-8")
    fields.put(b"Content-Length", b"%d" % len(body))
    fields.put(b"X-Nvpair-Error", reason.value)
    if retry_after is not None:
        fields.put(b"Retry-After", b"%d" % max(1, retry_after))
    for name, value in (*cors, *extra):
        fields.add(name, value)
    request.respond(ResponseHead(status, reason_phrase(status), fields))
    if request.head.method != b"HEAD":
        request.data(body)
    request.end(COMPLETE)
