# -*- test-case-name: tests.wire.client.test_upstream_conn -*-
"""One upstream connection (:mod:`nvpair.wire.client.connection`, with its framing and response
modules), in memory: the request bytes, the response's head and body, and when the connection
may carry another exchange.

Each test drives an :class:`UpstreamConnection` over a ``StringTransport`` byte by byte, so
what happens at a segment boundary is exact. The same behaviours over real sockets, through
:class:`nvpair.wire.client.upstream.Upstream`, are in ``tests/wire/client/test_upstream.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from nvpair.wire.client import framing as upstream_framing
from nvpair.wire.client.body import UpstreamBody
from nvpair.wire.client.connection import UpstreamConnection
from nvpair.wire.client.framing import MAX_HEAD, BadResponse, answer_head, request_head
from nvpair.wire.client.types import Key, Phase
from nvpair.wire.message import Answer, BodySource, End, Ended, Fields, NoAnswer, ResponseHead
from tests.wire.client.test_bodies import failure_of, result_of

# -- request heads (pure) -----------------------------------------------------------------------


def test_a_bodiless_head_is_the_request_line_host_and_the_callers_headers() -> None:
    headers = Fields.of({b"Accept": [b"application/json"], b"X-Multi": [b"a", b"b"]})
    head = request_head(b"GET", b"/v1/models?x=1", b"127.0.0.1:8080", headers, None)
    assert head == (
        b"GET /v1/models?x=1 HTTP/1.1\r\n"
        b"Host: 127.0.0.1:8080\r\n"
        b"Accept: application/json\r\n"
        b"X-Multi: a\r\n"
        b"X-Multi: b\r\n"
        b"\r\n"
    )


def test_a_length_is_sent_as_content_length() -> None:
    head = request_head(b"POST", b"/api/chat", b"h", Fields(), 17)
    assert head == b"POST /api/chat HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n"


def test_a_callers_framing_headers_are_never_sent() -> None:
    """The body is framed by this client; a caller's Content-Length or Transfer-Encoding
    would contradict it (request smuggling)."""
    headers = Fields.of({b"Content-Length": [b"99"], b"Transfer-Encoding": [b"chunked"]})
    head = request_head(b"POST", b"/", b"h", headers, 2)
    assert head.count(b"Content-Length") == 1 and b"Content-Length: 2\r\n" in head
    assert b"Transfer-Encoding" not in head


def test_a_callers_host_is_kept_and_must_be_single() -> None:
    head = request_head(b"GET", b"/", b"ignored", Fields.of({b"Host": [b"engine.lan"]}), None)
    assert head == b"GET / HTTP/1.1\r\nHost: engine.lan\r\n\r\n"
    with pytest.raises(ValueError):
        request_head(b"GET", b"/", b"h", Fields.of({b"Host": [b"a", b"b"]}), None)


@pytest.mark.parametrize("value", [b"a\rb", b"a\nb", b"a\r\nX-Injected: 1", b"a\x00b"])
def test_a_value_with_cr_lf_or_nul_is_refused(value: bytes) -> None:
    headers = Fields()
    # Fields refuses them; a value put in past its methods must still be caught.
    headers[b"X-Bad"] = [value]
    with pytest.raises(ValueError):
        request_head(b"GET", b"/", b"h", headers, None)


def test_a_nul_is_refused_even_through_headers_api() -> None:
    with pytest.raises(ValueError):
        request_head(b"GET", b"/", b"h", Fields.of({b"X": [b"a\x00b"]}), None)


@pytest.mark.parametrize(
    ("method", "target", "host"),
    [
        (b"GE T", b"/", b"h"),
        (b"", b"/", b"h"),
        (b"GET", b"/a b", b"h"),
        (b"GET", b"/a\r\n", b"h"),
        (b"GET", b"", b"h"),
        (b"GET", b"/\x80", b"h"),
        (b"GET", b"/", b"h\r\nX: 1"),
    ],
)
def test_a_malformed_request_line_or_host_is_refused(
    method: bytes, target: bytes, host: bytes
) -> None:
    with pytest.raises(ValueError):
        request_head(method, target, host, Fields(), None)


def test_a_target_found_well_formed_is_remembered_a_bounded_while_and_a_bad_one_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_framing, "_TARGETS", set())
    monkeypatch.setattr(upstream_framing, "_METHODS", set())
    monkeypatch.setattr(upstream_framing, "_MAX_KNOWN", 2)
    for _ in range(2):
        with pytest.raises(ValueError):
            request_head(b"GET", b"/a b", b"h", Fields(), None)
        with pytest.raises(ValueError):
            request_head(b"GE T", b"/", b"h", Fields(), None)
    for target in (b"/1", b"/2", b"/3"):
        request_head(b"GET", target, b"h", Fields(), None)
    assert {b"/3"} == upstream_framing._TARGETS
    assert {b"GET"} == upstream_framing._METHODS


@given(
    st.dictionaries(
        st.from_regex(rb"\A[A-Za-z][A-Za-z0-9-]{0,15}\Z"),
        st.lists(st.binary(max_size=20), min_size=1, max_size=3),
        max_size=6,
    )
)
def test_a_head_is_well_formed_or_refused(fields: dict[bytes, list[bytes]]) -> None:
    """Whatever the values: a head that is built has exactly its own line breaks."""
    headers = Fields()
    for name, values in fields.items():
        headers[name] = values
    try:
        head = request_head(b"GET", b"/", b"h", headers, None)
    except ValueError:
        assert any(any(c in v for c in b"\r\n\x00") for vs in fields.values() for v in vs)
        return
    lines = head.split(b"\r\n")
    assert lines[-2:] == [b"", b""] and b"\n" not in b"".join(lines) and b"\x00" not in head
    sent = [v for vs in fields.values() for v in vs]
    assert len(lines) == 2 + 2 + len(sent)  # request line, Host, fields, blank line


# -- response heads (pure) ---------------------------------------------------------------------


def exposed(fields: list[tuple[bytes, bytes]], head: bool = False) -> Fields:
    return answer_head(fields, head, False, False)[0]


def test_response_headers_lose_what_twisteds_client_removes() -> None:
    fields = [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"20"),
        (b"Connection", b"x-hop, keep-alive"),
        (b"Keep-Alive", b"timeout=5"),
        (b"TE", b"trailers"),
        (b"Trailers", b"x"),
        (b"Upgrade", b"h2c"),
        (b"Proxy-Connection", b"close"),
        (b"X-Hop", b"named by Connection"),
        (b"X-End", b"kept  "),
    ]
    assert dict(exposed(fields)) == {
        b"Content-Type": [b"application/json"],
        b"X-End": [b"kept"],
    }


def test_a_header_named_by_connection_goes_wherever_it_stands() -> None:
    fields = [(b"X-Hop", b"before"), (b"Connection", b"x-hop"), (b"X-Hop", b"after")]
    assert not exposed(fields).has(b"x-hop")


def test_a_head_answer_keeps_its_content_length() -> None:
    fields = exposed([(b"Content-Length", b"20")], head=True)
    assert fields.all_of(b"content-length") == [b"20"]


def test_repeated_response_headers_keep_their_order() -> None:
    fields = exposed([(b"Set-Cookie", b"a=1"), (b"set-cookie", b"b=2")])
    assert fields.all_of(b"set-cookie") == [b"a=1", b"b=2"]


# -- one connection, in memory ------------------------------------------------------------------


#: Where the rig's connection leads, as the hook that sends again names it.
KEY: Key = (b"http", b"h", 80)


class Resend:
    """A request the owner was asked to send again."""

    def __init__(self, key: Key, head: bool, data: bytes, deferred: Deferred[Answer]) -> None:
        self.key, self.head, self.data, self.deferred = key, head, data, deferred
        self.cancelled: list[Deferred[Answer]] = []

    def cancel(self, deferred: Deferred[Answer]) -> None:
        self.cancelled.append(deferred)


class Owner:
    """Whoever made the connection, as it is told: that it can carry another exchange
    (``quiescent``), and that a request went unanswered (the ``unanswered`` hook of a send)."""

    def __init__(self) -> None:
        self.put_back: list[UpstreamConnection] = []
        self.resent: list[Resend] = []

    def resend(
        self, key: Key, head: bool, data: bytes, deferred: Deferred[Answer]
    ) -> Callable[[Deferred[Answer]], None]:
        self.resent.append(again := Resend(key, head, data, deferred))
        return again.cancel

    def quiescent(self, connection: UpstreamConnection) -> None:
        self.put_back.append(connection)


class Writes(StringTransport):
    """Counts ``write`` calls: a request must be one."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


class Reader:
    """A body sink that keeps what it gets, and the source it reads (:func:`read_into`)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.how: Ended | None = None
        self._source: BodySource | None = None

    def data(self, data: bytes) -> None:
        self.chunks.append(data)

    def end(self, ended: Ended) -> None:
        assert self.how is None, "a body ends once"
        self.how = ended

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def ended(self) -> bool:
        return self.how is not None

    def ended_with(self, how: End) -> bool:
        return self.how is not None and self.how.how is how

    @property
    def error(self) -> BaseException | None:
        """The error its end carries."""
        assert self.how is not None
        return self.how.error

    @property
    def source(self) -> BodySource:
        """The body's flow: pause, resume, stop."""
        assert self._source is not None
        return self._source


class Rig:
    def __init__(self) -> None:
        self.owner = Owner()
        self.transport = Writes()
        self.connection = UpstreamConnection(self.owner.quiescent)
        self.connection.makeConnection(self.transport)

    def send(
        self, method: bytes = b"GET", data: bytes | None = None, resend: bool = False
    ) -> Deferred[Answer]:
        d: Deferred[Answer] = Deferred(self.connection.cancel)
        data = data or method + b" / HTTP/1.1\r\nHost: h\r\n\r\n"
        head = method == b"HEAD"
        again = partial(self.owner.resend, KEY, head, data) if resend else None
        self.connection.send(head, data, d, again)
        return d

    def feed(self, *segments: bytes) -> None:
        for segment in segments:
            self.connection.dataReceived(segment)

    def lose(self, reason: BaseException | None = None) -> None:
        self.connection.connectionLost(Failure(reason or ConnectionDone()))

    @property
    def reused(self) -> bool:
        return self.connection in self.owner.put_back

    @property
    def closing(self) -> bool:
        return bool(self.transport.disconnecting)


def result_of_now(d: Deferred[Any]) -> bool:
    """Whether ``d`` has fired."""
    return bool(d.called)


def reason(failure: Failure) -> BaseException | None:
    """Why a request got no answer (what its ``NoAnswer`` carries)."""
    error = failure.value
    assert isinstance(error, NoAnswer), failure
    return error.reason


def read_into(answer: Answer, reader: Reader) -> Reader:
    reader._source = answer.body
    answer.body.connect(reader)
    return reader


def read(answer: Answer) -> Reader:
    return read_into(answer, Reader())


OK_20 = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n"
BODY_20 = b'{"n_ctx":4096,"x":1}'
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_the_request_is_one_write() -> None:
    """Head and body in one ``transport.write``: one write-interest toggle in the reactor."""
    rig = Rig()
    rig.send(b"POST", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
    assert rig.transport.writes == 1
    assert rig.transport.value().endswith(b"\r\n\r\n{}")


def test_the_response_fires_with_the_head_before_the_body() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20[:30])
    assert not d.called
    rig.feed(OK_20[30:])
    answer = result_of(d)
    assert (answer.head.status, answer.head.phrase) == (200, b"OK")
    assert answer.head.length == 20
    assert answer.head.fields.all_of(b"content-type") == [b"application/json"]
    assert not answer.head.fields.has(b"content-length")
    reader = read(answer)
    rig.feed(BODY_20[:5], BODY_20[5:])
    assert reader.chunks == [BODY_20[:5], BODY_20[5:]]
    assert reader.ended_with(End.COMPLETE)
    assert rig.reused and not rig.closing


def test_chunked_bodies_are_decoded_chunk_by_chunk_and_nothing_is_held_back() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(CHUNKED)
    answer = result_of(d)
    assert answer.head.length is None
    reader = read(answer)
    rig.feed(b"5\r\nhel")
    assert reader.body == b"hel"  # what arrived, no more, no less
    rig.feed(b"lo\r\n6\r\n world\r\n")
    assert reader.body == b"hello world" and not reader.ended
    rig.feed(b"0\r\nX-Trailer: dropped\r\n\r\n")
    assert reader.ended_with(End.COMPLETE)
    assert rig.reused


def test_a_body_delimited_by_the_close_ends_at_the_close() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.0 200 OK\r\n\r\nsome")
    answer = result_of(d)
    assert answer.head.length is None
    reader = read(answer)
    rig.feed(b" body")
    rig.lose()
    assert reader.body == b"some body"
    assert reader.ended_with(End.AT_CLOSE)
    assert not rig.reused


def test_a_close_delimited_body_cut_by_a_reset_is_a_failure() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart")
    reader = read(result_of(d))
    rig.lose(ConnectionLost())
    assert reader.ended_with(End.CUT) and isinstance(reader.error, ConnectionLost)


@pytest.mark.parametrize(
    "cut",
    [
        OK_20 + b'{"n_ctx"',  # connection lost mid Content-Length body
        CHUNKED + b"5\r\nhel",  # mid chunk
    ],
)
def test_a_body_cut_short_fails(cut: bytes) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(cut)
    reader = read(result_of(d))
    rig.lose()
    assert reader.ended_with(End.CUT) and isinstance(reader.error, ConnectionDone)
    assert not rig.reused


@pytest.mark.parametrize(
    "bad",
    [
        b"5\r\nhelloX\r\n",  # no CRLF after the chunk
        b"zz\r\n",  # not a size
        b"ffffffffffffffffffff\r\n",  # chunk-size overflow
    ],
)
def test_bad_chunk_framing_fails_the_body_and_closes(bad: bytes) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(CHUNKED)
    reader = read(result_of(d))
    rig.feed(bad)
    assert reader.ended_with(End.BROKEN)
    assert isinstance(reader.error, Exception)
    assert rig.closing and not rig.reused


def test_bytes_before_a_sink_connects_are_held_with_the_upstream_paused() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20[:4])
    answer = result_of(d)
    assert rig.transport.producerState == "paused"
    reader = read(answer)
    assert reader.body == BODY_20[:4]
    assert rig.transport.producerState == "producing"
    rig.feed(BODY_20[4:])
    assert reader.body == BODY_20 and reader.ended_with(End.COMPLETE)


def test_a_body_that_ended_before_a_sink_connects_is_delivered_whole_then_ended() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20)
    answer = result_of(d)
    # Ended within the read that brought the head: the connection is back, never paused.
    assert rig.reused and rig.transport.producerState == "producing"
    reader = read(answer)
    assert reader.body == BODY_20
    assert reader.ended_with(End.COMPLETE)


def test_connecting_twice_or_after_the_end_raises() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    answer = result_of(d)
    read(answer)
    with pytest.raises(RuntimeError):
        answer.body.connect(Reader())
    rig.feed(BODY_20)
    with pytest.raises(RuntimeError):
        answer.body.connect(Reader())


def test_pause_and_resume_stop_and_start_reading_the_upstream() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(CHUNKED)
    reader = read(result_of(d))
    reader.source.pause()
    assert rig.transport.producerState == "paused"
    reader.source.resume()
    assert rig.transport.producerState == "producing"


def test_a_pause_inside_a_read_that_ends_the_body_toggles_nothing() -> None:
    """The relay pauses on its first byte; when that byte's read also ends the body, the
    connection goes back to the pool without a pause/resume pair (two epoll calls)."""

    class Pausing(Reader):
        def data(self, data: bytes) -> None:
            super().data(data)
            self.source.pause()

    states: list[str] = []
    rig = Rig()
    real_pause = rig.transport.pauseProducing

    def pause() -> None:
        states.append("paused")
        real_pause()

    rig.transport.pauseProducing = pause  # type: ignore[method-assign]
    reader = Pausing()
    # As the attempt does: the body is connected as soon as the head fires.
    rig.send().addCallback(lambda answer: read_into(answer, reader))
    rig.feed(OK_20)
    rig.feed(BODY_20)
    assert reader.body == BODY_20 and states == [] and rig.reused


def test_a_pause_inside_a_read_is_applied_after_it() -> None:
    class Pausing(Reader):
        def data(self, data: bytes) -> None:
            super().data(data)
            self.source.pause()

    rig = Rig()
    d = rig.send()
    rig.feed(CHUNKED)
    reader = read_into(result_of(d), Pausing())
    rig.feed(b"2\r\nab\r\n2\r\ncd\r\n")
    # The whole read is delivered (as Twisted does), then the upstream is paused.
    assert reader.body == b"abcd" and rig.transport.producerState == "paused"


def test_stop_closes_and_the_connection_is_never_reused() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(CHUNKED + b"2\r\nab\r\n")
    reader = read(result_of(d))
    reader.source.stop()
    assert rig.closing
    assert not reader.ended  # the body ends when the connection has gone
    rig.lose()
    assert reader.ended_with(End.CUT)
    assert not rig.reused


def test_a_stop_during_a_read_that_completes_the_body_still_closes() -> None:
    """The soak client's drop: its reader stops on the first bytes of a body that arrived
    whole; the pool must not take the connection back."""

    class Dropping(Reader):
        def data(self, data: bytes) -> None:
            super().data(data)
            self.source.stop()

    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    read_into(result_of(d), Dropping())
    rig.feed(BODY_20)
    assert rig.closing and not rig.reused


def test_a_late_stop_after_the_body_ended_does_not_touch_the_pooled_connection() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20)
    reader = read(result_of(d))
    assert rig.reused
    reader.source.stop()
    reader.source.pause()
    assert not rig.closing and rig.transport.producerState == "producing"


@pytest.mark.parametrize(
    "segments",
    [
        (b"HTTP/1.1 100 Continue\r\n\r\n" + OK_20,),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n", OK_20),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\n\r\n", OK_20),
    ],
)
def test_informational_answers_are_skipped(segments: tuple[bytes, ...]) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(*segments)
    answer = result_of(d)
    assert answer.head.status == 200 and not answer.head.fields.has(b"link")


def test_switching_protocols_is_not_supported() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
    )
    failure = failure_of(d, NoAnswer)
    assert isinstance(reason(failure), BadResponse)
    assert rig.closing


@pytest.mark.parametrize(
    "garbage",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/1.1 600 High\r\n\r\n",
        b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
    ],
)
def test_a_malformed_head_is_never_received(garbage: bytes) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(garbage)
    failure_of(d, NoAnswer)
    assert rig.closing and not rig.reused


def test_one_header_over_the_head_cap_is_refused() -> None:
    rig = Rig()
    d = rig.send()
    value = b"x" * (MAX_HEAD + 1)
    rig.feed(b"HTTP/1.1 200 OK\r\nX-Big: " + value[:40000], value[40000:] + b"\r\n\r\n")
    failure = failure_of(d, NoAnswer)
    assert isinstance(reason(failure), BadResponse)


def test_a_head_that_never_ends_is_cut_at_the_cap() -> None:
    """Many small headers, one read at a time: refused once the cap is passed, not at the end
    of a head that may never come."""
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.1 200 OK\r\n")
    line = b"X-Filler: " + b"y" * 90 + b"\r\n"
    for _ in range(MAX_HEAD // len(line) + 1):
        rig.feed(line)
    failure_of(d, NoAnswer)


def test_whitespace_after_a_value_cannot_grow_the_head_past_the_cap() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.1 200 OK\r\nX: ")
    for _ in range(MAX_HEAD // 8192 + 1):
        rig.feed(b" " * 8192)
    failure_of(d, NoAnswer)


def interim_then_final(total: int) -> bytes:
    """Ten interim answers (long reason phrases and fields), then a final head, ``total``
    bytes of head in all, then a 5-byte body."""
    interim = b"HTTP/1.1 103 " + b"E" * 3000 + b"\r\nLink: </" + b"a" * 2000 + b">\r\n\r\n"
    heads = interim * 10 + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Fill: "
    end = b"\r\n\r\n"
    return heads + b"f" * (total - len(heads) - len(end)) + end + b"hello"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def head_cap_verdict(segments: list[bytes]) -> bool:
    """Whether the answer in ``segments`` was taken (else refused at the head cap)."""
    rig = Rig()
    d = rig.send()
    rig.feed(*segments)
    got = result_of(d)
    if isinstance(got, Failure):
        assert got.check(NoAnswer) and isinstance(reason(got), BadResponse)
        assert rig.closing
        return False
    assert read(got).body == b"hello"
    return True


@given(st.lists(st.integers(1, MAX_HEAD + 5), max_size=6))
def test_the_head_cap_counts_interim_answers_wherever_the_reads_split(cuts: list[int]) -> None:
    """64 KiB counts the status lines and fields of 1xx answers with the final head, in one
    read, in many, or with the final head in the read that brought the 1xx answers."""
    assert head_cap_verdict(split(interim_then_final(MAX_HEAD), cuts))
    assert not head_cap_verdict(split(interim_then_final(MAX_HEAD + 1), cuts))


@pytest.mark.parametrize("total", [MAX_HEAD, MAX_HEAD + 1])
def test_the_head_cap_holds_byte_by_byte(total: int) -> None:
    data = interim_then_final(total)
    taken = head_cap_verdict([data[i : i + 1] for i in range(len(data))])
    assert taken is (total == MAX_HEAD)


def test_lost_before_the_head_is_never_received() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20[:10])
    rig.lose(ConnectionLost())
    failure = failure_of(d, NoAnswer)
    assert isinstance(reason(failure), ConnectionLost)


def test_cancelling_before_the_head_aborts_the_connection() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20[:10])
    d.cancel()
    failure_of(d, CancelledError)
    assert rig.transport.disconnected  # StringTransport's mark of abortConnection
    rig.lose()
    rig.feed(b"late bytes")  # ignored: nothing waits for them
    assert not rig.reused


def test_cancelling_after_the_head_changes_nothing() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    d.cancel()
    assert result_of(d).head.status == 200 and not rig.closing


def test_a_head_answer_has_no_body_whatever_its_headers_say() -> None:
    rig = Rig()
    d = rig.send(b"HEAD")
    rig.feed(OK_20)
    answer = result_of(d)
    assert answer.head.length == 0
    assert answer.head.fields.all_of(b"content-length") == [b"20"]
    reader = read(answer)
    assert reader.body == b"" and reader.ended_with(End.COMPLETE)
    assert rig.reused


def test_a_head_answer_followed_by_a_body_is_not_reused() -> None:
    rig = Rig()
    d = rig.send(b"HEAD")
    rig.feed(OK_20 + BODY_20)
    assert result_of(d).head.status == 200
    assert rig.closing and not rig.reused


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
def test_204_and_304_have_no_body(status: bytes) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\n\r\n")
    answer = result_of(d)
    assert answer.head.length == 0 and not answer.head.fields.has(b"content-length")
    assert read(answer).body == b"" and rig.reused


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
def test_204_and_304_to_a_head_have_no_content_length_either(status: bytes) -> None:
    """Only a HEAD answer that would have a body keeps its Content-Length (RFC 9110 §8.6)."""
    rig = Rig()
    d = rig.send(b"HEAD")
    rig.feed(b"HTTP/1.1 " + status + b"\r\nContent-Length: 5\r\n\r\n")
    answer = result_of(d)
    assert answer.head.length == 0 and not answer.head.fields.has(b"content-length")
    assert read(answer).body == b"" and rig.reused


def test_a_204_with_a_body_is_not_reused() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(b"HTTP/1.1 204 No Content\r\n\r\nhello")
    reader = read(result_of(d))
    assert reader.body == b"" and reader.ended_with(End.COMPLETE)
    assert rig.closing and not rig.reused


def test_two_responses_in_one_read_deliver_the_first_and_close() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20 + OK_20 + BODY_20)
    reader = read(result_of(d))
    assert reader.body == BODY_20
    assert reader.ended_with(End.COMPLETE)
    assert rig.closing and not rig.reused


def test_a_stray_crlf_after_a_body_is_tolerated() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20 + b"\r\n")
    assert read(result_of(d)).body == BODY_20 and rig.reused


@pytest.mark.parametrize(
    ("head", "reused"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        # RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 is faulty framing, read but never reused.
        (
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\n",
            False,
        ),
    ],
)
def test_keep_alive_follows_the_version_and_connection(head: bytes, reused: bool) -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(head)
    read(result_of(d))
    assert rig.reused is reused and rig.closing is not reused


def test_bytes_on_an_idle_connection_close_it() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20)
    read(result_of(d))
    assert rig.reused
    rig.feed(b"HTTP/1.1 200 OK\r\n")
    assert rig.closing
    assert rig.connection.phase is Phase.CLOSING and not rig.connection.ready()


def test_an_idle_connection_the_server_closes_is_dropped() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20 + BODY_20)
    read(result_of(d))
    rig.lose()
    assert rig.connection.phase is Phase.CLOSED and not rig.connection.ready()


def test_a_dead_pooled_connection_fails_the_next_request_as_never_received() -> None:
    rig = Rig()
    first = rig.send()
    rig.feed(OK_20 + BODY_20)
    read(result_of(first))
    second = rig.send()
    rig.lose(ConnectionLost())
    failure_of(second, NoAnswer)


@pytest.mark.parametrize("reason", [ConnectionDone(), ConnectionLost()])
def test_a_resendable_request_lost_before_any_byte_goes_to_the_owner(
    reason: BaseException,
) -> None:
    """Closed or reset before any byte of the answer: the owner sends the very bytes again
    and fires the same Deferred; the request's caller sees nothing yet."""
    rig = Rig()
    request = b"POST /api/chat HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}"
    d = rig.send(b"POST", request, resend=True)
    rig.lose(reason)
    [again] = rig.owner.resent
    assert (again.data, again.deferred, again.head) == (request, d, False)
    assert not d.called


def test_cancelling_a_resent_request_cancels_it_where_it_went() -> None:
    rig = Rig()
    d = rig.send(resend=True)
    rig.lose()
    d.cancel()
    assert rig.owner.resent[0].cancelled == [d]
    failure_of(d, CancelledError)


@pytest.mark.parametrize("arrived", [b"H", b"HTTP/1.1 200 OK\r\n"])
def test_a_request_whose_answer_had_begun_is_never_resent(arrived: bytes) -> None:
    rig = Rig()
    d = rig.send(resend=True)
    rig.feed(arrived)
    rig.lose(ConnectionLost())
    failure_of(d, NoAnswer)
    assert rig.owner.resent == []


def test_a_request_not_marked_resendable_fails_when_lost() -> None:
    rig = Rig()
    d = rig.send(b"POST")
    rig.lose()
    failure_of(d, NoAnswer)
    assert rig.owner.resent == []


def test_a_cancelled_request_is_never_resent() -> None:
    rig = Rig()
    d = rig.send(resend=True)
    d.cancel()
    rig.lose()
    failure_of(d, CancelledError)
    assert rig.owner.resent == []


def test_an_exchange_after_another_starts_clean() -> None:
    """A HEAD answer leaves llhttp expecting a body; the next exchange must not inherit it."""
    rig = Rig()
    first = rig.send(b"HEAD")
    rig.feed(OK_20)
    read(result_of(first))
    second = rig.send()
    rig.feed(OK_20 + BODY_20)
    assert read(result_of(second)).body == BODY_20
    assert rig.owner.put_back == [rig.connection, rig.connection]


def test_a_reader_that_raises_ends_the_exchange() -> None:
    class Broken(Reader):
        def data(self, data: bytes) -> None:
            raise ValueError("reader bug")

    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    reader = read_into(result_of(d), Broken())
    rig.feed(BODY_20)
    assert reader.ended_with(End.BROKEN) and isinstance(reader.error, ValueError)
    assert rig.closing and not rig.reused


def test_the_phase_follows_each_exchange() -> None:
    """One named phase says where the connection is, read after every step: waiting for a
    head (through a 1xx), reading a body, kept by its pool, closing, gone."""
    rig = Rig()
    connection = rig.connection
    seen = [connection.phase]
    d = rig.send()
    seen.append(connection.phase)
    rig.feed(b"HTTP/1.1 100 Continue\r\n\r\n")
    seen.append(connection.phase)
    rig.feed(OK_20)
    seen.append(connection.phase)
    reader = read(result_of(d))
    rig.feed(BODY_20)
    seen.append(connection.phase)
    assert connection.ready()
    seen.append(connection.phase)
    rig.send()
    rig.lose()
    seen.append(connection.phase)
    assert reader.ended_with(End.COMPLETE)
    assert seen == [
        Phase.READY,
        Phase.WAITING_HEAD,
        Phase.WAITING_HEAD,
        Phase.READING_BODY,
        Phase.READY,
        Phase.READY,
        Phase.CLOSED,
    ]


def test_a_stopped_reader_leaves_the_connection_closing() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    read(result_of(d)).source.stop()
    assert rig.connection.phase is Phase.CLOSING and rig.closing
    assert not rig.connection.ready()


def test_close_waits_for_the_connection_to_go() -> None:
    rig = Rig()
    closed = rig.connection.close()
    assert rig.closing and not result_of_now(closed)
    rig.lose()
    assert result_of_now(closed)
    assert result_of_now(rig.connection.close())


def test_the_answer_is_a_head_and_the_connections_body() -> None:
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    answer = result_of(d)
    assert isinstance(answer, Answer) and isinstance(answer.head, ResponseHead)
    assert isinstance(answer.body, UpstreamBody)


def test_every_attribute_of_a_connection_and_its_response_is_a_slot() -> None:
    """Thousands are held at once (docs/performance.md#held-streams): an attribute set outside
    ``__slots__`` brings back the per-instance dictionary, about 1.5 KB each."""
    rig = Rig()
    d = rig.send()
    rig.feed(OK_20)
    answer = result_of(d)
    read(answer)
    rig.feed(BODY_20)
    assert rig.reused and vars(rig.connection) == {}
    assert not hasattr(answer, "__dict__")
    assert not hasattr(answer.head, "__dict__") and not hasattr(answer.body, "__dict__")
