"""TLS for LAN callers beside the pinned-peer personality, on one port, over real sockets
(docs/lan.md#tls, docs/cluster.md#one-port-two-personalities)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL
from twisted.internet import reactor
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread

from nvpair.wire.trust.cluster import Membership, load_membership
from nvpair.wire.trust.lantls import lan_context
from nvpair.wire.trust.sniffing import SniffingFactory
from tests.certs import NodeIdentity, issue, make_ca, make_identity, write_cluster_dir

CA = make_ca()
LAN_CERT = issue(CA, ["gpu.lan"], ["127.0.0.1"])
ME, ALICE, MALLORY = make_identity("me"), make_identity("alice"), make_identity("mallory")


class _Says(Protocol):
    """Answers its first bytes with the name of the site that got the connection."""

    def __init__(self, name: bytes) -> None:
        self.name = name

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(self.name)


def _site(name: bytes) -> Factory:
    return Factory.forProtocol(lambda: _Says(name))


@pytest.fixture
def files(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    (tmp_path / "alice.crt").write_bytes(ALICE.cert_pem)
    (tmp_path / "alice.key").write_bytes(ALICE.key_pem)
    (tmp_path / "mallory.crt").write_bytes(MALLORY.cert_pem)
    (tmp_path / "mallory.key").write_bytes(MALLORY.key_pem)
    yield tmp_path


def _member(tmp_path: Path) -> Membership:
    membership = load_membership(write_cluster_dir(tmp_path / "cluster", ME, [ALICE]))
    assert membership is not None
    return membership


_PORTS: list[IListeningPort] = []


@pytest.fixture(autouse=True)
def _stop_listening() -> Iterator[None]:
    yield
    while _PORTS:
        _PORTS.pop().stopListening()


def _listen(membership: Membership | None, lan: SSL.Context | None) -> int:
    factory = SniffingFactory(
        reactor,
        _site(b"plain"),
        _site(b"peer"),
        lambda: membership,
        lan=_site(b"lan"),
        lan_tls=lambda: lan,
    )
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    _PORTS.append(port)
    return int(port.getHost().port)  # type: ignore[attr-defined]


def _ask(
    port: int,
    files: Path,
    *,
    name: str | None,
    verify: bool,
    client: str | None = None,
) -> tuple[bytes, x509.Certificate]:
    """One TLS exchange: what the site said and the certificate the server showed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if verify:
        context.load_verify_locations(files / "ca.crt")
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client is not None:
        context.load_cert_chain(files / f"{client}.crt", files / f"{client}.key")
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        tls.sendall(b"GET / HTTP/1.1\r\n\r\n")
        said = tls.recv(100)
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return said, x509.load_der_x509_certificate(der)


def _is(certificate: x509.Certificate, identity: NodeIdentity) -> bool:
    return certificate.public_bytes(serialization.Encoding.DER) == identity.der


LAN = lan_context(LAN_CERT.cert_pem, LAN_CERT.key_pem)


@pytest_twisted.ensureDeferred
async def test_no_member_shows_the_lan_certificate_to_every_tls_client(files: Path) -> None:
    """Verified against the self-made CA, by name or by address (which sends no SNI)."""
    port = _listen(None, LAN)
    said, shown = await deferToThread(_ask, port, files, name="gpu.lan", verify=True)
    assert said == b"lan" and shown == LAN_CERT.cert
    said, shown = await deferToThread(_ask, port, files, name="127.0.0.1", verify=True)
    assert said == b"lan" and shown == LAN_CERT.cert


@pytest_twisted.ensureDeferred
async def test_a_member_tells_peers_from_lan_callers(files: Path, tmp_path: Path) -> None:
    """A pinned client certificate is a peer; no certificate, or an unpinned one, is a LAN
    caller; a client that names the server gets the LAN certificate."""
    port = _listen(_member(tmp_path), LAN)
    said, shown = await deferToThread(_ask, port, files, name=None, verify=False, client="alice")
    assert said == b"peer" and _is(shown, ME)
    said, shown = await deferToThread(_ask, port, files, name=None, verify=False, client="mallory")
    assert said == b"lan" and _is(shown, ME)
    said, shown = await deferToThread(_ask, port, files, name=None, verify=False)
    assert said == b"lan" and _is(shown, ME)
    said, shown = await deferToThread(_ask, port, files, name="gpu.lan", verify=True)
    assert said == b"lan" and shown == LAN_CERT.cert


@pytest_twisted.ensureDeferred
async def test_without_lan_tls_an_unpinned_client_is_refused_as_before(
    files: Path, tmp_path: Path
) -> None:
    port = _listen(_member(tmp_path), None)
    said, shown = await deferToThread(_ask, port, files, name=None, verify=False, client="alice")
    assert said == b"peer" and _is(shown, ME)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await deferToThread(_ask, port, files, name=None, verify=False, client="mallory")


@pytest_twisted.ensureDeferred
async def test_without_lan_tls_and_membership_tls_is_closed(files: Path) -> None:
    port = _listen(None, None)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await deferToThread(_ask, port, files, name="gpu.lan", verify=True)
