"""Why the proxy answered for itself: one :class:`Reason` per answer it makes
(docs/request-path.md#proxy-generated-answers).

A reason's value is the string the wire carries: the ``X-Nvpair-Error`` header, the ``code`` of
an OpenAI-style error body, the ``outcome`` label of ``/metrics``, a workload's terminal
``error``. Pure values: the wire server refuses with a reason knowing nothing else of the
request path, so this module imports nothing of the proxy.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """A proxy-generated answer: its wire string, its HTTP status and its default message.

    A message is operational text only, never request content; the one thing from a request
    an answer may quote instead is the model named, metadata as in the log.
    """

    _value_: str
    #: The answer's HTTP status.
    status: int
    #: The answer's text when the caller has nothing more precise to say.
    message: str

    def __new__(cls, value: str, status: int, message: str) -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        member.message = message
        return member

    NO_OWNER = "no-owner", 502, "no node advertises this model"
    UPSTREAM_TRANSPORT = "upstream-transport", 502, "the upstream failed at the transport"
    FIRST_BODY_TIMEOUT = (
        "first-body-timeout",
        504,
        "the upstream answered but produced no content in time",
    )
    DEADLINE = "deadline", 503, "the job deadline passed while attempts were failing"
    NO_OWNER_TIMEOUT = (
        "no-owner-timeout",
        503,
        "no node advertising this model came back before the deadline",
    )
    ATTEMPTS_EXHAUSTED = "attempts-exhausted", 503, "every dispatch attempt failed"
    STARTING = (
        "starting",
        503,
        "the engine's nodes have not answered their first poll yet, or say they are loading",
    )
    NO_RESPONDERS = "no-responders", 502, "no engine responded"
    INVENTORY_INVALID = "inventory-invalid", 502, "an engine's model list could not be parsed"
    CORS_DENIED = "cors-denied", 403, "an engine denies this origin"
    MODEL_MISSING = "model-missing", 400, "the request body names no model"
    BAD_JSON = "bad-json", 400, "the request body is not a JSON object"
    BODY_TOO_LARGE = "body-too-large", 413, "the request body is too large"
    FORBIDDEN = "forbidden", 403, "plaintext access is allowed from loopback only"
    FORBIDDEN_HOST = "forbidden-host", 403, "this Host is not allowed (DNS-rebinding guard)"
    BAD_REQUEST = "bad-request", 400, "malformed request"
    NOT_FOUND = "not-found", 404, "this endpoint serves no such route"
    NOT_IMPLEMENTED = "not-implemented", 501, "not implemented by this proxy"
    INTERNAL = "internal", 500, "internal error in the proxy"
    UNAUTHORIZED = "unauthorized", 401, "a valid key is required: Authorization: Bearer <key>"
    FORBIDDEN_MODEL = "forbidden-model", 403, "this key may not use this model"
    QUEUE_FULL = (
        "queue-full",
        429,
        "too many requests are waiting for this model: try again later",
    )
    QUEUE_TIMEOUT = (
        "queue-timeout",
        503,
        "no node could start this request in time: try again later",
    )
    FORBIDDEN_ROUTE = (
        "forbidden-route",
        403,
        "this key may not change what the engines hold (its key file block says no manage)",
    )
    OVERLOADED = (
        "overloaded",
        503,
        "the request bodies this proxy holds are at its bound: try again later",
    )
    TOO_MANY_AUTH_FAILURES = (
        "too-many-auth-failures",
        429,
        "too many failed keys from this address: try again later",
    )
    TLS_REQUIRED = (
        "tls-required",
        403,
        "callers from the LAN must use TLS (https://) on this port",
    )
