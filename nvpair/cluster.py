"""The cluster directory: membership, this node's key pair, peer pins, and TLS built on them.

The proxy consumes the trust fabric and builds none of its own (spec §2): cluster-manager
writes ``membership.json``, ``node.crt``/``node.key`` and ``pins/<nodeId>.pin``; this module
reads them, re-reads them when they change, and answers two questions per connection —
is this node a member (so the TLS personality is on), and is this certificate pinned.
A pin is the SHA-256 of a peer certificate's DER encoding (``sha256:<64 hex>``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import frozen
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

_PIN = re.compile(r"sha256:([0-9a-f]{64})")

#: How often the directory is checked for changes.
WATCH_INTERVAL = 1.0


def fingerprint(der: bytes) -> str:
    """The pin form of a DER certificate."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def certificate_fingerprint(certificate: crypto.X509) -> str:
    return fingerprint(crypto.dump_certificate(crypto.FILETYPE_ASN1, certificate))


@frozen
class Membership:
    """This node as a cluster member: identity, key pair, and the pins it trusts.

    :ivar pins: peer node id -> pin (``sha256:<hex>``).
    """

    cluster_id: str
    node_id: str
    certificate: x509.Certificate
    key: Any
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
        document = json.loads(membership_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ClusterDirError(f"{membership_file}: {error}") from None
    if not isinstance(document, dict) or not all(
        isinstance(document.get(k), str) and document.get(k) for k in ("clusterId", "nodeId")
    ):
        raise ClusterDirError(f"{membership_file}: needs string clusterId and nodeId")
    try:
        certificate = x509.load_pem_x509_certificate((directory / "node.crt").read_bytes())
        key = serialization.load_pem_private_key(
            (directory / "node.key").read_bytes(), password=None
        )
    except (OSError, ValueError, TypeError) as error:
        raise ClusterDirError(f"{directory}: node.crt/node.key unusable: {error}") from None
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
    return Membership(document["clusterId"], document["nodeId"], certificate, key, pins)


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


def _context(membership: Membership, verify: Callable[..., bool], server: bool) -> SSL.Context:
    method = SSL.TLS_SERVER_METHOD if server else SSL.TLS_CLIENT_METHOD
    context = SSL.Context(method)
    context.set_min_proto_version(SSL.TLS1_2_VERSION)
    context.use_certificate(membership.certificate)
    context.use_privatekey(membership.key)
    context.check_privatekey()
    mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if server else 0)
    context.set_verify(mode, verify)
    return context


def server_context(membership: Membership) -> SSL.Context:
    """A server context that completes the handshake only for a pinned client certificate.

    Pins replace chains: OpenSSL's own verdict (a self-signed certificate is an error to it)
    is overridden by the exact fingerprint comparison on the leaf.
    """

    def verify(
        connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int
    ) -> bool:
        if depth != 0:
            return True
        return membership.pinned(certificate) is not None

    return _context(membership, verify, server=True)


@implementer(IOpenSSLClientConnectionCreator)
class _PinnedClient:
    def __init__(self, context: SSL.Context) -> None:
        self._context = context

    def clientConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        connection = SSL.Connection(self._context, None)
        connection.set_app_data(tlsProtocol)
        connection.set_connect_state()
        return connection


@implementer(IPolicyForHTTPS)
class PinnedPeers:
    """Outbound TLS to peers: present this node's certificate, require the peer's pin.

    Hostname verification means nothing on a LAN of node ids; what identifies a peer is its
    pinned certificate. The node a ``host:port`` belongs to comes from discovery (each
    ``https://`` node URL), so a certificate that does not match *that* node's pin fails the
    handshake — a transport failure the loop fails over from.

    :param membership: the live membership (None: not a member, no peer can be dialled).
    :param node_for: ``(host, port) -> node id`` from the current discovery snapshots.
    """

    def __init__(
        self,
        membership: Callable[[], Membership | None],
        node_for: Callable[[str, int], str | None],
    ) -> None:
        self._membership = membership
        self._node_for = node_for
        # (host, port) -> (membership, expected pin, creator): building an SSL context per
        # request would cost more than the request; it is rebuilt when either input changes.
        self._creators: dict[
            tuple[str, int], tuple[Membership, str | None, IOpenSSLClientConnectionCreator]
        ] = {}

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        host = hostname.decode("ascii")
        membership = self._membership()
        if membership is None:
            raise SSL.Error("not a cluster member: cannot dial a peer")
        node_id = self._node_for(host, port)
        expected = membership.pins.get(node_id) if node_id is not None else None
        cached = self._creators.get((host, port))
        if cached is not None and cached[0] is membership and cached[1] == expected:
            return cached[2]

        def verify(
            connection: SSL.Connection, certificate: crypto.X509, errno: int, depth: int, ok: int
        ) -> bool:
            if depth != 0:
                return True
            return expected is not None and certificate_fingerprint(certificate) == expected

        creator = _PinnedClient(_context(membership, verify, server=False))
        self._creators[(host, port)] = (membership, expected, creator)
        return creator
