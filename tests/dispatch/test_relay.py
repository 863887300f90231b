"""The body relay: first-body gate, splice, backpressure, truncation
(docs/request-path.md#the-commit-point)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure

from nvpair.dispatch.relay import BodyEnd, BodyRelay, First
from nvpair.wire.message import COMPLETE, End, Ended
from tests import fakes

#: How an engine's connection going mid-body ends it.
LOST = Ended(End.CUT, ConnectionLost())


class Upstream:
    """The body's flow, as the relay pauses, resumes and stops it."""

    def __init__(self) -> None:
        self.state = "producing"

    def pause(self) -> None:
        self.state = "paused"

    def resume(self) -> None:
        self.state = "producing"

    def stop(self, abort: bool = False) -> None:
        self.state = "stopped"


class ClientRequest(fakes.ClientRequest):
    """The shared stand-in for a client's request, checked against ProxiedRequest by mypy."""

    @property
    def written(self) -> list[bytes]:
        return self.chunks


def connected() -> tuple[BodyRelay, Upstream]:
    upstream = Upstream()
    return BodyRelay(upstream), upstream


def result(d: Any) -> Any:
    out: list[Any] = []
    d.addBoth(out.append)
    assert out, "not fired"
    return out[0]


def opened(relay: BodyRelay) -> object:
    """What opened the gate, read anew (mypy would keep an earlier reading)."""
    return relay.first


def test_first_byte_opens_the_gate_and_pauses_the_upstream() -> None:
    relay, upstream = connected()
    waiting = relay.gate()
    assert not waiting.called and opened(relay) is None
    relay.data(b"{")
    assert result(waiting) is First.BYTE and opened(relay) is First.BYTE
    assert upstream.state == "paused"


def test_held_bytes_are_spliced_back_in_front() -> None:
    """The client receives the body intact: the gate's byte(s) first, then the rest."""
    relay, _ = connected()
    relay.data(b"ab")
    relay.data(b"c")  # delivered despite the pause
    request = ClientRequest()
    relay.attach(request)
    relay.data(b"de")
    relay.end(COMPLETE)
    assert b"".join(request.written) == b"abcde"
    assert request.finished and request.flow is None
    assert result(relay.done) == BodyEnd(True)


def test_a_whole_body_has_its_end_at_attach_and_one_still_coming_is_waited_for() -> None:
    """A body that ended before the commit: its end has fired once attached, so the wait for
    it does not sleep (docs/performance.md#one-wake-per-answer). A body still coming: the wait
    fires at its end."""
    whole, _ = connected()
    whole.data(b"{}")
    whole.end(COMPLETE)
    request = ClientRequest()
    whole.attach(request)
    assert result(whole.done) == BodyEnd(True) and request.finished
    coming, _ = connected()
    coming.data(b"{")
    coming.attach(ClientRequest())
    assert not coming.done.called
    coming.data(b"}")
    coming.end(COMPLETE)
    assert result(coming.done) == BodyEnd(True)


def test_attach_registers_upstream_as_streaming_producer() -> None:
    """Backpressure: the client's channel pauses the upstream, not this process's memory."""
    relay, upstream = connected()
    relay.data(b"x")
    request = ClientRequest()
    relay.attach(request)
    assert upstream.state == "producing"
    assert request.flow is upstream


def test_eof_without_bytes_commits_as_empty() -> None:
    relay, _ = connected()
    relay.end(COMPLETE)
    # A wait that begins once the gate opened ends at once.
    assert relay.first is First.EMPTY and result(relay.gate()) is First.EMPTY
    request = ClientRequest()
    relay.attach(request)
    assert request.finished and request.written == []


def test_transport_error_before_first_byte_fails_the_gate() -> None:
    relay, _ = connected()
    waiting = relay.gate()
    relay.end(LOST)
    assert isinstance(result(waiting), Failure) and isinstance(relay.first, Failure)
    # A wait that begins after the failure fails at once.
    late, _ = connected()
    late.end(LOST)
    assert isinstance(result(late.gate()), Failure)


def test_cancelling_the_wait_abandons_the_upstream() -> None:
    relay, upstream = connected()
    relay.gate().cancel()
    assert upstream.state == "stopped"
    relay.data(b"late")  # ignored, no AlreadyCalledError
    relay.end(LOST)


def test_truncated_body_closes_the_client_without_finishing() -> None:
    """A node dying mid-copy: the client sees the connection close, not a whole body."""
    relay, _ = connected()
    relay.data(b"x")
    request = ClientRequest()
    relay.attach(request)
    relay.end(LOST)
    assert request.lost and not request.finished
    end = result(relay.done)
    assert end.complete is False and end.reason is not None


def test_client_gone_stops_the_upstream_and_writes_nothing_more() -> None:
    relay, upstream = connected()
    relay.data(b"x")
    request = ClientRequest()
    relay.attach(request)
    relay.client_gone()
    assert upstream.state == "stopped"
    relay.data(b"more")
    relay.end(LOST)
    assert request.written == [b"x"] and not request.finished
    assert result(relay.done).complete is False


@pytest.mark.parametrize("error", [AttributeError, RuntimeError])
def test_finish_after_an_unreported_disconnect_is_tolerated(error: type[Exception]) -> None:
    relay, _ = connected()
    relay.data(b"x")
    request = ClientRequest()

    def boom() -> None:
        raise error("gone")

    request.end = lambda ended: boom()  # type: ignore[method-assign]
    relay.attach(request)
    relay.end(COMPLETE)
    assert result(relay.done).complete is True


def test_every_attribute_of_a_relay_is_a_slot() -> None:
    """One per stream held (docs/performance.md#held-streams): no per-instance dictionary."""
    relay, _ = connected()
    relay.data(b"ab")
    relay.attach(ClientRequest())
    relay.end(COMPLETE)
    # No __dict__ at all: every attribute is one of the class's slots.
    assert not hasattr(relay, "__dict__")
