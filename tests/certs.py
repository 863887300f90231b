"""Self-signed node certificates and cluster directories for tests."""

from __future__ import annotations

import datetime
import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path

from attrs import frozen
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nvpair.wire.trust.cluster import fingerprint


@frozen
class NodeIdentity:
    node_id: str
    cert_pem: bytes
    key_pem: bytes
    der: bytes

    @property
    def pin(self) -> str:
        return fingerprint(self.der)


def _builder(
    common_name: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """A month's certificate for ``key``, named ``common_name``; self-issued without
    ``issuer``."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_identity(node_id: str) -> NodeIdentity:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _builder(node_id, None, key).sign(key, hashes.SHA256())
    return NodeIdentity(
        node_id,
        cert.public_bytes(serialization.Encoding.PEM),
        _pem_key(key),
        cert.public_bytes(serialization.Encoding.DER),
    )


def write_cluster_dir(
    directory: Path, me: NodeIdentity, peers: list[NodeIdentity], cluster_id: str = "c1"
) -> Path:
    """A member's cluster directory: membership, key pair, and a pin per peer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "membership.json").write_text(
        json.dumps({"clusterId": cluster_id, "nodeId": me.node_id})
    )
    (directory / "node.crt").write_bytes(me.cert_pem)
    (directory / "node.key").write_bytes(me.key_pem)
    pins = directory / "pins"
    pins.mkdir(exist_ok=True)
    for peer in peers:
        (pins / f"{peer.node_id}.pin").write_text(peer.pin + "\n")
    return directory


@frozen
class Issued:
    """A certificate and its key as PEM; for a CA, what it signs with."""

    cert_pem: bytes
    key_pem: bytes
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def make_ca(name: str = "test LAN CA") -> Issued:
    """A self-made certificate authority, as docs/lan.md makes one with openssl."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(name, None, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), cert, key)


def issue(ca: Issued, names: Sequence[str], addresses: Sequence[str] = ()) -> Issued:
    """A server certificate signed by ``ca`` for host ``names`` and IP ``addresses``."""
    key = ec.generate_private_key(ec.SECP256R1())
    alternative: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alternative += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (
        _builder(names[0], ca.cert.subject, key)
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), cert, key)
