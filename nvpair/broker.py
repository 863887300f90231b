"""The broker link: JSON-RPC 2.0, one object per line, on stdio or a Twisted client endpoint.

This module knows framing, the JSON-RPC envelope, addressing (spec §4) and matching answers to
the proxy's own requests. What each method does is the caller's: it hands in a
:class:`MethodTable` and gets the link's events back through it. Nothing a broker sends can
crash the process: every line is answered or dropped on its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.engines import ENGINES

#: Longest line accepted; longer ones are answered -32600 and discarded (contract).
MAX_LINE = 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
BIND_FAILED = -32001
NO_FACADE = -32004
INTERNAL_ERROR = -32603

#: Facade-scoped methods (spec §4): they must carry an engine address.
FACADE_SCOPED = frozenset(
    {
        "ready",
        "error",
        "node/select",
        "node/set-local-backend",
        "errors:report",
        "set-port",
        "discovery:subscribe",
        "discovery:nodes",
    }
)


class RpcError(Exception):
    """An error answer: raised by a handler, sent as the JSON-RPC ``error`` member."""

    def __init__(self, code: int, message: str, data: Mapping[str, object] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def invalid_params(field: str, message: str) -> RpcError:
    """The -32602 answer naming the offending field, as the contract requires."""
    return RpcError(INVALID_PARAMS, message, {"field": field})


@frozen
class Address:
    """Where a method goes: an engine's facade (``engine`` set) or the process (``None``)."""

    engine: str | None
    method: str


def resolve_address(method: str) -> Address:
    """Split ``<engine>:<method>``; only a known engine id counts as an address (spec §4).

    ``errors:report`` stays the unaddressed method ``errors:report``: treating any prefix before
    a colon as an engine would strip a real method down to ``report``.
    """
    head, sep, rest = method.partition(":")
    if sep and head in ENGINES:
        return Address(head, rest)
    return Address(None, method)


Handler = Callable[[Address, Mapping[str, Any]], object]


class MethodTable:
    """What the link calls into. Subclassed (or built) by the process wiring.

    :meth:`handler` returns the callable for a resolved address, or None for an unknown method.
    A handler returns a result (or a Deferred of one) and raises :class:`RpcError` to refuse.
    """

    def handler(self, address: Address) -> Handler | None:
        raise NotImplementedError

    def facade_enabled(self, engine: str) -> bool:
        raise NotImplementedError

    def link_lost(self) -> None:
        """The broker closed the link: the process should stop serving and exit 0."""


@implementer(IHalfCloseableProtocol)
class BrokerProtocol(Protocol):
    """Line framing and JSON-RPC dispatch over one link.

    :param table: the methods this process serves.
    """

    log = Logger()

    def __init__(self, table: MethodTable) -> None:
        self._table = table
        self._buffer = b""
        self._discarding = False
        self._next_id = 1
        self._pending: dict[int, Deferred[object]] = {}
        self._input_closed = False
        self._output_closed = False
        self._drained: list[Deferred[None]] = []

    # -- framing ---------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            if self._discarding:
                # The tail of an over-long line: already answered.
                self._discarding = False
                continue
            if len(line) > MAX_LINE:
                self._send_error(None, INVALID_REQUEST, "line exceeds 1 MiB")
                continue
            self._line_received(line)
        if len(self._buffer) > MAX_LINE and not self._discarding:
            self._buffer = b""
            self._discarding = True
            self._send_error(None, INVALID_REQUEST, "line exceeds 1 MiB")
        elif self._discarding:
            self._buffer = b""

    def readConnectionLost(self) -> None:
        # Half-close: the broker said all it will say. Our output stays open so the terminal
        # events of what shutdown cancels still reach it.
        self._lose()

    def writeConnectionLost(self) -> None:
        # The broker stopped reading (or we closed our side after the last frame): nothing
        # more can be sent, which ends the link as surely as EOF on our input does.
        self._output_gone()
        self._lose()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._output_gone()
        self._lose()

    def _output_gone(self) -> None:
        self._output_closed = True
        drained, self._drained = self._drained, []
        for d in drained:
            d.callback(None)

    def close_output(self) -> Deferred[None]:
        """Close our side once every frame written so far has reached the broker.

        At shutdown the terminal events of cancelled requests are the last frames; without
        this the process could exit with them still in a write buffer.
        """
        if self._output_closed or self.transport is None:
            return defer.succeed(None)
        d: Deferred[None] = Deferred()
        self._drained.append(d)
        close = getattr(self.transport, "loseWriteConnection", self.transport.loseConnection)
        close()
        return d

    def _lose(self) -> None:
        if self._input_closed:
            return
        self._input_closed = True
        pending, self._pending = self._pending, {}
        for d in pending.values():
            d.errback(ConnectionError("broker link closed"))
        self._table.link_lost()

    # -- sending ---------------------------------------------------------------------------

    def _write(self, message: Mapping[str, object]) -> None:
        if self._output_closed or self.transport is None:
            return
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        self.transport.write(line + b"\n")

    def notify(self, method: str, params: Mapping[str, object]) -> None:
        """Send a notification (no answer expected)."""
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def call(self, method: str, params: Mapping[str, object]) -> Deferred[object]:
        """Send a request with an id of our own; the Deferred fires with its result."""
        if self.transport is None or self._input_closed or self._output_closed:
            return defer.fail(ConnectionError("broker link closed"))
        request_id = self._next_id
        self._next_id += 1
        d: Deferred[object] = Deferred()
        self._pending[request_id] = d
        self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return d

    def _send_result(self, request_id: object, result: object) -> None:
        self._write({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _send_error(
        self,
        request_id: object,
        code: int,
        message: str,
        data: Mapping[str, object] | None = None,
    ) -> None:
        error: dict[str, object] = {"code": code, "message": message}
        if data is not None:
            error["data"] = dict(data)
        self._write({"jsonrpc": "2.0", "id": request_id, "error": error})

    # -- receiving -------------------------------------------------------------------------

    def _line_received(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            self._send_error(None, PARSE_ERROR, "parse error")
            return
        if not isinstance(message, dict):
            self._send_error(None, INVALID_REQUEST, "expected one JSON object per line")
            return
        request_id = message.get("id")
        if message.get("jsonrpc") != "2.0":
            self._send_error(_echo_id(request_id), INVALID_REQUEST, 'jsonrpc must be "2.0"')
            return
        if "method" not in message:
            self._answer_received(message)
            return
        method = message["method"]
        is_request = "id" in message
        if not isinstance(method, str) or (is_request and not _valid_id(request_id)):
            self._send_error(_echo_id(request_id), INVALID_REQUEST, "invalid request")
            return
        params = message.get("params", {})
        if not isinstance(params, dict):
            if is_request:
                self._send_error(
                    request_id, INVALID_PARAMS, "params must be an object", {"field": "params"}
                )
            return
        self._dispatch(method, params, request_id if is_request else _NOTIFICATION)

    def _answer_received(self, message: Mapping[str, Any]) -> None:
        request_id = message.get("id")
        d = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if d is None:
            # An answer we never asked for, or one already settled: ignored (contract).
            self.log.debug("ignored an unmatched answer")
            return
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            d.errback(RpcError(int(error.get("code", 0)), str(error.get("message", ""))))
        else:
            d.callback(message.get("result"))

    def _dispatch(self, method: str, params: Mapping[str, Any], request_id: object) -> None:
        is_request = request_id is not _NOTIFICATION
        address = resolve_address(method)
        if address.engine is None and address.method in FACADE_SCOPED:
            self._no_facade(method, request_id, "unaddressed")
            return
        if (
            address.engine is not None
            and address.method in FACADE_SCOPED
            and not self._table.facade_enabled(address.engine)
        ):
            self._no_facade(method, request_id, "facade-not-enabled")
            return
        handler = self._table.handler(address)
        if handler is None:
            if is_request:
                self._send_error(request_id, METHOD_NOT_FOUND, f"method not found: {method}")
            else:
                self.log.debug("ignored unknown notification {method}", method=method)
            return
        d = defer.maybeDeferred(handler, address, params)
        if is_request:
            d.addCallbacks(
                lambda result: self._send_result(request_id, result),
                lambda failure: self._handler_failed(failure, method, request_id),
            )
        else:
            d.addErrback(self._handler_failed, method, None)

    def _no_facade(self, method: str, request_id: object, reason: str) -> None:
        if request_id is _NOTIFICATION:
            self.log.warn(
                "dropped {method}: resolves to no facade ({reason})", method=method, reason=reason
            )
            return
        self._send_error(
            request_id, NO_FACADE, f"{method} resolves to no facade", {"reason": reason}
        )

    def _handler_failed(self, failure: Failure, method: str, request_id: object) -> None:
        if failure.check(RpcError):
            error = failure.value
            assert isinstance(error, RpcError)
            if request_id is None:
                self.log.warn(
                    "notification {method} refused: {why}", method=method, why=error.message
                )
            else:
                self._send_error(request_id, error.code, error.message, error.data)
            return
        self.log.failure("handling {method} failed", failure, method=method)
        if request_id is not None:
            self._send_error(request_id, -32603, "internal error")


class _Notification:
    """Marks a message without an id: it is never answered."""


_NOTIFICATION: Any = _Notification()


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, int | str) and not isinstance(value, bool))


def _echo_id(value: object) -> object:
    return value if _valid_id(value) else None
