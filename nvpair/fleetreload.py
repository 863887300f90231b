"""SIGHUP re-reads the fleet file (docs/fleet-scheduling.md#the-fleet-file-re-read).

Nodes, their URLs, the poll interval and ``[access]`` (networks, keys, TLS) are applied live;
a file that no longer parses — the key file or the certificate it names included — is
reported and the running configuration kept: a typo must not empty a working router, nor
lock its callers out.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorThreads
from twisted.logger import Logger

from nvpair.fleet import FleetService
from nvpair.fleetfile import Fleet, FleetFileError, load_fleet


class FleetReloadService(Service):
    """Re-reads the fleet file at SIGHUP and hands it to the fleet and to ``also``.

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
