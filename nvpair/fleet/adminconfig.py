"""The fleet file's ``[admin]``: the LAN address the admin listener also listens on, checked
against the ``[access]`` it relies on (docs/lan.md#the-admin-view-from-the-lan).

Pure: a table and the parsed ``[access]`` in, an :class:`AdminLan` or an :class:`AdminError`
out. What a caller must present is :mod:`nvpair.fleet.adminpolicy`'s.
"""

from __future__ import annotations

import ipaddress

from attrs import frozen

from nvpair.fleet.lanconfig import Access


class AdminError(ValueError):
    """``[admin]`` cannot be used; the message names the key that is wrong."""


@frozen
class AdminLan:
    """``[admin]``: the admin listener also listens on ``bind`` (its port is ``--admin-port``).

    :ivar bind: one address of this machine, as :mod:`ipaddress` writes it.
    """

    bind: str


def parse_admin(table: object, access: Access | None) -> AdminLan | None:
    """The ``[admin]`` table, or None when the file has none.

    Refused rather than guessed: a bind that is no address, or is loopback or every address
    (the listener is on 127.0.0.1 already, and one socket on every address would collide with
    it), and an ``[admin]`` that would let nobody in — no ``[access]`` networks, no key file,
    no key with ``admin = true`` — since an operator who wrote it expects a scrape to work.

    :raises AdminError: naming the key (``admin.bind``) and what is wrong.
    """
    if table is None:
        return None
    if not isinstance(table, dict):
        raise AdminError("admin: must be a table ([admin])")
    unknown = sorted(set(table) - {"bind"})
    if unknown:
        raise AdminError(f"admin: unknown key(s) {', '.join(unknown)}")
    bind = table.get("bind")
    if not isinstance(bind, str):
        raise AdminError('admin.bind: must be an address of this machine such as "192.168.1.10"')
    try:
        address = ipaddress.ip_address(bind.strip())
    except ValueError:
        raise AdminError(f"admin.bind: {bind!r} is not an IP address") from None
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        raise AdminError(
            f"admin.bind: {bind!r} must be one LAN address of this machine "
            "(the admin listener is on 127.0.0.1 already)"
        )
    if access is None:
        raise AdminError("admin: needs [access] with networks and a key file (keys = ...)")
    if access.keys is None:
        raise AdminError("admin: needs access.keys: a LAN caller of it must present a key")
    if not any(key.admin for key in access.keys):
        raise AdminError("admin: no key of access.keys says admin = true")
    return AdminLan(str(address))
