"""Where the admin routes listen: a loopback port opened when the process starts.

A port it cannot have ends the process, exit status 1, as a fleet facade's does: the operator
asked for the listener, and a process running without it would leave every health check and
scrape failing with nothing said (docs/operations.md#the-admin-listener).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.internet.protocol import ServerFactory
from twisted.logger import Logger

#: The admin listener's only interface.
LOOPBACK = "127.0.0.1"


class AdminListener(Service):
    """Listens for ``factory`` on loopback ``port`` from start to stop.

    :param cannot_serve: ends the process, given why (:meth:`nvpair.service.ProxyService.fail`).
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorTCP,
        port: int,
        factory: ServerFactory[Any],
        cannot_serve: Callable[[str], None],
    ) -> None:
        self._reactor = reactor
        self._port = port
        self._factory = factory
        self._cannot_serve = cannot_serve
        self._listener: IListeningPort | None = None

    def startService(self) -> None:
        super().startService()
        try:
            self._listener = self._reactor.listenTCP(self._port, self._factory, interface=LOOPBACK)
        except CannotListenError as error:
            message = f"cannot listen on {LOOPBACK}:{self._port}: {error.socketError}"
            self.log.warn("{message}", message=message)
            self._cannot_serve(f"admin listener not started: {message}")

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        listener, self._listener = self._listener, None
        if listener is None:
            return None
        stopped: Deferred[object] = defer.maybeDeferred(listener.stopListening)
        return stopped.addCallback(lambda _: None)
