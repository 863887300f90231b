"""Sends gathered while upstream reads are handled, as a property
(docs/performance.md#one-send-per-read).

Whatever the nesting of handled reads and the sends made in and between them, every byte
leaves in the order it was sent; a send outside any read leaves at once, on its own; what the
outermost read's handling sent leaves as it ends, in one send, before anything sent after it.
Several outlets gathering in the same read each send once.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any, TypeAlias, cast

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import tcp
from twisted.internet.protocol import Protocol
from twisted.internet.testing import MemoryReactor

from nvpair.wire.outlet import GATHER, Outlet

#: A send to one of two outlets (which, what), or a read handled with what it holds.
Step: TypeAlias = tuple[int, bytes] | list["Step"]

steps: st.SearchStrategy[list[Step]] = st.lists(
    st.recursive(
        st.tuples(st.sampled_from([0, 1]), st.binary(min_size=1, max_size=8)),
        lambda inner: st.lists(inner, max_size=4),
        max_leaves=24,
    ),
    max_size=6,
)


class CountingSocket:
    """A socket that records each ``send`` the outlet makes, whole as it was made."""

    def __init__(self, inner: socket.socket) -> None:
        self.inner = inner
        self.sends: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sends.append(bytes(data))
        return self.inner.send(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def outlet_on_a_socket() -> tuple[Outlet, CountingSocket, socket.socket]:
    """An outlet on a real connected socket whose kernel buffer takes every small send."""
    ours, theirs = socket.socketpair()
    counted = CountingSocket(ours)
    transport: Any = tcp.Connection(cast(socket.socket, counted), Protocol(), MemoryReactor())
    transport.connected = True
    return Outlet(transport), counted, theirs


def sent_by(step: Step, outlet: int) -> Iterator[bytes]:
    """What ``step`` sends to ``outlet``, in order."""
    if isinstance(step, tuple):
        which, data = step
        if which == outlet:
            yield data
        return
    for inner in step:
        yield from sent_by(inner, outlet)


def play(step: Step, outlets: list[Outlet]) -> None:
    if isinstance(step, tuple):
        which, data = step
        outlets[which].send(data)
        return
    with GATHER:
        for inner in step:
            play(inner, outlets)


@given(steps)
def test_every_byte_leaves_in_order_and_each_outer_read_in_one_send(plan: list[Step]) -> None:
    made = [outlet_on_a_socket(), outlet_on_a_socket()]
    outlets = [outlet for outlet, _, _ in made]
    try:
        for step in plan:
            play(step, outlets)
            assert GATHER.depth == 0 and GATHER.outlets == []
        for which, (_, counted, _) in enumerate(made):
            expected = [b"".join(sent_by(step, which)) for step in plan]
            assert counted.sends == [piece for piece in expected if piece]
    finally:
        for _, counted, theirs in made:
            counted.inner.close()
            theirs.close()
