"""Responses the proxy generates itself (contract cli-and-http.md, "Proxy-generated responses").

Each carries ``X-Nvpair-Error`` and a body in the route's dialect, and grants no CORS
permission: every header the response already held (an engine's, a default) is cleared first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nvpair.engines import Engine

#: reason → (status, message). The message is operational text only: never request content.
REASONS: dict[str, tuple[int, str]] = {
    "no-owner": (502, "no node advertises this model"),
    "upstream-transport": (502, "the upstream failed at the transport"),
    "first-body-timeout": (504, "the upstream answered but produced no content in time"),
    "deadline": (503, "the job deadline passed while attempts were failing"),
    "no-owner-timeout": (503, "no node advertising this model came back before the deadline"),
    "attempts-exhausted": (503, "every dispatch attempt failed"),
    "no-responders": (502, "no engine responded"),
    "inventory-invalid": (502, "an engine's model list could not be parsed"),
    "cors-denied": (403, "an engine denies this origin"),
    "model-missing": (400, "the request body names no model"),
    "bad-json": (400, "the request body is not a JSON object"),
    "body-too-large": (413, "the request body is too large"),
    "forbidden": (403, "plaintext access is allowed from loopback only"),
    "internal": (500, "internal error in the proxy"),
}


def write_error(
    request: Any,
    engine: Engine,
    reason: str,
    *,
    retry_after: int | None = None,
    message: str | None = None,
    cors: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Answer ``request`` with the proxy-generated error ``reason`` and finish it.

    :param request: a ``twisted.web.server.Request`` whose response has not started.
    :param retry_after: seconds for ``Retry-After`` (503 answers), at least 1.
    :param cors: the one exception to "no CORS headers": ``inventory-invalid`` carries the
        intersected headers when every responder granted (contract engine-routes.md).
    """
    status, default_message = REASONS[reason]
    path = request.path.decode("latin-1")
    body = engine.error_body(path, message or default_message, reason)
    headers = request.responseHeaders
    for name, _ in list(headers.getAllRawHeaders()):
        headers.removeHeader(name)
    request.setResponseCode(status)
    headers.setRawHeaders(b"content-type", [b"application/json; charset=utf-8"])
    headers.setRawHeaders(b"content-length", [str(len(body)).encode()])
    headers.setRawHeaders(b"x-nvpair-error", [reason.encode()])
    if retry_after is not None:
        headers.setRawHeaders(b"retry-after", [str(max(1, retry_after)).encode()])
    for name, value in cors:
        headers.addRawHeader(name, value)
    if request.method != b"HEAD":
        request.write(body)
    request.finish()
