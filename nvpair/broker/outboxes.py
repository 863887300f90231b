"""The two outboxes: the broker link, or in standalone mode the log
(docs/broker-protocol.md#proxy-to-broker).

Each is an :class:`~nvpair.control.outbox.Outbox`; the process picks one by its mode.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from nvpair.broker.link import BrokerProtocol
from nvpair.common.logs import debug_enabled


class BrokerOutbox:
    """The proxy → broker direction; messages before the link is up are dropped with a log."""

    log = Logger()

    def __init__(self) -> None:
        self.protocol: BrokerProtocol | None = None

    def notify(self, method: str, params: dict[str, object]) -> None:
        if self.protocol is None:
            self.log.warn("no broker link: dropped {method}", method=method)
            return
        self.protocol.notify(method, params)

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        if self.protocol is None:
            return defer.fail(ConnectionError("no broker link"))
        return self.protocol.call(method, params)

    def wanted(self) -> bool:
        """Whether notifications are consumed now: the broker always wants them."""
        return True


#: Names a record's own fields (or Logger's arguments) take; an event's field of that name is
#: kept as ``event_<name>``.
_RESERVED = frozenset({"format", "level", "time", "component", "namespace", "msg", "method"})


def _flatten(params: Mapping[str, object], into: dict[str, object]) -> None:
    for key, value in params.items():
        if isinstance(value, Mapping):
            # workloadInfo, its stats: their fields become the record's own.
            _flatten(value, into)
            continue
        if isinstance(value, list | tuple):
            # A facade's aliases: one readable field.
            value = ",".join(str(item) for item in value)
        if key in _RESERVED or key.startswith("log_") or key in into:
            key = f"event_{key}"
        into[key] = value


def event_record(method: str, params: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """One event as one readable log record: its message template and its fields.

    Every field of the event (a workload's nested ``workloadInfo`` and ``stats`` included) is a
    field of the record, under its own name (a workload's ``id`` as ``workloadId``), so a log
    reader filters on ``workloadId``, ``scheduledOn`` or ``state`` as on any other field,
    rather than parsing a string. Events carry operational fields only (ids, model, node,
    times, state, reason codes): never content.
    """
    info = params.get("workloadInfo")
    if isinstance(info, Mapping):
        info = {("workloadId" if key == "id" else key): value for key, value in info.items()}
        params = {**params, "workloadInfo": info}
    fields: dict[str, object] = {}
    _flatten(params, fields)
    if isinstance(info, Mapping):
        template = "{method}: workload {workloadId} ({engine} {model}) {state}"
        if fields.get("scheduledOn"):
            template += " on {scheduledOn}"
        if fields.get("error"):
            template += ": {error}"
    elif {"nodeId", "engine", "inFlight"} <= fields.keys():
        template = "{method}: {engine} node {nodeId} has {inFlight} in flight"
    else:
        template = "{method}"
    return template, fields


class LogOutbox:
    """Standalone mode's outbox: what would go to a broker goes to the log instead, at debug
    level, one record per event (:func:`event_record`)."""

    log = Logger()

    def notify(self, method: str, params: dict[str, object]) -> None:
        if self.wanted():
            template, fields = event_record(method, params)
            self.log.debug(template, method=method, **fields)

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        return defer.succeed({})

    def wanted(self) -> bool:
        """Only while the log level is debug: otherwise an event would be built for nothing."""
        return debug_enabled()
