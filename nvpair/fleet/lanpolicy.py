"""Pure decisions about a LAN caller: its network and its key (docs/lan.md#who-may-call).

Values in, values out: no clock, no socket. :mod:`nvpair.fleet.langate` applies them at a request's
head with the failed-key throttle (:mod:`nvpair.fleet.throttle`); what a key lets its caller use is
:mod:`nvpair.engines.caller`'s.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv6Address

from nvpair.engines.caller import KEYLESS, Caller
from nvpair.fleet.lanconfig import Access, IPNetwork, Key, digest_of

IPAddress = IPv4Address | IPv6Address

#: ``Authorization``'s scheme for a fleet key (RFC 6750), compared case-insensitively.
_BEARER = b"bearer "


class Verdict(enum.Enum):
    """What a LAN caller's head decides, before the throttle has its say."""

    ALLOWED = "allowed"
    #: Not from a listed network: 403 ``forbidden``, as without ``[access]``.
    FORBIDDEN = "forbidden"
    #: No key presented where one is needed: 401, not counted against the address.
    NO_KEY = "no-key"
    #: A key presented that is none of the file's: 401, counted against the address.
    BAD_KEY = "bad-key"


def in_networks(ip: IPAddress | None, networks: Sequence[IPNetwork]) -> bool:
    """Whether ``ip`` (IPv4-mapped already unwrapped) is in one of ``networks``."""
    # An address is never in a network of the other family (False, no error).
    return ip is not None and any(ip in network for network in networks)


def bearer(values: Sequence[bytes] | None) -> bytes | None:
    """The secret of exactly one ``Authorization: Bearer <secret>``, or None.

    Several ``Authorization`` fields, another scheme or an empty token are no secret.
    """
    if values is None or len(values) != 1:
        return None
    value = values[0].strip()
    if len(value) <= len(_BEARER) or value[: len(_BEARER)].lower() != _BEARER:
        return None
    secret = value[len(_BEARER) :].strip()
    return secret or None


def api_key(values: Sequence[bytes] | None) -> bytes | None:
    """The secret of exactly one non-empty ``X-Api-Key``, taken whole (no scheme), or None."""
    if values is None or len(values) != 1:
        return None
    return values[0].strip() or None


def presented(
    authorization: Sequence[bytes] | None, x_api_key: Sequence[bytes] | None
) -> bytes | None:
    """The secret a facade caller presents: ``Authorization``'s Bearer, or, when there is no
    ``Authorization`` field at all, ``X-Api-Key``'s, which Anthropic clients send
    (docs/lan.md#x-api-key). ``Authorization`` rules when both are there, as in
    llama-server: a bad one is a bad key, whatever ``X-Api-Key`` says."""
    if authorization is not None:
        return bearer(authorization)
    return api_key(x_api_key)


def find_key(
    keys: Sequence[Key],
    secret: bytes,
    compare: Callable[[bytes, bytes], bool] = hmac.compare_digest,
) -> Key | None:
    """The key whose digest is ``secret``'s, compared in constant time.

    Every key is compared, whichever matches: the time taken says nothing of which one did,
    or how much of a digest matched.

    :param compare: the comparison (a constant-time one; a test counts its calls).
    """
    digest = digest_of(secret)
    found = None
    for key in keys:
        if compare(digest, key.digest):
            found = key
    return found


def judge(
    access: Access,
    ip: IPAddress | None,
    authorization: Sequence[bytes] | None,
    preflight: bool = False,
    loopback: bool = False,
    x_api_key: Sequence[bytes] | None = None,
) -> tuple[Verdict, Key | None]:
    """A non-loopback caller's verdict, and its key when it presented a valid one; with
    ``loopback``, a loopback caller's where ``loopback-keys`` asks it for a key as well
    (docs/lan.md#a-shared-machine): the same key rules, no network to be in.

    :param authorization: the request's ``Authorization`` fields, and ``x_api_key`` its
        ``X-Api-Key`` fields (None: no such field), read as :func:`presented` reads them.
    :param preflight: the request is a CORS preflight, which a browser sends without
        credentials whatever the request it asks about carries: one without a key is let in
        keyless (it asks the engines what they allow, and uses no model).
    """
    if not loopback and not in_networks(ip, access.networks):
        return Verdict.FORBIDDEN, None
    keyless = authorization is None and x_api_key is None
    if access.keys is None or (preflight and keyless):
        return Verdict.ALLOWED, None
    if keyless:
        return Verdict.NO_KEY, None
    secret = presented(authorization, x_api_key)
    key = None if secret is None else find_key(access.keys, secret)
    if key is None:
        return Verdict.BAD_KEY, None
    return Verdict.ALLOWED, key


#: A LAN caller where no key file is named: every model, no managing.
LAN_KEYLESS = Caller(manage=False, lan=True)


def caller_of(key: Key | None) -> Caller:
    """The LAN caller a valid key (or none) makes."""
    if key is None:
        return LAN_KEYLESS
    return Caller(key.name, key.models, key.manage, lan=True, priority=key.priority)


def keyed_loopback_caller(key: Key | None) -> Caller:
    """A loopback caller that ``loopback-keys`` asked for a key: its key's in full, ``manage``
    included, as a LAN caller's; None (a keyless preflight) uses no model
    (docs/lan.md#a-shared-machine)."""
    if key is None:
        return KEYLESS
    return Caller(key.name, key.models, key.manage, priority=key.priority)


def loopback_caller(
    access: Access,
    authorization: Sequence[bytes] | None,
    x_api_key: Sequence[bytes] | None = None,
) -> Caller:
    """A loopback caller needs no key; one that presents a valid key (:func:`presented`) is
    that key's, its patterns included."""
    secret = presented(authorization, x_api_key) if access.keys else None
    key = None if secret is None or access.keys is None else find_key(access.keys, secret)
    # Loopback callers may manage whatever their key says: the machine is the operator's.
    if key is None:
        return KEYLESS
    return Caller(key.name, key.models, priority=key.priority)
