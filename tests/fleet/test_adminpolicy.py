"""The admin listener's LAN address, decided from values: ``[admin]`` read against ``[access]``,
and what a caller must present (docs/lan.md#the-admin-view-from-the-lan)."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import pytest

from nvpair.fleet.adminconfig import AdminError, AdminLan, parse_admin
from nvpair.fleet.adminpolicy import (
    AdminVerdict,
    admin_secret,
    basic_password,
    judge_admin,
)
from nvpair.fleet.file import FleetFileError, load_fleet, restart_needed
from nvpair.fleet.lanconfig import Access, Key, digest_of, parse_keys
from nvpair.fleet.lanpolicy import IPAddress

LAN = (ipaddress.ip_network("192.168.1.0/24"),)
LAPTOP = Key("laptop", digest_of(b"nvp_laptop"))
SCRAPER = Key("scraper", digest_of(b"nvp_scraper"), admin=True)
KEYED = Access(LAN, (LAPTOP, SCRAPER))
HOME = ipaddress.ip_address("192.168.1.7")
AWAY = ipaddress.ip_address("10.0.0.7")


def basic(user: bytes, password: bytes) -> bytes:
    return b"Basic " + base64.b64encode(user + b":" + password)


def verdict(
    authorization: bytes | None,
    *,
    access: Access | None = KEYED,
    ip: IPAddress = HOME,
    path: bytes = b"/metrics",
    method: bytes = b"GET",
    tls_served: bool = False,
    over_tls: bool = False,
) -> AdminVerdict:
    found, _ = judge_admin(
        access,
        ip,
        tls_served=tls_served,
        over_tls=over_tls,
        method=method,
        path=path,
        authorization=None if authorization is None else [authorization],
    )
    return found


def test_an_admin_key_is_served_as_bearer_or_as_basics_password_whatever_the_user() -> None:
    assert verdict(b"Bearer nvp_scraper") is AdminVerdict.SERVE
    assert verdict(b"bearer  nvp_scraper ") is AdminVerdict.SERVE
    assert verdict(basic(b"prometheus", b"nvp_scraper")) is AdminVerdict.SERVE
    assert verdict(basic(b"", b"nvp_scraper")) is AdminVerdict.SERVE
    # Only the password is the key: a colon in it is kept (RFC 7617 splits at the first).
    assert basic_password([basic(b"me", b"a:b")]) == b"a:b"


def test_a_key_without_admin_is_refused_but_is_no_guess() -> None:
    """A facade's valid key is 401 here, and not counted as a failed key."""
    assert verdict(b"Bearer nvp_laptop") is AdminVerdict.NOT_ADMIN
    assert verdict(basic(b"me", b"nvp_laptop")) is AdminVerdict.NOT_ADMIN


@pytest.mark.parametrize(
    "authorization",
    [
        b"Bearer nvp_wrong",
        basic(b"prometheus", b"nvp_wrong"),
        basic(b"nvp_scraper", b""),  # the key as the user name is not the password
        b"Basic !!!not-base64",
        b"Basic " + base64.b64encode(b"no colon nvp_scraper"),
        b"Digest nvp_scraper",
        b"nvp_scraper",
    ],
)
def test_anything_else_presented_is_a_bad_key(authorization: bytes) -> None:
    assert verdict(authorization) is AdminVerdict.BAD_KEY


def test_no_key_at_all_is_not_a_bad_key() -> None:
    assert verdict(None) is AdminVerdict.NO_KEY


def test_several_authorization_fields_present_no_secret() -> None:
    assert admin_secret([b"Bearer nvp_scraper", b"Bearer nvp_scraper"]) is None
    assert admin_secret([b"Bearer nvp_scraper"]) == b"nvp_scraper"


def test_healthz_needs_no_key_tls_or_not_and_nothing_else_is_open() -> None:
    assert verdict(None, path=b"/healthz") is AdminVerdict.SERVE
    assert verdict(None, path=b"/healthz", method=b"HEAD") is AdminVerdict.SERVE
    assert verdict(None, path=b"/healthz", tls_served=True) is AdminVerdict.SERVE
    assert verdict(None, path=b"/healthz", method=b"POST") is AdminVerdict.NO_KEY
    for path in (b"/", b"/status", b"/readyz", b"/healthz/", b"/metrics"):
        assert verdict(None, path=path) is AdminVerdict.NO_KEY


def test_plaintext_where_tls_is_served_is_refused_before_the_key_is_judged() -> None:
    """The key crossed in clear: neither judged nor counted (docs/lan.md#plaintext-from-the-lan)."""
    for authorization in (b"Bearer nvp_scraper", b"Bearer nvp_wrong", None):
        assert verdict(authorization, tls_served=True) is AdminVerdict.TLS_REQUIRED
    assert verdict(b"Bearer nvp_scraper", tls_served=True, over_tls=True) is AdminVerdict.SERVE


def test_outside_the_networks_or_without_admin_nobody_is_served() -> None:
    assert verdict(b"Bearer nvp_scraper", ip=AWAY) is AdminVerdict.FORBIDDEN
    assert verdict(None, ip=AWAY, path=b"/healthz") is AdminVerdict.FORBIDDEN
    assert verdict(b"Bearer nvp_scraper", access=None) is AdminVerdict.FORBIDDEN


# -- [admin] read against [access] ----------------------------------------------------------------


def test_an_admin_table_names_one_address() -> None:
    assert parse_admin(None, KEYED) is None
    assert parse_admin({"bind": "192.168.1.10"}, KEYED) == AdminLan("192.168.1.10")
    assert parse_admin({"bind": " fd00::0010 "}, KEYED) == AdminLan("fd00::10")


@pytest.mark.parametrize(
    ("table", "access", "why"),
    [
        ({"bind": "gpu-host.lan"}, KEYED, "admin.bind: 'gpu-host.lan' is not an IP address"),
        ({"bind": "192.168.1.10:21500"}, KEYED, "is not an IP address"),
        ({"bind": 192}, KEYED, "admin.bind: must be an address"),
        ({}, KEYED, "admin.bind: must be an address"),
        ({"bind": "0.0.0.0"}, KEYED, "must be one LAN address of this machine"),
        ({"bind": "::"}, KEYED, "must be one LAN address of this machine"),
        ({"bind": "127.0.0.1"}, KEYED, "the admin listener is on 127.0.0.1 already"),
        ({"bind": "192.168.1.10", "port": 1}, KEYED, "admin: unknown key(s) port"),
        ("192.168.1.10", KEYED, "admin: must be a table"),
        ({"bind": "192.168.1.10"}, None, "admin: needs [access] with networks and a key file"),
        ({"bind": "192.168.1.10"}, Access(LAN), "admin: needs access.keys"),
        ({"bind": "192.168.1.10"}, Access(LAN, (LAPTOP,)), "no key of access.keys says admin"),
    ],
)
def test_an_admin_table_nobody_could_use_is_refused_saying_why(
    table: object, access: Access | None, why: str
) -> None:
    with pytest.raises(AdminError, match=r"^admin") as raised:
        parse_admin(table, access)
    assert why in str(raised.value)


def test_a_key_file_says_admin_true_or_false_and_nothing_else() -> None:
    digest = "ab" * 32
    block = f'[[keys]]\nname = "scraper"\nsha256 = "{digest}"\n'
    assert parse_keys((block + "admin = true\n").encode(), "k")[0].admin is True
    assert parse_keys(block.encode(), "k")[0].admin is False
    with pytest.raises(ValueError, match=r"keys\[0\]\.admin: must be true or false"):
        parse_keys((block + 'admin = "yes"\n').encode(), "k")


def fleet(tmp_path: Path, admin: str, name: str = "fleet.toml") -> Path:
    digest = digest_of(b"nvp_scraper").hex()
    (tmp_path / "keys.toml").write_text(
        f'[[keys]]\nname = "scraper"\nsha256 = "{digest}"\nadmin = true\n'
    )
    path = tmp_path / name
    path.write_text(
        '[facades.ollama]\nport = 11435\n[access]\nnetworks = ["192.168.1.0/24"]\n'
        f'keys = "keys.toml"\n{admin}'
    )
    return path


def test_the_fleet_file_reads_admin_and_a_bad_one_is_its_error(tmp_path: Path) -> None:
    loaded = load_fleet(fleet(tmp_path, '[admin]\nbind = "192.168.1.10"\n'))
    assert loaded.admin == AdminLan("192.168.1.10")
    assert load_fleet(fleet(tmp_path, "")).admin is None
    with pytest.raises(FleetFileError, match=r"fleet\.toml: admin\.bind: 'x' is not an IP"):
        load_fleet(fleet(tmp_path, '[admin]\nbind = "x"\n'))


def test_a_changed_or_added_bind_needs_a_restart_a_removed_admin_does_not(
    tmp_path: Path,
) -> None:
    first = load_fleet(fleet(tmp_path, '[admin]\nbind = "192.168.1.10"\n', "a.toml"))
    moved = load_fleet(fleet(tmp_path, '[admin]\nbind = "192.168.1.11"\n', "b.toml"))
    none = load_fleet(fleet(tmp_path, "", "c.toml"))
    assert restart_needed(first, moved) == ["admin.bind 192.168.1.10 -> 192.168.1.11"]
    assert restart_needed(none, first) == ["admin added"]
    assert restart_needed(first, none) == []
    assert restart_needed(first, first) == []


def test_admin_without_admin_port_is_a_usage_error_and_with_it_a_config(tmp_path: Path) -> None:
    from twisted.python.usage import UsageError

    from nvpair.tap import Options

    path = str(fleet(tmp_path, '[admin]\nbind = "192.168.1.10"\n'))
    with pytest.raises(UsageError, match=r"\[admin\] bind needs --admin-port"):
        Options({"HOME": str(tmp_path)}).parseOptions(["--fleet", path])
    options = Options({"HOME": str(tmp_path)})
    options.parseOptions(["--fleet", path, "--admin-port", "21500"])
    assert options.config is not None and options.config.fleet is not None
    assert options.config.fleet.admin == AdminLan("192.168.1.10")


def test_the_examples_admin_uncommented_with_an_admin_key_is_an_admin(tmp_path: Path) -> None:
    """The shipped example's commented [admin], uncommented beside a keyed [access]."""
    from nvpair import examples

    text = examples.text(examples.FLEET)
    lines = text[text.index("# [admin]") :].split("\n\n", 1)[0].splitlines()
    block = "\n".join(line.removeprefix("# ") for line in lines)
    path = fleet(tmp_path, block + "\n")
    assert load_fleet(path).admin == AdminLan("192.168.1.10")
