# -*- test-case-name: tests.wire.server.test_facade_server -*-
"""What a facade connection says to the facade it serves and among its own modules: the
:class:`Gate` a facade is to the wire (the one thing the wire knows of one), and where a
connection is (:class:`Phase`). Names and protocols only.
"""

from __future__ import annotations

import enum
from typing import Protocol

from twisted.internet.interfaces import IAddress, IReactorTime

from nvpair.common.deadlines import Deadlines
from nvpair.wire.message import Fields
from nvpair.wire.server.body_budget import BodyBudget
from nvpair.wire.server.head import Refusal
from nvpair.wire.server.request import FacadeRequest


class Gate(Protocol):
    """What the wire asks of the facade it serves: everything engine-specific is behind this."""

    def refusal_at_head(
        self, peer: IAddress | None, target: bytes, fields: Fields, method: bytes
    ) -> Refusal | None:
        """The facade's reason to refuse a request from its head alone, or None to read on.

        Asked once HTTP's own rules hold: the target is in origin or absolute form, and there
        is at most one ``Host``.

        :param target: the request target as sent.
        """

    def refusal_answer(
        self,
        refusal: Refusal,
        target: bytes,
        method: bytes,
        fields: Fields | None = None,
        peer: IAddress | None = None,
    ) -> bytes:
        """A whole answer to ``refusal``, in the facade's dialect, saying the connection closes.

        :param target: the request target as sent (``b"/"`` when no request line was read).
        :param method: the request's method (empty when no request line was read).
        :param fields: the request's head's fields, where its head was read.
        :param peer: the client's address.
        """

    def serve(self, request: FacadeRequest) -> None:
        """Answer a whole request (head and body) that passed every check at its head."""


class Phase(enum.Enum):
    """What a connection is doing; each decides what becomes of the bytes it reads."""

    #: No request begun: waiting for a head, under the idle bound.
    IDLE = "idle"
    #: The request at the front is arriving (head or body); nothing is in flight.
    READING = "reading"
    #: The front request is being answered; what follows is parsed and waits its turn.
    ANSWERING = "answering"
    #: Answering what was parsed; nothing new is parsed, and the connection closes after it
    #: (a refusal may be owed once the answers before it are out).
    FINISHING = "finishing"
    #: A refusal was written; the refused body is read and dropped before the close.
    LINGERING = "lingering"
    #: The close was asked for; nothing more is read.
    CLOSING = "closing"
    #: The connection is gone.
    CLOSED = "closed"


class Listener(Protocol):
    """What a connection reads of the listener that made it (:class:`~nvpair.wire.server.site.
    FacadeSite`)."""

    gate: Gate
    max_request_body: int
    #: The request bodies held at once, every facade's together (``--max-body-memory``).
    bodies: BodyBudget
    head_timeout: float
    idle_timeout: float
    clock: IReactorTime
    #: The idle bound of every connection, on one timer (None: no idle bound).
    idle: Deadlines | None
