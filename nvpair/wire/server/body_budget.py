# -*- test-case-name: tests.wire.server.test_body_budget -*-
"""The request bodies held at once, all facades together, against ``--max-body-memory``
(docs/robustness.md#what-a-request-body-costs).

A body is reserved before it is kept: its declared length at the head, a chunked body's bytes
as they come. A reservation that would pass the bound is refused, and the request with it (503
``overloaded``); what was reserved is released once, whichever way the request ends. Pure
accounting: no reactor, no request.
"""

from __future__ import annotations

#: ``--max-body-memory``'s default: four bodies at the default ``--max-request-body``.
DEFAULT_MAX_BODY_MEMORY = 256 * 1024 * 1024


class BodyBudget:
    """Bytes of request bodies held, and the bound they stay within.

    :param limit: the bound (``--max-body-memory``).
    """

    __slots__ = ("held", "limit")

    def __init__(self, limit: int = DEFAULT_MAX_BODY_MEMORY) -> None:
        if limit < 1:
            raise ValueError(f"a body budget must be positive: {limit}")
        self.limit = limit
        #: Bytes reserved now.
        self.held = 0

    def reserve(self, size: int) -> bool:
        """Reserve ``size`` more bytes: False, and nothing reserved, when they would pass the
        bound."""
        held = self.held + size
        if held > self.limit:
            return False
        self.held = held
        return True

    def release(self, size: int) -> None:
        """Give back ``size`` bytes reserved earlier."""
        held = self.held - size
        if held < 0:
            raise ValueError(f"released {size} bytes of {self.held} held")
        self.held = held
