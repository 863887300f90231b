"""The request path's entry: a table from route class to server."""

from __future__ import annotations

from nvpair.engines import RouteClass
from nvpair.requestpath import SERVERS


def test_every_route_class_has_a_server() -> None:
    """The request path's entry is a table: a route class without a server cannot exist."""
    assert set(SERVERS) == set(RouteClass)
