"""``[access] loopback-keys = true``: loopback callers present a key too, on a machine shared
by several users (issue 32 item 3; docs/lan.md#a-shared-machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.task import Clock

from nvpair.common.reasons import Reason
from nvpair.engines.caller import KEYLESS, Caller, Priority
from nvpair.fleet.lanconfig import Access, AccessError, Key, digest_of, parse_access
from nvpair.fleet.langate import NOT_LISTED, UNAUTHORIZED, LanGate
from tests.fleet.test_langate import HOME, LAN, LOOPBACK, headers

SHARED = Key("alice", digest_of(b"nvp_alice"), ("qwen*",), manage=False, priority=Priority.LOW)
ONLY_LOOPBACK = Access((), (SHARED,), loopback_keys=True)


def keys_file(tmp_path: Path) -> None:
    digest = digest_of(b"nvp_alice").hex()
    (tmp_path / "keys.toml").write_text(f'[[keys]]\nname = "alice"\nsha256 = "{digest}"\n')


def test_loopback_keys_is_read_and_needs_a_key_file_but_no_network(tmp_path: Path) -> None:
    keys_file(tmp_path)
    table: dict[str, object] = {"keys": "keys.toml", "loopback-keys": True}
    access = parse_access(table, tmp_path)
    assert access is not None and access.loopback_keys and access.networks == ()
    assert parse_access({**table, "loopback-keys": False}, tmp_path) is None
    plain = parse_access({"networks": ["192.168.1.0/24"]}, tmp_path)
    assert plain is not None and not plain.loopback_keys
    with pytest.raises(AccessError, match=r"access\.loopback-keys: needs access\.keys"):
        parse_access({"loopback-keys": True}, tmp_path)
    with pytest.raises(AccessError, match=r"access\.loopback-keys: must be true or false"):
        parse_access({**table, "loopback-keys": "yes"}, tmp_path)


def test_a_loopback_caller_needs_a_valid_key_and_its_key_applies_in_full() -> None:
    gate = LanGate(Clock(), ONLY_LOOPBACK)
    assert gate.refusal(LOOPBACK, headers()) == UNAUTHORIZED
    assert gate.refusal(LOOPBACK, headers(b"Bearer nvp_wrong")) == UNAUTHORIZED
    assert gate.caller(LOOPBACK, headers()) == UNAUTHORIZED
    assert gate.refusal(LOOPBACK, headers(b"Bearer nvp_alice")) is None
    # Models, manage and priority are the key's; on this machine, so not a LAN caller.
    expected = Caller("alice", ("qwen*",), manage=False, lan=False, priority=Priority.LOW)
    assert gate.caller(LOOPBACK, headers(b"Bearer nvp_alice")) == expected
    # A preflight carries no credentials from any browser: let in, keyless.
    assert gate.refusal(LOOPBACK, headers(), preflight=True) is None
    assert gate.caller(LOOPBACK, headers(), preflight=True) == KEYLESS
    # No network listed: the LAN stays out.
    assert gate.refusal(HOME, headers(b"Bearer nvp_alice")) == NOT_LISTED


def test_failed_loopback_keys_are_throttled_as_a_lan_caller_s() -> None:
    clock = Clock()
    gate = LanGate(clock, Access(LAN, (SHARED,), loopback_keys=True))
    for _ in range(10):
        assert gate.refusal(LOOPBACK, headers(b"Bearer nvp_guess")) == UNAUTHORIZED
    throttled = gate.refusal(LOOPBACK, headers(b"Bearer nvp_alice"))
    assert throttled is not None and throttled.reason is Reason.TOO_MANY_AUTH_FAILURES
    # The LAN's addresses are counted apart.
    assert gate.refusal(HOME, headers(b"Bearer nvp_alice")) is None
    clock.advance(61)
    assert gate.refusal(LOOPBACK, headers(b"Bearer nvp_alice")) is None


def test_without_loopback_keys_a_loopback_caller_is_never_asked() -> None:
    gate = LanGate(Clock(), Access(LAN, (SHARED,)))
    for _ in range(12):
        assert gate.refusal(LOOPBACK, headers(b"Bearer nvp_guess")) is None
    assert gate.caller(LOOPBACK, headers()) == KEYLESS
    assert gate.caller(LOOPBACK, headers(b"Bearer nvp_alice")) == Caller(
        "alice", ("qwen*",), priority=Priority.LOW
    )
