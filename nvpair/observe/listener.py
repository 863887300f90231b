"""Where the admin routes listen: a loopback port opened when the process starts, and the same
port on the fleet file's ``[admin] bind`` (docs/lan.md#the-admin-view-from-the-lan).

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

#: The admin listener's own interface (``[admin]`` may add one LAN address).
LOOPBACK = "127.0.0.1"


class AdminListener(Service):
    """Listens for ``factory`` on loopback ``port`` from start to stop.

    :param cannot_serve: ends the process, given why (:meth:`nvpair.service.ProxyService.fail`).
    :param lan: the LAN address to listen on too, and its factory (one that sniffs for TLS and
        judges every caller); bound once, at start.
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorTCP,
        port: int,
        factory: ServerFactory[Any],
        cannot_serve: Callable[[str], None],
        lan: tuple[str, ServerFactory[Any]] | None = None,
    ) -> None:
        self._reactor = reactor
        self._port = port
        self._factory = factory
        self._cannot_serve = cannot_serve
        self._lan = lan
        self._listeners: list[IListeningPort] = []

    def startService(self) -> None:
        super().startService()
        wanted = [(LOOPBACK, self._factory)]
        if self._lan is not None:
            wanted.append(self._lan)
        for host, factory in wanted:
            try:
                self._listeners.append(self._reactor.listenTCP(self._port, factory, interface=host))
            except CannotListenError as error:
                where = f"[{host}]" if ":" in host else host
                message = f"cannot listen on {where}:{self._port}: {error.socketError}"
                self.log.warn("{message}", message=message)
                self._cannot_serve(f"admin listener not started: {message}")
                return
            if host != LOOPBACK:
                self.log.info(
                    "admin listener also on {host}:{port}, for LAN callers with an admin key",
                    host=host,
                    port=self._port,
                )

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        listeners, self._listeners = self._listeners, []
        if not listeners:
            return None
        stopped = defer.gatherResults(
            [defer.maybeDeferred(listener.stopListening) for listener in listeners]
        )
        return stopped.addCallback(lambda _: None)
