"""The broker link: JSON-RPC 2.0, one object per line, on stdio or a Twisted client endpoint.

This module knows framing, the JSON-RPC envelope, addressing (docs/broker-protocol.md#addressing)
and matching answers to the proxy's own requests. What each method does is the caller's: it hands in
a :class:`MethodTable` and gets the link's events back through it. Nothing a broker sends can crash
the process: every line is answered or dropped on its own, and whatever a line makes go wrong stays
inside that line (an exception out of ``dataReceived`` would make Twisted drop the stdin reader,
which the process takes for EOF and exits)."""

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

from nvpair import strictjson
from nvpair.engines import ENGINES

#: Longest line accepted; longer ones are answered -32600 and discarded (docs/broker-protocol.md).
MAX_LINE = 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BIND_FAILED = -32001
NO_FACADE = -32004

#: The code of an :class:`RpcError` built from a broker's error answer that has no usable one.
NO_CODE = 0

#: Facade-scoped methods (docs/broker-protocol.md#addressing): they must carry an engine address.
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
    """The -32602 answer naming the offending field (docs/broker-protocol.md#errors)."""
    return RpcError(INVALID_PARAMS, message, {"field": field})


@frozen
class Address:
    """Where a method goes: an engine's facade (``engine`` set) or the process (``None``)."""

    engine: str | None
    method: str


def resolve_address(method: str) -> Address:
    """Split ``<engine>:<method>``; only a known engine id counts as an address
    (docs/broker-protocol.md#addressing).

    ``errors:report`` stays the unaddressed method ``errors:report``: treating any prefix before
    a colon as an engine would strip a real method down to ``report``.
    """
    head, sep, rest = method.partition(":")
    if sep and head in ENGINES:
        return Address(head, rest)
    return Address(None, method)


def parse_line(line: bytes) -> object:
    """The JSON value of one line; ValueError when it is not JSON text this link accepts.

    Strict JSON (:func:`nvpair.strictjson.loads`: no ``NaN``/``Infinity`` literals, nesting
    past the recursion limit a parse error), and stricter still, on purpose:

    - UTF-8 only (``json.loads`` of bytes would also guess UTF-16 and UTF-32);
    - no lone surrogate escapes (``"\\ud800"``): such a string has no UTF-8 form, so it could
      be neither stored, logged nor echoed back as the text it claims to be.

    A number past a double's range (``1e400``) reads as an infinity: each field that takes a
    number refuses it there, with -32602 naming the field.
    """
    return strictjson.loads(line.decode("utf-8"), finite=False, lone_surrogates=False)


#: A JSON-RPC ``params`` object (or a whole message) as parsed: its values are whatever the
#: broker sent, and each validator narrows the ones it reads (``Any`` is honest here).
Params = Mapping[str, Any]

Handler = Callable[[Address, Params], object]


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
        # The start of a line whose newline has not arrived yet, kept as pieces so a long line
        # read in many small chunks is joined once instead of re-copied per chunk.
        self._partial: list[bytes] = []
        self._partial_size = 0
        self._discarding = False
        self._next_id = 1
        self._pending: dict[int, Deferred[object]] = {}
        self._input_closed = False
        self._output_closed = False
        self._drained: list[Deferred[None]] = []

    # -- framing ---------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        # Walk the chunk by index: slicing the rest of a buffer off per line would make one
        # read full of short lines cost quadratic time.
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            piece, start = data[start:end], end + 1
            if self._discarding:
                # The tail of an over-long line: already answered.
                self._discarding = False
                continue
            if self._partial:
                line = b"".join([*self._partial, piece])
                self._partial, self._partial_size = [], 0
            else:
                line = piece
            if len(line) > MAX_LINE:
                self._send_error(None, INVALID_REQUEST, "line exceeds 1 MiB")
                continue
            self._line_received(line)
        if self._discarding or start == len(data):
            return
        self._partial.append(data[start:])
        self._partial_size += len(data) - start
        if self._partial_size > MAX_LINE:
            self._partial, self._partial_size = [], 0
            self._discarding = True
            self._send_error(None, INVALID_REQUEST, "line exceeds 1 MiB")

    def readConnectionLost(self) -> None:
        # Half-close: the broker said all it will say. Our output stays open so the terminal
        # events of what shutdown cancels still reach it.
        if self._partial:
            # Lines are newline-terminated (docs/broker-protocol.md); a fragment cut off by EOF is
            # not one.
            self.log.warn(
                "dropped an unterminated last line ({size} bytes)", size=self._partial_size
            )
            self._partial, self._partial_size = [], 0
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

    def _frame(self, message: Mapping[str, object]) -> bytes | None:
        """One frame, or None (logged) for a message that has no JSON form.

        Never raises: a frame goes out from a handler's callback or another module's
        notification, and an exception there would be some unrelated caller's problem.
        """
        try:
            text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, RecursionError):
            # NaN or Infinity (no JSON form), something unserializable, or absurd nesting.
            self.log.failure("dropped a frame with no JSON form")
            return None
        try:
            return text.encode() + b"\n"
        except UnicodeEncodeError:
            # A lone surrogate has no UTF-8 form; the ASCII form escapes it and is still JSON.
            return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"

    def _write(self, message: Mapping[str, object]) -> bool:
        """Send one frame; False when it had no JSON form (and so was not sent)."""
        if self._output_closed or self.transport is None:
            return True
        frame = self._frame(message)
        if frame is None:
            return False
        self.transport.write(frame)
        return True

    def notify(self, method: str, params: Mapping[str, object]) -> None:
        """Send a notification (no answer expected)."""
        self._write({"jsonrpc": "2.0", "method": method, "params": params})

    def call(self, method: str, params: Mapping[str, object]) -> Deferred[object]:
        """Send a request with an id of our own; the Deferred fires with its result.

        It fails with :class:`RpcError` when the broker answers with an error (or with
        something that is not a well-formed answer), and with ConnectionError when the link
        closes first.
        """
        if self.transport is None or self._input_closed or self._output_closed:
            return defer.fail(ConnectionError("broker link closed"))
        request_id = self._next_id
        self._next_id += 1
        d: Deferred[object] = Deferred()
        self._pending[request_id] = d
        if not self._write(
            {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        ):
            del self._pending[request_id]
            return defer.fail(ValueError(f"{method}: params have no JSON form"))
        return d

    def _send_result(self, request_id: object, result: object) -> bool:
        return self._write({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _send_error(
        self,
        request_id: object,
        code: int,
        message: str,
        data: Mapping[str, object] | None = None,
    ) -> bool:
        error: dict[str, object] = {"code": code, "message": message}
        if data is not None:
            error["data"] = dict(data)
        return self._write({"jsonrpc": "2.0", "id": request_id, "error": error})

    # -- receiving -------------------------------------------------------------------------

    def _line_received(self, line: bytes) -> None:
        """The one containment boundary per line: nothing a line causes escapes from here."""
        if not line.strip():
            return
        reply = _Reply(self)
        try:
            self._serve_line(line, reply)
        except Exception:
            self.log.failure("broker line not handled")
            reply.error(INTERNAL_ERROR, "internal error")

    def _serve_line(self, line: bytes, reply: _Reply) -> None:
        try:
            message = parse_line(line)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError included
            reply.owe(None).error(PARSE_ERROR, "parse error")
            return
        if not isinstance(message, dict):
            reply.owe(None).error(INVALID_REQUEST, "expected one JSON object per line")
            return
        if "method" not in message:
            # An answer, to one of our requests or to nothing. Never answered in turn: an error
            # frame carrying its id would read to the broker as the answer to a request of its
            # own with the same id.
            self._answer_received(message)
            return
        request_id = message.get("id")
        if message.get("jsonrpc") != "2.0":
            reply.owe(_echo_id(request_id)).error(INVALID_REQUEST, 'jsonrpc must be "2.0"')
            return
        method = message["method"]
        is_request = "id" in message
        if not isinstance(method, str) or (is_request and not _valid_id(request_id)):
            reply.owe(_echo_id(request_id)).error(INVALID_REQUEST, "invalid request")
            return
        if is_request:
            # From here on a failure is answered -32603 unless an answer already went out.
            reply.owe(request_id)
        params = message.get("params", {})
        if not isinstance(params, dict):
            if is_request:
                reply.error(INVALID_PARAMS, "params must be an object", {"field": "params"})
            return
        self._dispatch(method, params, reply if is_request else None)

    def _answer_received(self, message: Params) -> None:
        request_id = message.get("id")
        d = None
        # bool is an int (True == 1), but an answer with id true did not answer our request 1.
        if isinstance(request_id, int) and not isinstance(request_id, bool):
            d = self._pending.pop(request_id, None)
        if d is None:
            # An answer we never asked for, or one already settled: ignored
            # (docs/broker-protocol.md).
            self.log.debug("ignored an unmatched answer")
            return
        if message.get("jsonrpc") == "2.0" and "result" in message and "error" not in message:
            d.callback(message["result"])
        else:
            # An error answer, or one that is not a well-formed answer at all: either way the
            # call failed, and leaving it pending would leave its caller waiting forever.
            d.errback(_answer_error(message))

    def _dispatch(self, method: str, params: Params, reply: _Reply | None) -> None:
        address = resolve_address(method)
        if address.engine is None and address.method in FACADE_SCOPED:
            self._no_facade(method, reply, "unaddressed")
            return
        if (
            address.engine is not None
            and address.method in FACADE_SCOPED
            and not self._table.facade_enabled(address.engine)
        ):
            self._no_facade(method, reply, "facade-not-enabled")
            return
        handler = self._table.handler(address)
        if handler is None:
            if reply is not None:
                reply.error(METHOD_NOT_FOUND, f"method not found: {method}")
            else:
                self.log.debug("ignored unknown notification {method}", method=method)
            return
        d = defer.maybeDeferred(handler, address, params)
        if reply is not None:
            d.addCallbacks(
                reply.result, lambda failure: self._handler_failed(failure, method, reply)
            )
        else:
            d.addErrback(self._handler_failed, method, None)
        # The callbacks above do not raise; should one ever, it is logged here rather than
        # left to surface as an unhandled error in a Deferred.
        d.addErrback(lambda failure: self.log.failure("answering {m}", failure, m=method))

    def _no_facade(self, method: str, reply: _Reply | None, reason: str) -> None:
        if reply is None:
            self.log.warn(
                "dropped {method}: resolves to no facade ({reason})", method=method, reason=reason
            )
            return
        reply.error(NO_FACADE, f"{method} resolves to no facade", {"reason": reason})

    def _handler_failed(self, failure: Failure, method: str, reply: _Reply | None) -> None:
        if failure.check(RpcError):
            error = failure.value
            assert isinstance(error, RpcError)
            if reply is None:
                self.log.warn(
                    "notification {method} refused: {why}", method=method, why=error.message
                )
            else:
                reply.error(error.code, error.message, error.data)
            return
        self.log.failure("handling {method} failed", failure, method=method)
        if reply is not None:
            reply.error(INTERNAL_ERROR, "internal error")


class _Reply:
    """The one answer a line is owed, once it is known to be owed one.

    Answering twice, or answering a line that is owed nothing (a notification, an answer),
    does nothing; so the line's containment boundary can always try -32603 last.
    """

    def __init__(self, protocol: BrokerProtocol) -> None:
        self._protocol = protocol
        self._owed = False
        self._sent = False
        self._request_id: object = None

    def owe(self, request_id: object) -> _Reply:
        """This line is owed an answer with ``request_id`` (JSON null for unreadable ids)."""
        self._owed, self._request_id = True, request_id
        return self

    def result(self, value: object) -> None:
        if self._settle() and not self._protocol._send_result(self._request_id, value):
            self._protocol._send_error(self._request_id, INTERNAL_ERROR, "internal error")

    def error(self, code: int, message: str, data: Mapping[str, object] | None = None) -> None:
        if self._settle() and not self._protocol._send_error(self._request_id, code, message, data):
            self._protocol._send_error(self._request_id, INTERNAL_ERROR, "internal error")

    def _settle(self) -> bool:
        if not self._owed or self._sent:
            return False
        self._sent = True
        return True


def _answer_error(message: Params) -> RpcError:
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


def _valid_id(value: object) -> bool:
    return value is None or (isinstance(value, int | str) and not isinstance(value, bool))


def _echo_id(value: object) -> object:
    return value if _valid_id(value) else None
