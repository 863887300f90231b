"""Pure decisions about LAN callers: networks, keys, model patterns (docs/lan.md)."""

from __future__ import annotations

import hmac
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvpair.control.state import ControlState
from nvpair.dispatch.requestpath import KeyRefusal, key_refusal
from nvpair.engines.caller import KEYLESS, Caller, permits
from nvpair.engines.table import ENGINES, RouteClass
from nvpair.facades.facade import Admitted
from nvpair.fleet.lanconfig import Access, Key, digest_of
from nvpair.fleet.lanpolicy import (
    Verdict,
    bearer,
    caller_of,
    find_key,
    in_networks,
    judge,
    loopback_caller,
)

OLLAMA, LLAMACPP = ENGINES["ollama"], ENGINES["llamacpp"]
LAN = (ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd00::/8"))
LAPTOP = Key("laptop", digest_of(b"nvp_laptop"))
PHONE = Key("phone", digest_of(b"nvp_phone"), ("llama3*", "qwen2.5:*"))


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    ("address", "inside"),
    [
        ("192.168.1.7", True),
        ("192.168.2.7", False),
        ("fd12::1", True),
        ("fe80::1", False),
        ("10.0.0.1", False),
    ],
)
def test_network_match(address: str, inside: bool) -> None:
    assert in_networks(ip(address), LAN) is inside


def test_no_address_and_no_networks_match_nothing() -> None:
    assert in_networks(None, LAN) is False
    assert in_networks(ip("192.168.1.7"), ()) is False


@given(st.integers(0, 2**32 - 1))
def test_an_ipv4_address_is_never_in_an_ipv6_network_and_back(value: int) -> None:
    """A family mismatch is False, not an error."""
    v4 = ipaddress.IPv4Address(value)
    assert in_networks(v4, (ipaddress.ip_network("::/0"),)) is False
    assert in_networks(ipaddress.IPv6Address(value), (ipaddress.ip_network("0.0.0.0/0"),)) is False
    assert in_networks(v4, (ipaddress.ip_network("0.0.0.0/0"),)) is True


@pytest.mark.parametrize(
    ("values", "secret"),
    [
        ([b"Bearer nvp_x"], b"nvp_x"),
        ([b"bearer   nvp_x  "], b"nvp_x"),
        ([b"BEARER nvp_x"], b"nvp_x"),
        (None, None),
        ([], None),
        ([b"Bearer a", b"Bearer b"], None),
        ([b"Basic dXNlcjpwYXNz"], None),
        ([b"Bearer "], None),
        ([b"Bearer"], None),
        ([b"nvp_x"], None),
    ],
)
def test_bearer(values: list[bytes] | None, secret: bytes | None) -> None:
    assert bearer(values) == secret


def test_find_key_compares_every_digest_in_constant_time() -> None:
    """The digest is compared with every key's by hmac.compare_digest, whichever matches:
    the time says nothing of which key, or how much of a digest, matched."""
    compared: list[bytes] = []

    def compare(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return hmac.compare_digest(a, b)

    keys = (LAPTOP, PHONE, Key("tv", digest_of(b"nvp_tv")))
    assert find_key(keys, b"nvp_laptop", compare) == LAPTOP
    assert compared == [key.digest for key in keys]
    compared.clear()
    assert find_key(keys, b"nvp_nope", compare) is None
    assert compared == [key.digest for key in keys]
    assert find_key(keys, b"nvp_phone") == PHONE


@pytest.mark.parametrize(
    ("address", "authorization", "verdict", "key"),
    [
        ("10.0.0.1", [b"Bearer nvp_laptop"], Verdict.FORBIDDEN, None),
        ("192.168.1.7", None, Verdict.NO_KEY, None),
        ("192.168.1.7", [b"Bearer nvp_wrong"], Verdict.BAD_KEY, None),
        ("192.168.1.7", [b"Basic eA=="], Verdict.BAD_KEY, None),
        ("192.168.1.7", [b"Bearer nvp_laptop"], Verdict.ALLOWED, LAPTOP),
        ("fd00::9", [b"Bearer nvp_phone"], Verdict.ALLOWED, PHONE),
    ],
)
def test_judge_with_keys(
    address: str, authorization: list[bytes] | None, verdict: Verdict, key: Key | None
) -> None:
    assert judge(Access(LAN, (LAPTOP, PHONE)), ip(address), authorization) == (verdict, key)


def test_judge_without_a_key_file_lets_listed_networks_in() -> None:
    access = Access(LAN)
    assert judge(access, ip("192.168.1.7"), None) == (Verdict.ALLOWED, None)
    assert judge(access, ip("192.168.1.7"), [b"Bearer x"]) == (Verdict.ALLOWED, None)
    assert judge(access, ip("10.1.1.1"), None) == (Verdict.FORBIDDEN, None)


def test_a_loopback_caller_needs_no_key_but_is_its_key_s_when_it_shows_one() -> None:
    access = Access(LAN, (LAPTOP, PHONE))
    assert loopback_caller(access, None) == KEYLESS
    assert loopback_caller(access, [b"Bearer nvp_wrong"]) == KEYLESS
    assert loopback_caller(access, [b"Bearer nvp_phone"]) == Caller("phone", PHONE.models)
    assert loopback_caller(Access(LAN), [b"Bearer nvp_phone"]) == KEYLESS
    assert caller_of(PHONE) == Caller("phone", PHONE.models, manage=False, lan=True)
    assert KEYLESS.name is None and KEYLESS.manage and not KEYLESS.lan


@pytest.mark.parametrize(
    ("engine", "model", "allowed"),
    [
        (OLLAMA, "llama3", True),  # llama3:latest to Ollama
        (OLLAMA, "Llama3:8B", True),  # Ollama names ignore case
        (OLLAMA, "llama3.1:70b", True),
        (OLLAMA, "qwen2.5", True),  # qwen2.5:latest
        (OLLAMA, "qwen2.5:7b", True),
        (OLLAMA, "qwen2", False),
        (OLLAMA, "mistral", False),
        (LLAMACPP, "llama3-8b.gguf", True),
        (LLAMACPP, "Llama3-8b.gguf", False),  # llama.cpp names are exact
        (LLAMACPP, "qwen2.5", False),
    ],
)
def test_model_patterns(engine: object, model: str, allowed: bool) -> None:
    assert permits(PHONE.models, engine, [model]) is allowed  # type: ignore[arg-type]


def test_a_key_without_patterns_may_use_any_model() -> None:
    assert permits(LAPTOP.models, OLLAMA, ["anything"])


@pytest.mark.parametrize(
    ("route", "model", "refused"),
    [
        (RouteClass.INFERENCE, "mistral", True),
        (RouteClass.INFERENCE, "llama3", False),
        (RouteClass.INFERENCE, None, True),  # the engine would choose: refused
        (RouteClass.OTHER, "mistral", True),  # /api/show of a model it may not use
        (RouteClass.OTHER, None, False),  # /api/version
        (RouteClass.INVENTORY, None, False),  # filtered instead
        (RouteClass.PREFLIGHT, None, False),
    ],
)
def test_forbids(route: RouteClass, model: str | None, refused: bool) -> None:
    def refusal(caller: Caller) -> KeyRefusal | None:
        admitted = Admitted(
            OLLAMA, route, b"POST", "/api/x", b"/api/x", b"", model, None, caller=caller
        )
        return key_refusal(admitted, ControlState())

    phone = refusal(caller_of(PHONE))
    assert (phone is not None and phone.reason == "forbidden-model") is refused
    assert refusal(caller_of(LAPTOP)) is None
    assert refusal(KEYLESS) is None


def test_a_cors_preflight_needs_no_key_but_a_listed_network() -> None:
    """A browser sends a preflight without credentials, whatever its request carries: one
    without a key is let in keyless; one with a key is judged as any request."""
    access = Access(LAN, (LAPTOP,))
    assert judge(access, ip("192.168.1.7"), None, preflight=True) == (Verdict.ALLOWED, None)
    assert judge(access, ip("10.0.0.1"), None, preflight=True) == (Verdict.FORBIDDEN, None)
    assert judge(access, ip("192.168.1.7"), [b"Bearer x"], preflight=True) == (
        Verdict.BAD_KEY,
        None,
    )
