# -*- test-case-name: tests.wire.server.test_facade_head -*-
"""A facade's HTTP/1.1 server, on llhttp (``httptools``) inside Twisted's reactor: the factory
every facade listener serves, and all a facade needs of the wire.

twisted.web's server parses heads line by line in Python, builds a general-purpose request per
message and answers through layers a reverse proxy does not use; at the request rates a LAN
fleet sees, that machinery cost more than everything nvpair does per request (docs/performance.md).
This server does only what a facade needs, and does it at the request head. Its parts:

- :mod:`nvpair.wire.server.channel`: one connection, its phase, and the order in which its requests
  are read, answered, refused and closed on;
- :mod:`nvpair.wire.server.reader`: llhttp's parser and callbacks, the bounds on what it holds;
- :mod:`nvpair.wire.server.head`: HTTP's own rules for a request head, and the refusals they give;
- :mod:`nvpair.wire.server.request`: one request, its body, and its answer framed as it is written;
- :mod:`nvpair.wire.server.timeouts`: the head, idle, linger and abort bounds;
- :mod:`nvpair.wire.server.types`: the :class:`Gate` a facade is to the wire, a connection's phase.

The wire knows no engine: HTTP's own rules are checked here, and what a facade decides about the
client (the loopback gate, Ollama's ``Host`` guard) is asked of its :class:`Gate`.
"""

from __future__ import annotations

from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import ServerFactory

from nvpair.common.deadlines import Deadlines
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.channel import FacadeChannel
from nvpair.wire.server.head import Refusal, origin_form
from nvpair.wire.server.request import FacadeRequest
from nvpair.wire.server.types import Gate

# What a facade uses of the wire, importable from here.
__all__ = ["FacadeRequest", "FacadeSite", "Gate", "Refusal", "origin_form"]


class FacadeSite(ServerFactory):
    """The factory every facade listener serves.

    :param gate: the facade: what it refuses at the head, how it words a refusal, and what
        serves the requests it admits.
    :param max_request_body: the body cap (``--max-request-body``).
    :param head_timeout: seconds a request head may take from its first byte (0: no bound).
    :param idle_timeout: seconds a kept-alive connection may wait for its next request
        (0: no bound).
    :param bodies: the request bodies held at once (``--max-body-memory``), shared by every
        facade of the process; one of the default bound for this listener alone if not given.
    """

    noisy = False

    def __init__(
        self,
        gate: Gate,
        max_request_body: int,
        *,
        head_timeout: float = 30.0,
        idle_timeout: float = 300.0,
        clock: IReactorTime | None = None,
        bodies: BodyBudget | None = None,
    ) -> None:
        if clock is None:
            from twisted.internet import reactor

            clock = IReactorTime(reactor)
        self.gate = gate
        self.max_request_body = max_request_body
        self.bodies = bodies if bodies is not None else BodyBudget()
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.clock: IReactorTime = clock
        # Every connection's idle bound on one reactor timer (docs/performance.md#timers).
        self.idle = Deadlines(clock, idle_timeout) if idle_timeout > 0 else None

    def buildProtocol(self, addr: IAddress | None) -> FacadeChannel:
        return FacadeChannel(self, addr)
