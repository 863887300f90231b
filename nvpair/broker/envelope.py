# -*- test-case-name: tests.broker.test_broker -*-
"""The JSON-RPC 2.0 envelope of the broker link: error codes, what an incoming message is,
and the error an answer carries.

Pure: values in, values out. :func:`read_message` judges a line's JSON value once, so the link
(:mod:`nvpair.broker.link`) only serves what it is told: an answer to match, a call to dispatch, or
an error to send back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BIND_FAILED = -32001
NO_FACADE = -32004

#: The code of an :class:`RpcError` built from a broker's error answer that has no usable one.
NO_CODE = 0

#: A JSON-RPC ``params`` object (or a whole message) as parsed: its values are whatever the
#: broker sent, and each validator narrows the ones it reads (``Any`` is honest here).
Params = Mapping[str, Any]


class RpcError(Exception):
    """An error answer: raised by a handler, sent as the JSON-RPC ``error`` member."""

    def __init__(self, code: int, message: str, data: Mapping[str, object] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(field: str, message: str) -> RpcError:
    """The -32602 answer naming the offending field (docs/broker-protocol.md#errors)."""
    return RpcError(INVALID_PARAMS, message, {"field": field})


@frozen
class Answer:
    """A message with no ``method``: an answer to one of the proxy's own requests, or to
    nothing. Never answered in turn: an error frame carrying its id would read to the broker as
    the answer to a request of its own with the same id."""

    message: Params


@frozen
class Call:
    """A request (``is_request``: it carries an id and is owed an answer) or a notification."""

    method: str
    params: Params
    is_request: bool
    request_id: object = None


@frozen
class Invalid:
    """A message answered with an error and not served."""

    request_id: object
    code: int
    message: str
    data: Mapping[str, object] | None = None


#: A line that is not JSON text the link accepts.
NOT_JSON = Invalid(None, PARSE_ERROR, "parse error")


def read_message(message: object) -> Answer | Call | Invalid | None:
    """What a line's JSON value is to the link; None for a notification to drop unanswered."""
    if not isinstance(message, dict):
        return Invalid(None, INVALID_REQUEST, "expected one JSON object per line")
    if "method" not in message:
        return Answer(message)
    request_id = message.get("id")
    if message.get("jsonrpc") != "2.0":
        return Invalid(echo_id(request_id), INVALID_REQUEST, 'jsonrpc must be "2.0"')
    method = message["method"]
    is_request = "id" in message
    if not isinstance(method, str) or (is_request and not valid_id(request_id)):
        return Invalid(echo_id(request_id), INVALID_REQUEST, "invalid request")
    params = message.get("params", {})
    if not isinstance(params, dict):
        if is_request:
            return Invalid(
                request_id, INVALID_PARAMS, "params must be an object", {"field": "params"}
            )
        return None
    return Call(method, params, is_request, request_id)


def answer_error(message: Params) -> RpcError:
    """The RpcError for an error answer, whatever shape its ``error`` member has."""
    error = message.get("error")
    if not isinstance(error, dict):
        return RpcError(NO_CODE, "malformed answer")
    code = error.get("code")
    text = error.get("message")
    data = error.get("data")
    return RpcError(
        code if isinstance(code, int) and not isinstance(code, bool) else NO_CODE,
        text if isinstance(text, str) else "",
        data if isinstance(data, dict) else None,
    )


def valid_id(value: object) -> bool:
    """An id a request may carry: a string, an integer (not a boolean), or null."""
    return value is None or (isinstance(value, int | str) and not isinstance(value, bool))


def echo_id(value: object) -> object:
    """The id to answer an invalid message with: its own when valid, else null."""
    return value if valid_id(value) else None
