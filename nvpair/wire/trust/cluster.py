"""The cluster directory: membership, this node's key pair, peer pins, and TLS built on them.

The proxy consumes the trust fabric and builds none of its own
(docs/cluster.md#the-cluster-directory): cluster-manager writes ``membership.json``,
``node.crt``/``node.key`` and ``pins/<nodeId>.pin``; this module reads them, re-reads them when they
change, and answers two questions per connection — is this node a member (so the TLS personality is
on), and is this certificate pinned. A pin is the SHA-256 of a peer certificate's DER encoding
(``sha256:<64 hex>``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from attrs import frozen
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from nvpair.common import strictjson

if TYPE_CHECKING:
    # pyOpenSSL and cryptography are loaded only once a cluster directory is read: a node
    # that is no member never pays for them (docs/performance.md#memory).
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
    from OpenSSL import crypto

    #: The private keys OpenSSL can sign a TLS handshake with.
    NodeKey: TypeAlias = (
        rsa.RSAPrivateKey
        | ec.EllipticCurvePrivateKey
        | ed25519.Ed25519PrivateKey
        | ed448.Ed448PrivateKey
        | dsa.DSAPrivateKey
    )

_PIN = re.compile(r"sha256:([0-9a-f]{64})")

#: How often the directory is checked for changes.
WATCH_INTERVAL = 1.0


def _node_key_types() -> tuple[type, ...]:
    """The classes of :data:`NodeKey`, imported when a key is loaded."""
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    return (
        rsa.RSAPrivateKey,
        ec.EllipticCurvePrivateKey,
        ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey,
        dsa.DSAPrivateKey,
    )


def fingerprint(der: bytes) -> str:
    """The pin form of a DER certificate."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def certificate_fingerprint(certificate: crypto.X509) -> str:
    from OpenSSL import crypto

    return fingerprint(crypto.dump_certificate(crypto.FILETYPE_ASN1, certificate))


@frozen
class Membership:
    """This node as a cluster member: identity, key pair, and the pins it trusts.

    :ivar pins: peer node id -> pin (``sha256:<hex>``).
    """

    cluster_id: str
    node_id: str
    certificate: x509.Certificate
    key: NodeKey
    pins: Mapping[str, str]

    def pinned(self, certificate: crypto.X509) -> str | None:
        """The node id whose pin this certificate matches, if any."""
        print_ = certificate_fingerprint(certificate)
        for node_id, pin in self.pins.items():
            if pin == print_:
                return node_id
        return None


class ClusterDirError(ValueError):
    """The directory claims membership but something in it cannot be used."""


def load_membership(directory: Path) -> Membership | None:
    """Read the cluster directory; None when this node is not a member.

    Membership is ``membership.json`` plus the key pair: without them there is no cluster
    personality. A pin file that does not hold a pin is skipped (and named in the error list
    the watcher logs), so one bad file cannot revoke every other peer.

    :raises ClusterDirError: membership files present but unusable.
    """
    membership_file = directory / "membership.json"
    if not membership_file.exists():
        return None
    try:
        document = strictjson.loads(membership_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ClusterDirError(f"{membership_file}: {error}") from None
    if not isinstance(document, dict) or not all(
        isinstance(document.get(k), str) and document.get(k) for k in ("clusterId", "nodeId")
    ):
        raise ClusterDirError(f"{membership_file}: needs string clusterId and nodeId")
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate((directory / "node.crt").read_bytes())
        key = serialization.load_pem_private_key(
            (directory / "node.key").read_bytes(), password=None
        )
    except (OSError, ValueError, TypeError) as error:
        raise ClusterDirError(f"{directory}: node.crt/node.key unusable: {error}") from None
    if not isinstance(key, _node_key_types()):
        raise ClusterDirError(f"{directory}: node.key is a {type(key).__name__}, not a TLS key")
    pins: dict[str, str] = {}
    pin_dir = directory / "pins"
    if pin_dir.is_dir():
        for pin_file in sorted(pin_dir.glob("*.pin")):
            try:
                match = _PIN.fullmatch(pin_file.read_text(encoding="ascii").strip().lower())
            except (OSError, UnicodeDecodeError):
                match = None
            if match is not None:
                pins[pin_file.stem] = "sha256:" + match.group(1)
    # The isinstance above checked the NodeKey classes, which mypy cannot see through a tuple.
    node_key = cast("NodeKey", key)
    return Membership(document["clusterId"], document["nodeId"], certificate, node_key, pins)


def _state(directory: Path) -> tuple[tuple[str, float, int], ...]:
    """A cheap signature of the directory's files, to notice changes."""
    files = [directory / "membership.json", directory / "node.crt", directory / "node.key"]
    pin_dir = directory / "pins"
    if pin_dir.is_dir():
        files += sorted(pin_dir.glob("*.pin"))
    out = []
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        out.append((str(path), stat.st_mtime, stat.st_size))
    return tuple(out)


class ClusterWatch:
    """The live membership, re-read whenever the directory changes (no restart needed).

    :param on_change: called with the new membership (or None) after each change.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        directory: Path | None,
        on_change: Callable[[Membership | None], None] = lambda m: None,
    ) -> None:
        self._directory = directory
        self.on_change = on_change
        self._signature: tuple[tuple[str, float, int], ...] | None = None
        self.membership: Membership | None = None
        self._loop = LoopingCall(self.check)
        self._loop.clock = clock
        self.check()

    def start(self) -> None:
        if self._directory is not None and not self._loop.running:
            self._loop.start(WATCH_INTERVAL, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def check(self) -> None:
        """Re-read the directory if anything in it changed."""
        if self._directory is None:
            return
        signature = _state(self._directory)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            membership = load_membership(self._directory)
        except ClusterDirError as error:
            self.log.error("cluster directory unusable, not a member: {why}", why=str(error))
            membership = None
        changed = (membership is None) != (self.membership is None) or (
            membership is not None
            and self.membership is not None
            and (membership.node_id, dict(membership.pins))
            != (self.membership.node_id, dict(self.membership.pins))
        )
        self.membership = membership
        if changed:
            self.log.info(
                "cluster membership: {state} ({pins} pins)",
                state="member" if membership else "not a member",
                pins=len(membership.pins) if membership else 0,
            )
            self.on_change(membership)
