"""Where the process's own messages go, as the facades and the request path see it.

Facades announce themselves (``ready``, ``error``, ``errors:report``) and the request path
reports workloads through an :class:`Outbox`; which one depends on the mode, never on the
caller (docs/broker-protocol.md#proxy-to-broker): the broker link, or in standalone mode the
log (:mod:`nvpair.broker.outboxes`).
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.defer import Deferred


class Outbox(Protocol):
    """Notifications and requests from the proxy to whoever drives it."""

    def notify(self, method: str, params: dict[str, object]) -> None: ...

    def call(self, method: str, params: dict[str, object]) -> Deferred[object]: ...
