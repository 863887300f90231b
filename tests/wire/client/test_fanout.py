# -*- test-case-name: tests.wire.client.test_fanout -*-
"""Asking every node at once (:mod:`nvpair.wire.client.fanout`; docs/inventories.md#fan-out): each
ask bounded by ``--dial-timeout`` plus 30 s, and every ask that ends early
(the client left, a node timed out, an answer too large) closes its upstream connection in
whichever phase it was: dialling, awaiting headers or reading the body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from nvpair.wire.client.fanout import GRACE, MAX_BODY, NodeReply, ask_all
from nvpair.wire.client.upstream import Upstream
from nvpair.wire.message import Answer, Fields
from tests.wire.client.test_bodies import (
    FakeResponse,
    Sent,
    StallingUpstream,
    result_of,
    stalling_upstreams,
)

# -- scripted upstreams -------------------------------------------------------------------------


class Scripted:
    """Records each request; the test answers it through its :class:`Sent`."""

    def __init__(self) -> None:
        self.sent: dict[str, Sent] = {}

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        sent = Sent()
        self.sent[base_url] = sent
        return sent.deferred


def ask(upstream: Scripted, clock: Clock, *bases: str | None) -> Deferred[list[NodeReply | None]]:
    return ask_all(upstream, clock, 10.0, list(bases), b"GET", b"/api/tags", Fields())


def test_answers_come_in_node_order() -> None:
    """Responders' answers in the order asked; a node with no address is None, unasked."""
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://b", None, "http://a")
    assert sorted(upstream.sent) == ["http://a", "http://b"]
    a, b = FakeResponse(200), FakeResponse(503)
    upstream.sent["http://a"].deferred.callback(a)
    upstream.sent["http://b"].deferred.callback(b)
    a.send(b'{"models":[]}')
    a.end()
    b.end()
    got = result_of(d)
    assert [x.status if x else None for x in got] == [503, None, 200]
    assert got[2].body == b'{"models":[]}'
    assert got[2].headers[b"content-type"] == [b"application/json"]
    assert clock.getDelayedCalls() == []


def test_cancelling_closes_every_exchange_whatever_its_phase() -> None:
    """The client left: the node still dialling has its request cancelled, and the node whose
    headers arrived has its connection closed too (it used to be left open, one per poll)."""
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://dialling", "http://reading", "http://done")
    reading, done = FakeResponse(), FakeResponse()
    upstream.sent["http://reading"].deferred.callback(reading)
    reading.send(b'{"models":[')
    upstream.sent["http://done"].deferred.callback(done)
    done.end()
    d.cancel()
    assert upstream.sent["http://dialling"].cancels == 1
    assert reading.connection.stopped == 1
    assert done.connection.stopped == 0
    assert clock.getDelayedCalls() == []
    result_of(d)  # settled, one way or the other


def test_a_node_that_stalls_after_headers_is_closed_at_its_bound() -> None:
    """Headers, then nothing: at dial timeout + 30 s the node is unavailable and closed, and
    the others' answers still count."""
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://stalls", "http://fine")
    stalls, fine = FakeResponse(), FakeResponse()
    upstream.sent["http://stalls"].deferred.callback(stalls)
    stalls.send(b"{")
    upstream.sent["http://fine"].deferred.callback(fine)
    fine.send(b"{}")
    fine.end()
    clock.advance(10.0 + GRACE - 0.1)
    assert not d.called
    assert stalls.connection.stopped == 0
    clock.advance(0.1)
    assert stalls.connection.stopped == 1
    got = result_of(d)
    assert got[0] is None
    assert got[1] is not None and got[1].body == b"{}"


def test_the_bound_covers_dial_headers_and_body_together() -> None:
    """Headers at 39 s leave the body one second, not another 40."""
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://slow")
    clock.advance(39.0)
    slow = FakeResponse()
    upstream.sent["http://slow"].deferred.callback(slow)
    clock.advance(1.0)
    assert slow.connection.stopped == 1
    assert result_of(d) == [None]


def test_a_node_that_never_answers_has_its_request_cancelled() -> None:
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://silent")
    clock.advance(10.0 + GRACE)
    assert upstream.sent["http://silent"].cancels == 1
    assert result_of(d) == [None]


def test_an_answer_too_large_is_unavailable_and_closed() -> None:
    clock, upstream = Clock(), Scripted()
    d = ask(upstream, clock, "http://huge")
    huge = FakeResponse()
    upstream.sent["http://huge"].deferred.callback(huge)
    huge.send(b"x" * MAX_BODY)
    assert not d.called
    huge.send(b"x")
    assert huge.connection.stopped == 1
    assert result_of(d) == [None]
    assert clock.getDelayedCalls() == []


# -- real upstreams on loopback -----------------------------------------------------------------


class Watched:
    """The real upstream client, noting when each response's headers have arrived."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self.headers = 0
        self._waiting: list[tuple[int, Deferred[None]]] = []

    def request(
        self,
        base_url: str,
        method: bytes,
        uri: bytes,
        headers: Fields,
        body: bytes | None,
        connected: Callable[[], None] | None = None,
        resend: bool = False,
    ) -> Deferred[Answer]:
        def arrived(answer: Answer) -> Answer:
            self.headers += 1
            # Woken on a later turn, once the fan-out has taken the answer and begun its body.
            reactor.callLater(0, self._wake)
            return answer

        return self._upstream.request(base_url, method, uri, headers, body).addCallback(arrived)

    def headers_arrived(self, count: int) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        self._waiting.append((count, d))
        self._wake()
        return d.addTimeout(5.0, reactor)

    def _wake(self) -> None:
        for count, d in list(self._waiting):
            if self.headers >= count:
                self._waiting.remove((count, d))
                d.callback(None)


@pytest.fixture
def stalling() -> Iterator[Callable[..., StallingUpstream]]:
    yield from stalling_upstreams()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    client = Upstream(reactor, 5.0)
    yield client
    pytest_twisted.blockon(client.close())


@pytest_twisted.ensureDeferred
async def test_real_cancel_closes_upstreams_that_already_sent_headers(
    stalling: Callable[..., StallingUpstream], upstream: Upstream
) -> None:
    """The UI's /api/tags poll whose client left: both nodes, each mid-body, see their
    connection closed."""
    one, two = stalling(head=b'{"models":['), stalling(length=None)
    watched = Watched(upstream)
    d = ask_all(watched, Clock(), 5.0, [one.url, two.url], b"GET", b"/api/tags", Fields())
    await watched.headers_arrived(2)
    d.cancel()
    await one.lost_count(1)
    await two.lost_count(1)


@pytest_twisted.ensureDeferred
async def test_real_node_timeout_closes_only_that_upstream(
    stalling: Callable[..., StallingUpstream], upstream: Upstream
) -> None:
    """At a node's bound its stalled exchange is closed; a healthy node's answer is kept."""
    stalled, healthy = stalling(), stalling(body=b'{"models":[]}')
    watched, clock = Watched(upstream), Clock()
    d = ask_all(watched, clock, 5.0, [stalled.url, healthy.url], b"GET", b"/x", Fields())
    await watched.headers_arrived(2)
    clock.advance(5.0 + GRACE)
    await stalled.lost_count(1)
    answers = await d
    assert answers[0] is None
    assert answers[1] is not None and answers[1].body == b'{"models":[]}'
    assert healthy.lost == 0
