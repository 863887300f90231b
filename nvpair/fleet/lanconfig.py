"""The fleet file's ``[access]`` and its key file, read and checked once (docs/lan.md).

``[access]`` says who besides loopback may call a fleet's facades: the LAN networks, the key
file whose keys they must present, and the certificate that serves them TLS. A key file holds
no secret, only each secret's SHA-256, so reading it (or leaking it) gives no key away. Every
problem names the file and the offending key, as the rest of the fleet file does; a file that
cannot be used is a usage error at start and keeps the running configuration at SIGHUP.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import tomllib
from collections.abc import Mapping
from hashlib import sha256
from pathlib import Path

from attrs import frozen

from nvpair.engines.caller import Priority
from nvpair.fleet.credentials import CREDENTIAL, SourceError, credential_path

#: A key's name: shown in ``/status``, logs and metric labels, so plain and bounded.
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Bytes of randomness in a new secret (``nvpair-proxy --new-key``).
SECRET_BYTES = 32

#: What every secret ``--new-key`` makes begins with: a key is recognisable in a config file.
SECRET_PREFIX = "nvp_"

#: The longest key file, and the longest model pattern, read: a key file is a few lines.
_MAX_KEY_FILE = 1024 * 1024
_MAX_PATTERN = 256

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AccessError(ValueError):
    """``[access]`` or its key file cannot be used; the message names the key that is wrong."""


@frozen
class Key:
    """One key of the key file.

    :ivar digest: SHA-256 of the secret's UTF-8 bytes.
    :ivar models: shell-style patterns of the model names it may use; empty: every model.
    :ivar manage: it may use the routes that change what an engine holds (pull, push, copy,
        create, delete, load, unload).
    """

    name: str
    digest: bytes
    models: tuple[str, ...] = ()
    manage: bool = False
    #: Its requests' place in the fleet's queue (docs/fleet-scheduling.md#the-queue).
    priority: Priority = Priority.NORMAL
    #: It may reach the admin listener from the LAN (docs/lan.md#the-admin-view-from-the-lan).
    admin: bool = False


@frozen
class LanTls:
    """The certificate (and chain) and key that serve TLS to LAN callers, as PEM, checked."""

    cert_pem: bytes
    key_pem: bytes


@frozen
class Access:
    """A fleet's ``[access]``: only present when it lets some network in.

    :ivar keys: the key file's keys; None when no key file is named (LAN callers need none).
    :ivar require_tls: a LAN caller over plaintext is refused at its head (``tls-required``);
        only ever true with ``tls``, as there is no TLS to ask for otherwise.
    :ivar loopback_keys: loopback callers need a key too (a machine shared by several users,
        docs/lan.md#a-shared-machine); only ever true with ``keys``.
    """

    networks: tuple[IPNetwork, ...]
    keys: tuple[Key, ...] | None = None
    tls: LanTls | None = None
    require_tls: bool = False
    loopback_keys: bool = False


def _fail(where: str, why: str) -> AccessError:
    return AccessError(f"{where}: {why}")


def _network(where: str, text: object) -> IPNetwork:
    if not isinstance(text, str):
        raise _fail(where, 'must be a network such as "192.168.1.0/24"')
    try:
        # strict: "192.168.1.5/24" is a typo for a host or a network; said, not guessed.
        return ipaddress.ip_network(text.strip())
    except ValueError as error:
        raise _fail(where, f"not a network: {error}") from None


def _file(fleet_dir: Path, where: str, value: object) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise _fail(where, "must be a file name")
    return fleet_dir / Path(value)


def _read(where: str, path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(_MAX_KEY_FILE + 1)
    except OSError as error:
        raise _fail(where, f"cannot read {path}: {error.strerror}") from None
    if len(data) > _MAX_KEY_FILE:
        raise _fail(where, f"{path} is over {_MAX_KEY_FILE} bytes")
    return data


def parse_access(
    table: object, fleet_dir: Path, environ: Mapping[str, str] | None = None
) -> Access | None:
    """The ``[access]`` table of a fleet file whose directory is ``fleet_dir``; ``environ``
    holds ``$CREDENTIALS_DIRECTORY`` for a ``credential:NAME`` certificate or key.

    None when there is no table or it lets no network in and asks no key of loopback callers:
    then nothing differs from a fleet without one (docs/lan.md#who-may-call). The key file and
    the certificate are read and checked all the same, so a broken one is said now rather
    than when a network is added.

    :raises AccessError: naming the key (``access.networks[1]``, ``access.keys: keys.toml:
        keys[0].sha256``) and what is wrong.
    """
    if table is None:
        return None
    if not isinstance(table, dict):
        raise _fail("access", "must be a table ([access])")
    known = {"networks", "keys", "tls-cert", "tls-key", "require-tls", "loopback-keys"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise _fail("access", f"unknown key(s) {', '.join(unknown)}")
    listed = table.get("networks", [])
    if not isinstance(listed, list):
        raise _fail("access.networks", 'must be a list of networks such as ["192.168.1.0/24"]')
    networks = tuple(
        _network(f"access.networks[{index}]", text) for index, text in enumerate(listed)
    )
    keys = None
    if "keys" in table:
        path = _file(fleet_dir, "access.keys", table["keys"])
        keys = parse_keys(_read("access.keys", path), f"access.keys: {path}")
    tls = _tls(table, fleet_dir, {} if environ is None else environ)
    require_tls = _require_tls(table, tls)
    loopback_keys = table.get("loopback-keys", False)
    if not isinstance(loopback_keys, bool):
        raise _fail("access.loopback-keys", "must be true or false")
    if loopback_keys and keys is None:
        # Nothing to present: every loopback caller would be refused.
        raise _fail("access.loopback-keys", "needs access.keys, the key file callers' keys are in")
    if not networks and not loopback_keys:
        return None
    return Access(networks, keys, tls, require_tls, loopback_keys)


def _require_tls(table: Mapping[str, object], tls: LanTls | None) -> bool:
    """``require-tls``: true unless said otherwise once TLS is served, since a key sent over
    plaintext has crossed the LAN in clear before it is judged (docs/lan.md#tls)."""
    value = table.get("require-tls", tls is not None)
    if not isinstance(value, bool):
        raise _fail("access.require-tls", "must be true or false")
    if value and tls is None:
        # Every LAN caller would be refused, with no TLS to turn to.
        raise _fail("access.require-tls", "needs access.tls-cert and access.tls-key")
    return value


def _tls_file(fleet_dir: Path, where: str, value: object, environ: Mapping[str, str]) -> Path:
    """A file name, or ``credential:NAME``: the service's dynamic user cannot read a key that
    is 0600 root, but systemd hands it a copy (docs/lan.md#as-a-service)."""
    if isinstance(value, str) and value.startswith(CREDENTIAL):
        try:
            return credential_path(value[len(CREDENTIAL) :], environ)
        except SourceError as error:
            raise _fail(where, str(error)) from None
    return _file(fleet_dir, where, value)


def _tls(table: Mapping[str, object], fleet_dir: Path, environ: Mapping[str, str]) -> LanTls | None:
    named = [name for name in ("tls-cert", "tls-key") if name in table]
    if not named:
        return None
    if len(named) == 1:
        other = "tls-key" if named == ["tls-cert"] else "tls-cert"
        raise _fail(f"access.{named[0]}", f"needs access.{other} beside it")
    cert_path = _tls_file(fleet_dir, "access.tls-cert", table["tls-cert"], environ)
    key_path = _tls_file(fleet_dir, "access.tls-key", table["tls-key"], environ)
    cert = _read("access.tls-cert", cert_path)
    key = _read("access.tls-key", key_path)
    problem = pem_problem(cert, key)
    if problem is not None:
        where, why = problem
        raise _fail(where, why)
    return LanTls(cert, key)


def pem_problem(cert_pem: bytes, key_pem: bytes) -> tuple[str, str] | None:
    """What is wrong with a certificate chain and its key, as ``(where, why)``, or None.

    Checked with ``cryptography``, which a process that will not speak TLS may load, where
    pyOpenSSL is kept out of it (docs/performance.md#memory).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return "access.tls-cert", "holds no PEM certificate"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        # TypeError: the key is encrypted; the process has no one to ask for a password.
        return "access.tls-key", "holds no unencrypted PEM private key"
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if chain[0].public_key().public_bytes(der, public) != key.public_key().public_bytes(
        der, public
    ):
        return "access.tls-key", "is not the key of access.tls-cert's (first) certificate"
    return None


def parse_keys(data: bytes, where: str) -> tuple[Key, ...]:
    """A key file's ``[[keys]]``: names unique, digests 64 hex digits, patterns strings.

    :param where: how messages name the file (``access.keys: /etc/nvpair/keys.toml``).
    """
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise _fail(where, f"not valid TOML: {error}") from None
    except RecursionError:
        raise _fail(where, "not valid TOML: nested too deeply") from None
    unknown = sorted(set(document) - {"keys"})
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}")
    entries = document.get("keys", [])
    if not isinstance(entries, list):
        raise _fail(f"{where}: keys", "must be an array of tables ([[keys]])")
    keys: list[Key] = []
    for index, entry in enumerate(entries):
        keys.append(_key(f"{where}: keys[{index}]", entry))
    names = [key.name for key in keys]
    digests = [key.digest for key in keys]
    for index, key in enumerate(keys):
        if names.index(key.name) != index:
            raise _fail(f"{where}: keys[{index}].name", f"{key.name!r} is another key's name")
        if digests.index(key.digest) != index:
            other = keys[digests.index(key.digest)].name
            raise _fail(f"{where}: keys[{index}].sha256", f"is also key {other!r}'s")
    return tuple(keys)


def _key(where: str, entry: object) -> Key:
    if not isinstance(entry, dict):
        raise _fail(where, "must be a table")
    unknown = sorted(set(entry) - {"name", "sha256", "models", "manage", "priority", "admin"})
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}")
    name = entry.get("name")
    if not isinstance(name, str) or KEY_NAME.fullmatch(name) is None:
        raise _fail(f"{where}.name", name_problem())
    digest = entry.get("sha256")
    if not isinstance(digest, str) or re.fullmatch(r"[0-9A-Fa-f]{64}", digest) is None:
        raise _fail(f"{where}.sha256", "must be 64 hex digits: the SHA-256 of the secret")
    models = entry.get("models", [])
    if not isinstance(models, list) or not all(
        isinstance(pattern, str) and 0 < len(pattern) <= _MAX_PATTERN for pattern in models
    ):
        raise _fail(f"{where}.models", 'must be a list of model name patterns such as ["llama3*"]')
    manage, admin = entry.get("manage", False), entry.get("admin", False)
    for flag, value in (("manage", manage), ("admin", admin)):
        if not isinstance(value, bool):
            raise _fail(f"{where}.{flag}", "must be true or false")
    priority = entry.get("priority", "normal")
    if priority not in ("high", "normal", "low"):
        raise _fail(f"{where}.priority", 'must be "high", "normal" or "low"')
    level = Priority[str(priority).upper()]
    return Key(name, bytes.fromhex(digest), tuple(models), bool(manage), level, bool(admin))


def name_problem() -> str:
    """What a key's name must be, in words."""
    return "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"


def digest_of(secret: bytes) -> bytes:
    """A secret's digest, as the key file holds it (the UTF-8 bytes as a client sends them)."""
    return sha256(secret).digest()


def new_key(name: str) -> tuple[str, str]:
    """A fresh secret and the ``[[keys]]`` block naming it (``nvpair-proxy --new-key``).

    :raises AccessError: ``name`` is no key name.
    """
    if KEY_NAME.fullmatch(name) is None:
        raise AccessError(f"--new-key: {name!r} {name_problem()}")
    secret = SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    block = (
        "[[keys]]\n"
        f'name = "{name}"\n'
        f'sha256 = "{digest_of(secret.encode()).hex()}"\n'
        '# models = ["llama3*"]   # optional: the model names this key may use\n'
        "# manage = true          # optional: may pull, copy, create, delete, load models\n"
        "# admin = true           # optional: may reach the admin listener from the LAN\n"
    )
    return secret, block
