"""Where the process's own messages go: the broker link, or in standalone mode the log.

Facades announce themselves (``ready``, ``error``, ``errors:report``) and the request path
reports workloads through an :class:`Outbox`; which one depends on the mode, never on the
caller (docs/broker-protocol.md#proxy-to-broker).
"""

from __future__ import annotations

import json
from typing import Protocol

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from nvpair.broker import BrokerProtocol
from nvpair.logs import debug_enabled


class Outbox(Protocol):
    """Notifications and requests from the proxy to whoever drives it."""

    def notify(self, method: str, params: dict[str, object]) -> None: ...

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]: ...


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


class LogOutbox:
    """Standalone mode's outbox: what would go to a broker goes to the log instead."""

    log = Logger()

    def notify(self, method: str, params: dict[str, object]) -> None:
        # Workload events carry only operational fields (ids, model, node, times, state).
        if self.wanted():
            self.log.debug("event {method} {params}", method=method, params=json.dumps(params))

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]:
        return defer.succeed({})

    def wanted(self) -> bool:
        """Only while the log level is debug: otherwise an event would be built for nothing."""
        return debug_enabled()
