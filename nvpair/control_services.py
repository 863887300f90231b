"""The services that bring control state into the process: the broker link, opened when the
process starts, and the fleet file, re-read on SIGHUP.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IReactorCore, IReactorThreads
from twisted.internet.protocol import Factory
from twisted.internet.stdio import StandardIO
from twisted.logger import Logger
from twisted.python.failure import Failure

from nvpair.broker.link import BrokerProtocol
from nvpair.fleet.file import Fleet, FleetFileError, load_fleet
from nvpair.fleet.polls import FleetService


class BrokerLinkService(Service):
    """Opens the broker link when the process starts: stdio, or a client endpoint string."""

    log = Logger()

    def __init__(self, reactor: IReactorCore, endpoint: str, protocol: BrokerProtocol) -> None:
        self._reactor = reactor
        self._endpoint = endpoint
        self._protocol = protocol
        self._stdio: StandardIO | None = None

    def startService(self) -> None:
        super().startService()
        if self._endpoint == "stdio":
            # Created here, not at import: stdout carries protocol frames and nothing else.
            self._stdio = StandardIO(self._protocol, reactor=self._reactor)
            return
        endpoint = clientFromString(self._reactor, self._endpoint)
        d = endpoint.connect(Factory.forProtocol(lambda: self._protocol))

        def failed(failure: Failure) -> None:
            self.log.error(
                "cannot reach the broker at {endpoint}: {why}",
                endpoint=self._endpoint,
                why=failure.getErrorMessage(),
            )
            self._protocol.connectionLost(failure)

        d.addErrback(failed)

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        return None


class FleetReloadService(Service):
    """SIGHUP re-reads the fleet file (docs/fleet-scheduling.md#the-fleet-file-re-read) and
    hands it to the fleet and to ``also``.

    Nodes, their URLs, the poll interval and ``[access]`` (networks, keys, TLS) are applied
    live; a file that no longer parses — the key file or the certificate it names included —
    is reported and the running configuration kept: a typo must not empty a working router,
    nor lock its callers out.

    :param also: each told of a re-read file once the fleet has it (``[access]``'s gate).
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorThreads,
        path: Path,
        fleet: FleetService,
        also: tuple[Callable[[Fleet], None], ...] = (),
    ) -> None:
        self._reactor = reactor
        self._path = path
        self._fleet = fleet
        self._also = also
        self._previous: Any = None

    def startService(self) -> None:
        super().startService()
        # The handler runs between bytecodes of whatever the reactor is doing; the reload runs
        # as a reactor event of its own.
        self._previous = signal.signal(
            signal.SIGHUP, lambda signum, frame: self._reactor.callFromThread(self.reload)
        )

    def stopService(self) -> Deferred[None] | None:
        super().stopService()
        if self._previous is not None:
            signal.signal(signal.SIGHUP, self._previous)
            self._previous = None
        return None

    def reload(self) -> None:
        if not self.running:
            return
        try:
            fleet = load_fleet(self._path)
        except FleetFileError as error:
            self.log.error("fleet file not reloaded, the running fleet is kept: {why}", why=error)
            return
        self.log.info("fleet file reloaded: {path}", path=str(self._path))
        self._fleet.reload(fleet)
        for tell in self._also:
            tell(fleet)
