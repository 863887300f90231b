"""Pure decisions about a caller of the admin listener's LAN address
(docs/lan.md#the-admin-view-from-the-lan).

Values in, values out: no clock, no socket. :class:`nvpair.fleet.langate.LanGate` applies them
with the failed-key throttle the facades share; what a facade's caller may do is
:mod:`nvpair.fleet.lanpolicy`'s, whose key lookup this reuses.
"""

from __future__ import annotations

import binascii
import enum
from collections.abc import Sequence

from nvpair.fleet.lanconfig import Access, Key
from nvpair.fleet.lanpolicy import IPAddress, bearer, find_key, in_networks

#: ``Authorization``'s scheme for a browser's prompt (RFC 7617), compared case-insensitively.
_BASIC = b"basic "

#: The one route any caller that reaches the listener may use: a load balancer's check.
OPEN_PATHS = frozenset({b"/healthz"})


class AdminVerdict(enum.Enum):
    """What a request to the admin listener decides, before the throttle has its say."""

    SERVE = "serve"
    #: No ``[admin]`` in force, or from outside ``[access]``'s networks: 403 ``forbidden``.
    FORBIDDEN = "forbidden"
    #: Over plaintext where ``[access]`` serves TLS: 403 ``tls-required``, the key not judged.
    TLS_REQUIRED = "tls-required"
    #: No key presented: 401, not counted against the address.
    NO_KEY = "no-key"
    #: A key of the file without ``admin = true``: 401, not counted (it is no guess).
    NOT_ADMIN = "not-admin"
    #: A key that is none of the file's: 401, counted against the address.
    BAD_KEY = "bad-key"


def basic_password(values: Sequence[bytes] | None) -> bytes | None:
    """The password of exactly one ``Authorization: Basic <base64 user:password>``, or None.

    The user name is anything, empty included: a browser's prompt asks for both, and the key
    is the password.
    """
    if values is None or len(values) != 1:
        return None
    value = values[0].strip()
    if value[: len(_BASIC)].lower() != _BASIC:
        return None
    try:
        decoded = binascii.a2b_base64(value[len(_BASIC) :].strip(), strict_mode=True)
    except binascii.Error:
        return None
    _user, colon, password = decoded.partition(b":")
    return password if colon and password else None


def admin_secret(values: Sequence[bytes] | None) -> bytes | None:
    """The secret an ``Authorization`` field presents: as Bearer (Prometheus'
    ``authorization``) or as Basic's password (a browser, Prometheus' ``basic_auth``)."""
    return bearer(values) or basic_password(values)


def judge_admin(
    access: Access | None,
    ip: IPAddress | None,
    *,
    tls_served: bool,
    over_tls: bool,
    method: bytes,
    path: bytes,
    authorization: Sequence[bytes] | None,
) -> tuple[AdminVerdict, Key | None]:
    """A non-loopback caller's verdict on the admin listener, and its key when it is served
    for one.

    :param access: the ``[access]`` in force; None when no ``[admin]`` is (LAN callers are
        refused then, whatever they present).
    :param tls_served: ``[access]`` serves TLS now, so plaintext from the LAN is refused.
    :param over_tls: this request came over TLS.
    """
    if access is None or not in_networks(ip, access.networks):
        return AdminVerdict.FORBIDDEN, None
    if method in (b"GET", b"HEAD") and path in OPEN_PATHS:
        return AdminVerdict.SERVE, None
    if tls_served and not over_tls:
        return AdminVerdict.TLS_REQUIRED, None
    if authorization is None:
        return AdminVerdict.NO_KEY, None
    secret = admin_secret(authorization)
    key = None if secret is None or access.keys is None else find_key(access.keys, secret)
    if key is None:
        return AdminVerdict.BAD_KEY, None
    if not key.admin:
        return AdminVerdict.NOT_ADMIN, key
    return AdminVerdict.SERVE, key
