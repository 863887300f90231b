"""The ``[access]`` in force, asked at a request's head and at its admission (docs/lan.md)."""

from __future__ import annotations

import ipaddress

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock

from nvpair.common.reasons import Reason
from nvpair.engines.caller import KEYLESS
from nvpair.fleet.lanconfig import Access, Key, LanTls, digest_of
from nvpair.fleet.langate import LOOPBACK_ONLY, NOT_LISTED, TLS_REQUIRED, UNAUTHORIZED, LanGate
from nvpair.fleet.lanpolicy import LAN_KEYLESS, caller_of
from nvpair.wire.message import Fields
from nvpair.wire.server.site import Refusal
from tests.certs import issue, make_ca

LAN = (ipaddress.ip_network("192.168.1.0/24"),)
LAPTOP = Key("laptop", digest_of(b"nvp_laptop"))
KEYED = Access(LAN, (LAPTOP,))
LOOPBACK = IPv4Address("TCP", "127.0.0.1", 50000)
HOME = IPv6Address("TCP", "::ffff:192.168.1.7", 50000)  # a dual-stack listener's view
AWAY = IPv4Address("TCP", "10.0.0.7", 50000)


def headers(authorization: bytes | None = None) -> Fields:
    """A head's fields, with ``authorization`` if given."""
    found = Fields()
    if authorization is not None:
        found.put(b"authorization", authorization)
    return found


def test_without_access_only_loopback_is_served_and_nothing_is_recorded() -> None:
    gate = LanGate(Clock(), None)
    assert gate.refusal(HOME, headers()) == LOOPBACK_ONLY == Refusal(Reason.FORBIDDEN)
    assert gate.caller(LOOPBACK, headers(b"Bearer nvp_laptop")) is None
    assert gate.tls is None


def test_a_listed_caller_needs_a_valid_key() -> None:
    gate = LanGate(Clock(), KEYED)
    assert gate.refusal(AWAY, headers(b"Bearer nvp_laptop")) == NOT_LISTED
    assert gate.refusal(HOME, headers()) == UNAUTHORIZED
    assert UNAUTHORIZED.headers == ((b"WWW-Authenticate", b'Bearer realm="nvpair"'),)
    assert gate.refusal(HOME, headers(b"Bearer nvp_wrong")) == UNAUTHORIZED
    assert gate.refusal(HOME, headers(b"Bearer nvp_laptop")) is None
    assert gate.caller(HOME, headers(b"Bearer nvp_laptop")) == caller_of(LAPTOP)
    assert gate.caller(LOOPBACK, headers()) == KEYLESS


def test_ten_failed_keys_close_the_address_valid_key_or_not_then_it_reopens() -> None:
    clock = Clock()
    gate = LanGate(clock, KEYED)
    for _ in range(10):
        # Presenting no key at all is not guessing one: never counted.
        assert gate.refusal(HOME, headers()) == UNAUTHORIZED
    for _ in range(10):
        assert gate.refusal(HOME, headers(b"Bearer nvp_guess")) == UNAUTHORIZED
        clock.advance(1)
    refusal = gate.refusal(HOME, headers(b"Bearer nvp_laptop"))
    assert refusal is not None and refusal.reason is Reason.TOO_MANY_AUTH_FAILURES
    assert refusal.headers == ((b"Retry-After", b"50"),)
    # Another address of the network is not held to it; a loopback caller never is.
    other = IPv4Address("TCP", "192.168.1.8", 1)
    assert gate.refusal(other, headers(b"Bearer nvp_laptop")) is None
    clock.advance(50)
    assert gate.refusal(HOME, headers(b"Bearer nvp_laptop")) is None


def test_a_reload_applies_to_the_next_head_and_to_a_request_not_yet_admitted() -> None:
    gate = LanGate(Clock(), KEYED)
    assert gate.refusal(HOME, headers(b"Bearer nvp_laptop")) is None
    gate.reload(Access(LAN, ()))  # the key removed while the body was coming
    assert gate.caller(HOME, headers(b"Bearer nvp_laptop")) == UNAUTHORIZED
    gate.reload(None)
    assert gate.caller(HOME, headers(b"Bearer nvp_laptop")) == LOOPBACK_ONLY
    assert gate.caller(LOOPBACK, headers()) is None
    gate.reload(Access(LAN))  # no key file: a listed caller needs none
    assert gate.refusal(HOME, headers()) is None
    assert gate.caller(HOME, headers()) == LAN_KEYLESS


def test_the_tls_context_follows_the_certificate_through_reloads() -> None:
    ca = make_ca()
    first, second = issue(ca, ["a.lan"]), issue(ca, ["b.lan"])
    gate = LanGate(Clock(), Access(LAN, None, LanTls(first.cert_pem, first.key_pem)))
    one = gate.tls
    assert one is not None
    gate.reload(Access(LAN, (LAPTOP,), LanTls(first.cert_pem, first.key_pem)))
    assert gate.tls is one  # the same certificate: the same context
    gate.reload(Access(LAN, None, LanTls(second.cert_pem, second.key_pem)))
    assert gate.tls is not None and gate.tls is not one
    gate.reload(Access(LAN))
    assert gate.tls is None


def test_the_status_shows_who_the_access_in_force_admits() -> None:
    """Issue 31 item 7: per facade, ``lan`` says networks, keys, TLS and TLS required."""
    ca = make_ca()
    server = issue(ca, ["gpu.lan"])
    gate = LanGate(Clock(), Access(LAN, (LAPTOP,), LanTls(server.cert_pem, server.key_pem), True))
    assert gate.shown() == {
        "networks": ["192.168.1.0/24"],
        "keys": True,
        "tls": True,
        "tlsRequired": True,
    }
    gate.reload(Access(LAN))
    assert gate.shown() == {
        "networks": ["192.168.1.0/24"],
        "keys": False,
        "tls": False,
        "tlsRequired": False,
    }
    gate.reload(None)
    assert gate.shown() is None


def test_with_tls_required_a_lan_caller_over_plaintext_is_refused_its_key_unjudged() -> None:
    """docs/lan.md#plaintext-from-the-lan: 403 ``tls-required`` for a listed caller over
    plaintext, before its key is judged (a wrong one is not counted as failed); over TLS it is
    judged as always; an unlisted one is still ``forbidden``; ``require-tls = false`` serves
    plaintext."""
    server = issue(make_ca(), ["a.lan"])
    tls = LanTls(server.cert_pem, server.key_pem)
    gate = LanGate(Clock(), Access(LAN, (LAPTOP,), tls, require_tls=True))
    assert Refusal(Reason.TLS_REQUIRED) == TLS_REQUIRED and TLS_REQUIRED.reason.status == 403
    for _ in range(20):
        assert gate.refusal(HOME, headers(b"Bearer nvp_guess")) == TLS_REQUIRED
    assert gate.refusal(HOME, headers(b"Bearer nvp_laptop"), tls=True) is None
    assert gate.refusal(HOME, headers(), tls=True) == UNAUTHORIZED
    assert gate.refusal(AWAY, headers(b"Bearer nvp_laptop")) == NOT_LISTED
    gate.reload(Access(LAN, (LAPTOP,), tls, require_tls=False))
    assert gate.refusal(HOME, headers(b"Bearer nvp_laptop")) is None


_WITHOUT_TLS = """
import sys, ipaddress
sys.modules["OpenSSL"] = None  # as tap.leave_tls_unloaded leaves a process without TLS
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from nvpair.fleet.lanconfig import Access, LanTls
from nvpair.fleet.langate import LanGate
from twisted.internet.address import IPv4Address
from nvpair.wire.message import Fields
said = []
globalLogPublisher.addObserver(lambda event: said.append(event.get("log_format", "")))
gate = LanGate(Clock(), None)
gate.reload(Access((ipaddress.ip_network("10.0.0.0/8"),), None, LanTls(b"c", b"k"), True))
print(gate.tls is None, gate.access is not None and gate.access.tls is None)
print(gate.refusal(IPv4Address("TCP", "10.0.0.7", 1), Fields()))
print([line for line in said if "restart" in line])
"""


def test_tls_added_at_a_reload_to_a_process_without_it_waits_for_a_restart() -> None:
    """docs/lan.md#tls: pyOpenSSL was kept out at start; the rest of [access] applies now,
    and the log says TLS needs a restart; TLS required is not required meanwhile (there is
    none to use)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TLS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True True",
        "None",
        "['access.tls-cert: TLS for LAN callers needs a restart to start']",
    ]


def test_one_ipv6_host_rotating_its_address_within_its_64_is_one_address() -> None:
    """Issue 29 item 6: 200 guesses in 0.1 s by rotating the source within one /64."""
    clock = Clock()
    gate = LanGate(clock, Access((ipaddress.ip_network("fd00::/8"),), (LAPTOP,)))
    refused = 0
    for host in range(200):
        peer = IPv6Address("TCP", f"fd00:1:2:3::{host + 1:x}", 50000)
        if gate.refusal(peer, headers(b"Bearer nvp_guess")) != UNAUTHORIZED:
            refused += 1
        clock.advance(0.0005)
    assert refused == 190  # ten guesses, then the whole /64 is closed
    valid = IPv6Address("TCP", "fd00:1:2:3:ffff::1", 50000)
    closed = gate.refusal(valid, headers(b"Bearer nvp_laptop"))
    assert closed is not None and closed.reason == "too-many-auth-failures"
    # Another /64 is another caller.
    neighbour = IPv6Address("TCP", "fd00:1:2:4::1", 50000)
    assert gate.refusal(neighbour, headers(b"Bearer nvp_laptop")) is None
