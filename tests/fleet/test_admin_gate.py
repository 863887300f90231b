"""The admin listener's callers judged by the fleet's gate, on a Clock: loopback as ever, the
LAN with an admin key, the facades' failed-key throttle shared, ``[admin]`` and keys re-read at
SIGHUP (docs/lan.md#the-admin-view-from-the-lan)."""

from __future__ import annotations

import base64

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock

from nvpair.common.reasons import Reason
from nvpair.fleet.adminconfig import AdminLan
from nvpair.fleet.lanconfig import Access, Key, LanTls, digest_of
from nvpair.fleet.langate import (
    ADMIN_CLOSED,
    ADMIN_NOT_LISTED,
    ADMIN_UNAUTHORIZED,
    TLS_REQUIRED,
    UNAUTHORIZED,
    LanGate,
)
from nvpair.wire.server.head import Refusal
from tests.certs import issue, make_ca
from tests.fleet.test_langate import AWAY, HOME, LAN, LAPTOP, LOOPBACK, headers

SCRAPER = Key("scraper", digest_of(b"nvp_scraper"), admin=True)
KEYED = Access(LAN, (LAPTOP, SCRAPER))
ADMIN = AdminLan("192.168.1.10")


def ask(
    gate: LanGate,
    authorization: bytes | None,
    peer: IPv4Address | IPv6Address = HOME,
    path: bytes = b"/metrics",
    tls: bool = False,
) -> Refusal | None:
    return gate.admin_refusal(peer, b"GET", path, headers(authorization), tls)


def test_loopback_callers_are_served_as_ever_with_or_without_admin() -> None:
    for gate in (LanGate(Clock(), None), LanGate(Clock(), KEYED), LanGate(Clock(), KEYED, ADMIN)):
        assert ask(gate, None, LOOPBACK, b"/status") is None
        assert ask(gate, b"Bearer nvp_wrong", LOOPBACK) is None


def test_a_lan_caller_needs_an_admin_key_and_is_asked_for_it_as_basic() -> None:
    gate = LanGate(Clock(), KEYED, ADMIN)
    assert ask(gate, None) == ADMIN_UNAUTHORIZED
    assert ADMIN_UNAUTHORIZED.reason is Reason.UNAUTHORIZED
    assert ADMIN_UNAUTHORIZED.headers == ((b"WWW-Authenticate", b'Basic realm="nvpair"'),)
    assert ask(gate, b"Bearer nvp_laptop") == ADMIN_UNAUTHORIZED
    assert ask(gate, b"Bearer nvp_scraper") is None
    assert ask(gate, b"Basic " + base64.b64encode(b"me:nvp_scraper")) is None
    assert ask(gate, None, path=b"/healthz") is None
    assert ask(gate, b"Bearer nvp_scraper", AWAY) == ADMIN_NOT_LISTED


def test_without_admin_the_lan_is_refused_whatever_it_presents() -> None:
    gate = LanGate(Clock(), KEYED)
    assert ask(gate, b"Bearer nvp_scraper") == ADMIN_CLOSED
    assert ask(gate, None, path=b"/healthz") == ADMIN_CLOSED
    assert ADMIN_CLOSED.reason is Reason.FORBIDDEN


def close(gate: LanGate, clock: Clock, on_admin: bool) -> None:
    for _ in range(10):
        if on_admin:
            assert ask(gate, b"Bearer nvp_guess") == ADMIN_UNAUTHORIZED
        else:
            assert gate.refusal(HOME, headers(b"Bearer nvp_guess")) == UNAUTHORIZED
        clock.advance(1)


def test_guesses_on_the_admin_listener_close_the_facades_too_and_reopen() -> None:
    clock = Clock()
    gate = LanGate(clock, KEYED, ADMIN)
    close(gate, clock, on_admin=True)
    throttled = ask(gate, b"Bearer nvp_scraper")
    assert throttled is not None and throttled.reason is Reason.TOO_MANY_AUTH_FAILURES
    assert throttled.headers == ((b"Retry-After", b"50"),)
    facade = gate.refusal(HOME, headers(b"Bearer nvp_laptop"))
    assert facade is not None and facade.reason is Reason.TOO_MANY_AUTH_FAILURES
    # /healthz asks for no key: nothing to throttle.
    assert ask(gate, None, path=b"/healthz") is None
    clock.advance(50)
    assert ask(gate, b"Bearer nvp_scraper") is None


def test_guesses_on_a_facade_close_the_admin_listener_too() -> None:
    clock = Clock()
    gate = LanGate(clock, KEYED, ADMIN)
    close(gate, clock, on_admin=False)
    throttled = ask(gate, b"Bearer nvp_scraper")
    assert throttled is not None and throttled.reason is Reason.TOO_MANY_AUTH_FAILURES


def test_a_valid_key_without_admin_and_no_key_at_all_are_never_counted() -> None:
    clock = Clock()
    gate = LanGate(clock, KEYED, ADMIN)
    for _ in range(20):
        assert ask(gate, b"Bearer nvp_laptop") == ADMIN_UNAUTHORIZED
        assert ask(gate, None) == ADMIN_UNAUTHORIZED
    assert ask(gate, b"Bearer nvp_scraper") is None


def test_over_plaintext_where_tls_is_served_the_lan_gets_403_and_its_key_is_not_counted() -> None:
    server = issue(make_ca(), ["gpu.lan"])
    tls = LanTls(server.cert_pem, server.key_pem)
    # require-tls = false changes nothing here: an admin key never crosses in clear.
    gate = LanGate(Clock(), Access(LAN, (SCRAPER,), tls, require_tls=False), ADMIN)
    assert gate.tls is not None
    for _ in range(20):
        assert ask(gate, b"Bearer nvp_guess") == TLS_REQUIRED
    assert ask(gate, b"Bearer nvp_scraper", tls=True) is None
    assert ask(gate, b"Bearer nvp_scraper", LOOPBACK) is None
    assert ask(gate, None, path=b"/healthz") is None


def test_a_reload_re_reads_the_keys_and_a_removed_admin_closes_the_lan_at_once() -> None:
    gate = LanGate(Clock(), KEYED, ADMIN)
    assert ask(gate, b"Bearer nvp_scraper") is None
    demoted = Key("scraper", digest_of(b"nvp_scraper"))
    promoted = Key("laptop", digest_of(b"nvp_laptop"), admin=True)
    gate.reload(Access(LAN, (promoted, demoted)), ADMIN)
    assert ask(gate, b"Bearer nvp_scraper") == ADMIN_UNAUTHORIZED
    assert ask(gate, b"Bearer nvp_laptop") is None
    gate.reload(Access(LAN, (promoted,)), None)
    assert ask(gate, b"Bearer nvp_laptop") == ADMIN_CLOSED
    assert ask(gate, None, LOOPBACK) is None
