"""The broker link: JSON-RPC 2.0, one object per line, on stdio or a Twisted client endpoint.

This module serves one link: each line is read (:mod:`nvpair.broker.framing`), judged as an
envelope (:mod:`nvpair.broker.envelope`), then dispatched to the method its address names
(:mod:`nvpair.broker.addressing`) or matched to the proxy's own request it answers. What each
method does is the caller's: it hands in a :class:`~nvpair.broker.addressing.MethodTable` and
gets the link's events back through it. Nothing a broker sends can crash the process: every line
is answered or dropped on its own, and whatever a line makes go wrong stays inside that line (an
exception out of ``dataReceived`` would make Twisted drop the stdin reader, which the process
takes for EOF and exits)."""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IHalfCloseableProtocol
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from nvpair.broker.addressing import Address, Handler, MethodTable, no_facade, resolve_address
from nvpair.broker.envelope import (
    BIND_FAILED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NO_FACADE,
    NOT_JSON,
    Answer,
    Call,
    Invalid,
    Params,
    RpcError,
    answer_error,
    invalid_params,
    read_message,
)
from nvpair.broker.framing import LineReader, encode_frame, parse_line

# What the process's methods (nvpair.broker.methods) use of the link, importable from here.
__all__ = [
    "BIND_FAILED",
    "INTERNAL_ERROR",
    "Address",
    "BrokerProtocol",
    "Handler",
    "MethodTable",
    "Params",
    "RpcError",
    "invalid_params",
]


@implementer(IHalfCloseableProtocol)
class BrokerProtocol(Protocol):
    """One link: its lines served one by one, and the proxy's own requests matched to their
    answers.

    :param table: the methods this process serves.
    """

    log = Logger()

    def __init__(self, table: MethodTable) -> None:
        self._table = table
        self._lines = LineReader(self._line_received, self._line_too_long)
        self._next_id = 1
        self._pending: dict[int, Deferred[object]] = {}
        self._input_closed = False
        self._output_closed = False
        self._drained: list[Deferred[None]] = []

    # -- framing ---------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        self._lines.feed(data)

    def _line_too_long(self) -> None:
        self._send_error(None, INVALID_REQUEST, "line exceeds 1 MiB")

    def readConnectionLost(self) -> None:
        # Half-close: the broker said all it will say. Our output stays open so the terminal
        # events of what shutdown cancels still reach it.
        size = self._lines.drop_partial()
        if size:
            # Lines are newline-terminated (docs/broker-protocol.md); a fragment cut off by EOF is
            # not one.
            self.log.warn("dropped an unterminated last line ({size} bytes)", size=size)
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
            return encode_frame(message)
        except (ValueError, TypeError, RecursionError):
            self.log.failure("dropped a frame with no JSON form")
            return None

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
            incoming: Answer | Call | Invalid | None = NOT_JSON
        else:
            incoming = read_message(message)
        if isinstance(incoming, Answer):
            self._answer_received(incoming.message)
        elif isinstance(incoming, Invalid):
            reply.owe(incoming.request_id).error(incoming.code, incoming.message, incoming.data)
        elif incoming is not None:
            if incoming.is_request:
                # From here on a failure is answered -32603 unless an answer already went out.
                reply.owe(incoming.request_id)
            self._dispatch(incoming.method, incoming.params, reply if incoming.is_request else None)

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
            d.errback(answer_error(message))

    def _dispatch(self, method: str, params: Params, reply: _Reply | None) -> None:
        address = resolve_address(method)
        reason = no_facade(address, self._table)
        if reason is not None:
            self._no_facade(method, reply, reason)
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
