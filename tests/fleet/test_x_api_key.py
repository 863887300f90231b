"""A facade caller's key in ``X-Api-Key``, the field Anthropic clients send it in, when the
request has no ``Authorization`` (issue 32; docs/lan.md#x-api-key): read as llama-server reads
it, judged and throttled as a Bearer key, never sent on to an engine where ``[access]`` is in
force nor beside a node's credential; the admin listener does not read it."""

from __future__ import annotations

import json

import pytest
from twisted.internet.task import Clock

from nvpair.common.reasons import Reason
from nvpair.engines.caller import KEYLESS, Caller, Priority
from nvpair.engines.table import LLAMACPP
from nvpair.fleet.adminconfig import AdminLan
from nvpair.fleet.lanconfig import Access, Key, digest_of
from nvpair.fleet.langate import ADMIN_UNAUTHORIZED, UNAUTHORIZED, LanGate
from nvpair.fleet.lanpolicy import Verdict, api_key, caller_of, judge, loopback_caller, presented
from nvpair.wire.client.framing import request_head
from nvpair.wire.message import Fields
from tests.fleet.test_facade_lan import _outgoing_headers, exchange, gate, request
from tests.fleet.test_langate import HOME, LAN, LAPTOP, LOOPBACK
from tests.fleet.test_lanpolicy import ip
from tests.test_facade_http import Broken, split

KEYED = Access(LAN, (LAPTOP,))
ALICE = Key("alice", digest_of(b"nvp_alice"), ("qwen*",), priority=Priority.LOW)


def fields(authorization: bytes | None = None, *x_api_key: bytes) -> Fields:
    found = Fields()
    if authorization is not None:
        found.put(b"authorization", authorization)
    for key in x_api_key:
        found.add(b"x-api-key", key)
    return found


# -- which secret a request presents (pure) --------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "secret"),
    [
        ([b"nvp_x"], b"nvp_x"),
        ([b"  nvp_x  "], b"nvp_x"),
        # Whole: no scheme is taken off, so this is no key of the file's (--new-key's start nvp_).
        ([b"Bearer nvp_x"], b"Bearer nvp_x"),
        (None, None),
        ([], None),
        ([b""], None),
        ([b"   "], None),
        ([b"nvp_x", b"nvp_x"], None),
    ],
)
def test_x_api_key_is_exactly_one_field_not_empty_taken_whole(
    values: list[bytes] | None, secret: bytes | None
) -> None:
    assert api_key(values) == secret


def test_authorization_rules_when_there_is_one_x_api_key_is_read_only_without() -> None:
    assert presented(None, [b"nvp_x"]) == b"nvp_x"
    assert presented([b"Bearer nvp_a"], [b"nvp_x"]) == b"nvp_a"
    # A field that presents no Bearer secret still rules: llama-server reads X-Api-Key only
    # when Authorization is absent.
    assert presented([b"Basic eA=="], [b"nvp_x"]) is None
    assert presented(None, None) is None


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "verdict"),
    [
        (None, [b"nvp_laptop"], Verdict.ALLOWED),
        (None, [b"nvp_wrong"], Verdict.BAD_KEY),
        (None, [b""], Verdict.BAD_KEY),
        (None, [b"nvp_laptop", b"nvp_laptop"], Verdict.BAD_KEY),
        ([b"Bearer nvp_wrong"], [b"nvp_laptop"], Verdict.BAD_KEY),
        ([b"Bearer nvp_laptop"], [b"nvp_wrong"], Verdict.ALLOWED),
        (None, None, Verdict.NO_KEY),
    ],
)
def test_judge_reads_x_api_key_as_a_bearer_key(
    authorization: list[bytes] | None, x_api_key: list[bytes] | None, verdict: Verdict
) -> None:
    found = judge(KEYED, ip("192.168.1.7"), authorization, x_api_key=x_api_key)
    assert found == (verdict, LAPTOP if verdict is Verdict.ALLOWED else None)
    # The same for a loopback caller that loopback-keys asks for a key.
    shared = Access((), (LAPTOP,), loopback_keys=True)
    assert judge(shared, None, authorization, loopback=True, x_api_key=x_api_key) == found
    # Outside the networks no key helps.
    away = judge(KEYED, ip("10.0.0.7"), authorization, x_api_key=x_api_key)
    assert away == (Verdict.FORBIDDEN, None)


def test_a_preflight_that_carries_an_x_api_key_is_judged_on_it() -> None:
    """A browser's preflight carries no credentials: one without a key is let in keyless, one
    with a key in either field is judged on it, as with Authorization."""
    assert judge(KEYED, ip("192.168.1.7"), None, preflight=True) == (Verdict.ALLOWED, None)
    assert judge(KEYED, ip("192.168.1.7"), None, True, x_api_key=[b"nvp_wrong"]) == (
        Verdict.BAD_KEY,
        None,
    )


def test_a_loopback_caller_without_loopback_keys_is_its_x_api_key_s() -> None:
    access = Access(LAN, (ALICE,))
    assert loopback_caller(access, None, [b"nvp_alice"]) == Caller(
        "alice", ("qwen*",), priority=Priority.LOW
    )
    assert loopback_caller(access, None, [b"nvp_wrong"]) == KEYLESS
    assert loopback_caller(access, [b"Bearer nvp_wrong"], [b"nvp_alice"]) == KEYLESS


# -- the gate: the same 401, the same throttle ----------------------------------------------------


def test_the_gate_admits_an_x_api_key_and_refuses_a_wrong_one_with_the_same_401() -> None:
    lan = LanGate(Clock(), KEYED)
    assert lan.refusal(HOME, fields(None, b"nvp_laptop")) is None
    assert lan.caller(HOME, fields(None, b"nvp_laptop")) == caller_of(LAPTOP)
    assert lan.refusal(HOME, fields(None, b"nvp_wrong")) == UNAUTHORIZED
    assert lan.caller(HOME, fields(None, b"nvp_wrong")) == UNAUTHORIZED
    assert lan.refusal(HOME, fields(b"Bearer nvp_wrong", b"nvp_laptop")) == UNAUTHORIZED
    assert UNAUTHORIZED.headers == ((b"WWW-Authenticate", b'Bearer realm="nvpair"'),)
    shared = LanGate(Clock(), Access((), (ALICE,), loopback_keys=True))
    assert shared.refusal(LOOPBACK, fields(None, b"nvp_wrong")) == UNAUTHORIZED
    assert shared.refusal(LOOPBACK, fields(None, b"nvp_alice")) is None
    assert shared.caller(LOOPBACK, fields(None, b"nvp_alice")) == Caller(
        "alice", ("qwen*",), manage=False, priority=Priority.LOW
    )


def test_failed_x_api_keys_count_toward_the_same_throttle_as_bearer_keys() -> None:
    clock = Clock()
    lan = LanGate(clock, KEYED)
    for index in range(10):
        wrong = fields(None, b"nvp_guess") if index % 2 else fields(b"Bearer nvp_guess")
        assert lan.refusal(HOME, wrong) == UNAUTHORIZED
    throttled = lan.refusal(HOME, fields(None, b"nvp_laptop"))
    assert throttled is not None and throttled.reason is Reason.TOO_MANY_AUTH_FAILURES
    clock.advance(61)
    assert lan.refusal(HOME, fields(None, b"nvp_laptop")) is None


def test_the_admin_listener_reads_no_x_api_key() -> None:
    """Its keys come as Authorization only, Bearer or Basic
    (docs/lan.md#the-admin-view-from-the-lan)."""
    scraper = Key("scraper", digest_of(b"nvp_scraper"), admin=True)
    lan = LanGate(Clock(), Access(LAN, (scraper,)), AdminLan("192.168.1.10"))
    admin = fields(None, b"nvp_scraper")
    assert lan.admin_refusal(HOME, b"GET", b"/metrics", admin, False) == ADMIN_UNAUTHORIZED
    bearer = fields(b"Bearer nvp_scraper")
    assert lan.admin_refusal(HOME, b"GET", b"/metrics", bearer, False) is None


# -- through a facade, over an in-memory connection ------------------------------------------------


def test_a_facade_serves_an_anthropic_clients_key_and_refuses_a_wrong_one() -> None:
    body = json.dumps({"model": "tiny", "max_tokens": 4, "messages": []}).encode()
    sent = ("anthropic-version: 2023-06-01", "content-type: application/json")
    handler = Broken()
    good = request("POST", "/v1/messages", "x-api-key: nvp_laptop", *sent, body=body)
    status, _, _ = split(exchange(LLAMACPP, good, gate(), HOME, handler))
    assert status == "HTTP/1.1 200 OK"
    assert [a.caller for a in handler.seen] == [caller_of(LAPTOP)]
    wrong = request("POST", "/v1/messages", "x-api-key: nvp_wrong", *sent, body=body)
    status, headers, _ = split(exchange(LLAMACPP, wrong, gate(), HOME, handler))
    assert status == "HTTP/1.1 401 Unauthorized"
    assert headers["www-authenticate"] == 'Bearer realm="nvpair"'
    assert headers["x-nvpair-error"] == "unauthorized"
    assert len(handler.seen) == 1


# -- what an engine is sent -----------------------------------------------------------------------


def test_the_callers_x_api_key_is_never_forwarded_where_access_is_in_force() -> None:
    """Whether a key was asked of the caller or not (docs/lan.md#keys); without [access] it goes
    on as Authorization does: the proxy judged nothing, and it may be the engine's own key."""
    for caller in (caller_of(LAPTOP), KEYLESS):
        sent = _outgoing_headers(caller, x_api_key=b"nvp_laptop")
        assert not sent.has(b"x-api-key") and sent.has(b"x-client")
    assert _outgoing_headers(None, x_api_key=b"k").all_of(b"x-api-key") == [b"k"]


def test_a_nodes_credential_leaves_no_caller_key_in_either_field() -> None:
    """The engine sees the node's key alone (docs/fleet-scheduling.md#node-credentials)."""
    headers = Fields.of({b"X-Api-Key": [b"caller-key"], b"x-keep": [b"1"]})
    head = request_head(b"POST", b"/v1/messages", b"h", headers, 2, b"Bearer node")
    assert b"caller-key" not in head and b"x-api-key" not in head.lower()
    assert b"\r\nAuthorization: Bearer node\r\n" in head and b"\r\nX-Keep: 1\r\n" in head
    plain = request_head(b"POST", b"/v1/messages", b"h", headers, 2)
    assert b"\r\nX-Api-Key: caller-key\r\n" in plain
