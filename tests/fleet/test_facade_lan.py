"""A facade with fleet mode's ``[access]``, over an in-memory connection (docs/lan.md)."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock

from nvpair.dispatch.job import outgoing_of
from nvpair.engines.caller import KEYLESS, Caller
from nvpair.engines.table import LLAMACPP, OLLAMA, Engine, RouteClass
from nvpair.facades.access import NO_REFUSALS, RefusalCounter
from nvpair.facades.facade import Admitted, Facade
from nvpair.fleet.lanconfig import Access, Key, digest_of
from nvpair.fleet.langate import LanGate
from nvpair.fleet.lanpolicy import LAN_KEYLESS, caller_of
from nvpair.observe.metrics import Metrics
from nvpair.wire.message import Fields
from nvpair.wire.server.site import FacadeSite
from tests.test_facade_http import Broken, split

LAPTOP = Key("laptop", digest_of(b"nvp_laptop"))
HOME = IPv4Address("TCP", "192.168.1.7", 40000)
LOOPBACK = IPv4Address("TCP", "127.0.0.1", 40000)


def gate(clock: Clock | None = None, keys: tuple[Key, ...] | None = (LAPTOP,)) -> LanGate:
    return LanGate(clock or Clock(), Access((ipaddress.ip_network("192.168.1.0/24"),), keys))


def exchange(
    engine: Engine,
    raw: bytes,
    lan: LanGate,
    peer: Any,
    handler: Broken,
    refusals: RefusalCounter = NO_REFUSALS,
    tls: bool = False,
) -> bytes:
    site = FacadeSite(Facade(engine, handler, lan=lan, refusals=refusals, tls=tls), 1000)
    protocol = site.buildProtocol(peer)
    from twisted.internet.testing import StringTransport

    transport = StringTransport(peerAddress=peer)
    protocol.makeConnection(transport)
    protocol.dataReceived(raw)
    return bytes(transport.value())


def request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    fields = "".join(f"{h}\r\n" for h in ("Host: gpu.lan:11435", *headers))
    return (
        f"{method} {path} HTTP/1.1\r\n{fields}Content-Length: {len(body)}\r\n\r\n".encode() + body
    )


def test_no_key_is_401_with_www_authenticate_decided_at_the_head() -> None:
    handler = Broken()
    body = json.dumps({"model": "llama3", "prompt": "x"}).encode()
    answer = exchange(OLLAMA, request("POST", "/api/generate", body=body), gate(), HOME, handler)
    status, headers, text = split(answer)
    assert status == "HTTP/1.1 401 Unauthorized"
    assert headers["www-authenticate"] == 'Bearer realm="nvpair"'
    assert headers["x-nvpair-error"] == "unauthorized" and headers["connection"] == "close"
    assert json.loads(text) == {"error": "a valid key is required: Authorization: Bearer <key>"}
    assert handler.seen == []
    head = exchange(LLAMACPP, request("HEAD", "/v1/models"), gate(), HOME, Broken())
    assert head.endswith(b"\r\n\r\n") and b"401" in head


def test_ten_failed_keys_are_429_with_retry_after_even_for_a_valid_key() -> None:
    clock = Clock()
    lan = gate(clock)
    for _ in range(10):
        exchange(
            LLAMACPP, request("GET", "/v1/models", "Authorization: Bearer no"), lan, HOME, Broken()
        )
    clock.advance(30)
    answer = exchange(
        LLAMACPP,
        request("GET", "/v1/models", "Authorization: Bearer nvp_laptop"),
        lan,
        HOME,
        Broken(),
    )
    status, headers, text = split(answer)
    assert status == "HTTP/1.1 429 Too Many Requests"
    assert headers["retry-after"] == "30" and headers["x-nvpair-error"] == "too-many-auth-failures"
    assert json.loads(text)["error"]["code"] == "too-many-auth-failures"


def test_a_valid_key_is_admitted_as_its_callers_and_the_host_guard_spares_the_lan() -> None:
    """A LAN caller names this machine as it likes (no forbidden-host); the admitted request
    carries its key; a loopback caller's is keyless; without [access], none."""
    handler = Broken()
    raw = request("GET", "/api/tags", "Authorization: Bearer nvp_laptop").replace(
        b"gpu.lan:11435", b"rebind.example.com"
    )
    status, _, _ = split(exchange(OLLAMA, raw, gate(), HOME, handler))
    assert status == "HTTP/1.1 200 OK"
    status, headers, _ = split(exchange(OLLAMA, raw, gate(), LOOPBACK, handler))
    assert headers["x-nvpair-error"] == "forbidden-host"
    local = request("GET", "/api/tags").replace(b"gpu.lan:11435", b"localhost")
    split(exchange(OLLAMA, local, gate(), LOOPBACK, handler))
    assert [a.caller for a in handler.seen] == [caller_of(LAPTOP), KEYLESS]


def test_outside_the_networks_is_403_over_any_key() -> None:
    handler = Broken()
    away = IPv4Address("TCP", "10.0.0.7", 1)
    raw = request("GET", "/v1/models", "Authorization: Bearer nvp_laptop")
    status, headers, text = split(exchange(LLAMACPP, raw, gate(), away, handler))
    assert status.startswith("HTTP/1.1 403") and headers["x-nvpair-error"] == "forbidden"
    assert "none of the fleet's [access] networks" in json.loads(text)["error"]["message"]


def _outgoing_headers(caller: Caller | None, x_api_key: bytes | None = None) -> Fields:
    fields = Fields.of({b"authorization": [b"Bearer nvp_laptop"], b"x-client": [b"1"]})
    if x_api_key is not None:
        fields.put(b"x-api-key", x_api_key)
    admitted = Admitted(
        OLLAMA, RouteClass.INFERENCE, b"POST", "/api/chat", b"/api/chat", b"{}", "m", "m", caller
    )
    return outgoing_of(admitted, fields).fields


def test_the_callers_authorization_is_never_forwarded_where_access_is_in_force() -> None:
    """The key is the proxy's (docs/lan.md#keys); without [access] the header goes on as
    before."""
    for caller in (caller_of(LAPTOP), KEYLESS):
        sent = _outgoing_headers(caller)
        assert not sent.has(b"authorization") and sent.has(b"x-client")
    assert _outgoing_headers(None).all_of(b"authorization") == [b"Bearer nvp_laptop"]


def test_a_browsers_preflight_from_the_lan_needs_no_key() -> None:
    handler = Broken()
    raw = request(
        "OPTIONS",
        "/v1/chat/completions",
        "Origin: http://webui.lan",
        "Access-Control-Request-Method: POST",
        "Access-Control-Request-Headers: authorization",
    )
    status, _, _ = split(exchange(LLAMACPP, raw, gate(), HOME, handler))
    assert status == "HTTP/1.1 200 OK"
    assert [(a.route, a.caller) for a in handler.seen] == [(RouteClass.PREFLIGHT, LAN_KEYLESS)]
    plain_options = request("OPTIONS", "/v1/models")
    status, _, _ = split(exchange(LLAMACPP, plain_options, gate(), HOME, Broken()))
    assert status.startswith("HTTP/1.1 401")


def test_without_access_a_fleet_facade_answers_byte_for_byte_as_before() -> None:
    """A fleet file without [access]: the same refusal, the same admitted request (no
    caller), as a facade that has no [access] to consult at all."""
    from tests.test_facade_http import exchange as plain_exchange

    raw = request("POST", "/v1/chat/completions", "Authorization: Bearer x", body=b"{}")
    without = LanGate(Clock(), None)
    assert exchange(LLAMACPP, raw, without, HOME, Broken()) == plain_exchange(
        LLAMACPP, raw, Broken(), HOME
    )
    seen, before = Broken(), Broken()
    exchange(LLAMACPP, raw, without, LOOPBACK, seen)
    plain_exchange(LLAMACPP, raw, before, LOOPBACK)
    assert seen.seen == before.seen and seen.seen[0].caller is None


def test_refusals_at_the_head_are_counted_routed_as_they_would_have_been() -> None:
    """docs/operations.md#metrics: 401, 403 and a preflight's refusal, each under its reason
    and its route; bytes that were no request under ``other``."""
    metrics, handler, lan = Metrics(), Broken(), gate()
    away = IPv4Address("TCP", "10.0.0.7", 40000)
    body = json.dumps({"model": "llama3", "prompt": "x"}).encode()
    exchange(OLLAMA, request("POST", "/api/generate", body=body), lan, HOME, handler, metrics)
    exchange(OLLAMA, request("GET", "/api/tags"), lan, away, handler, metrics)
    preflight = request(
        "OPTIONS", "/api/chat", "Origin: http://x", "Access-Control-Request-Method: POST"
    )
    exchange(OLLAMA, preflight, lan, away, handler, metrics)
    exchange(OLLAMA, b"SSH-2.0-OpenSSH\r\n\r\n", lan, LOOPBACK, handler, metrics)
    assert metrics.requests == {
        ("ollama", "inference", "unauthorized"): 1,
        ("ollama", "inventory", "forbidden"): 1,
        ("ollama", "preflight", "forbidden"): 1,
        ("ollama", "other", "bad-request"): 1,
    }
    assert handler.seen == []


def test_plaintext_is_tls_required_where_the_tls_facade_reads_on() -> None:
    """docs/lan.md#plaintext-from-the-lan: the same caller and key, refused 403 on the
    plaintext facade, admitted on the one LAN callers' TLS connections reach."""
    from nvpair.fleet.lanconfig import LanTls
    from tests.certs import issue, make_ca

    server = issue(make_ca(), ["gpu.lan"])
    tls = LanTls(server.cert_pem, server.key_pem)
    access = Access((ipaddress.ip_network("192.168.1.0/24"),), (LAPTOP,), tls, require_tls=True)
    lan = LanGate(Clock(), access)
    asked = request("GET", "/v1/models", "Authorization: Bearer nvp_laptop")
    status, headers, _ = split(exchange(LLAMACPP, asked, lan, HOME, Broken()))
    assert status == "HTTP/1.1 403 Forbidden" and headers["x-nvpair-error"] == "tls-required"
    handler = Broken()
    exchange(LLAMACPP, asked, lan, HOME, handler, tls=True)
    assert len(handler.seen) == 1
    # Loopback callers are never affected.
    handler = Broken()
    exchange(LLAMACPP, asked, lan, LOOPBACK, handler)
    assert len(handler.seen) == 1
