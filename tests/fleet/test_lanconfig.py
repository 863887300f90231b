"""``[access]`` and its key file, read and checked once (docs/lan.md)."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from pathlib import Path

import pytest

from nvpair.engines.caller import Priority
from nvpair.fleet.file import FleetFileError, load_fleet
from nvpair.fleet.lanconfig import (
    SECRET_PREFIX,
    Access,
    AccessError,
    Key,
    LanTls,
    digest_of,
    new_key,
    parse_access,
    parse_keys,
)
from tests.certs import issue, make_ca

DIGEST = "ab" * 32

FLEET = '[facades.ollama]\nport = 0\n[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "http://h:1"\n'


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_without_access_a_fleet_has_none(tmp_path: Path) -> None:
    """A fleet file without ``[access]`` is today's: nobody but loopback."""
    assert load_fleet(write(tmp_path / "fleet.toml", FLEET)).access is None


def test_networks_keys_and_tls_relative_to_the_fleet_file(tmp_path: Path) -> None:
    ca = make_ca()
    server = issue(ca, ["gpu.lan"])
    write(tmp_path / "lan.crt", server.cert_pem + ca.cert_pem)
    write(tmp_path / "lan.key", server.key_pem)
    write(
        tmp_path / "keys.toml",
        f'[[keys]]\nname = "laptop"\nsha256 = "{DIGEST.upper()}"\n'
        f'[[keys]]\nname = "phone"\nsha256 = "{"cd" * 32}"\nmodels = ["llama3*", "qwen2.5:*"]\n'
        'manage = true\npriority = "low"\n',
    )
    fleet = load_fleet(
        write(
            tmp_path / "fleet.toml",
            FLEET + '[access]\nnetworks = ["192.168.1.0/24", "fd00::/8"]\nkeys = "keys.toml"\n'
            'tls-cert = "lan.crt"\ntls-key = "lan.key"\n',
        )
    )
    assert fleet.access == Access(
        (ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd00::/8")),
        (
            Key("laptop", bytes.fromhex(DIGEST)),
            Key(
                "phone",
                bytes.fromhex("cd" * 32),
                ("llama3*", "qwen2.5:*"),
                manage=True,
                priority=Priority.LOW,
            ),
        ),
        LanTls(server.cert_pem + ca.cert_pem, server.key_pem),
        require_tls=True,
    )


def test_require_tls_is_the_default_with_tls_and_only_possible_with_it(tmp_path: Path) -> None:
    """docs/lan.md#plaintext-from-the-lan: TLS served is TLS required unless ``require-tls =
    false``; required without TLS would refuse every LAN caller, so it is a usage error."""
    server = issue(make_ca(), ["gpu.lan"])
    write(tmp_path / "lan.crt", server.cert_pem)
    write(tmp_path / "lan.key", server.key_pem)
    tls = {"networks": ["10.0.0.0/8"], "tls-cert": "lan.crt", "tls-key": "lan.key"}
    required = parse_access(tls, tmp_path)
    assert required is not None and required.require_tls
    opted_out = parse_access({**tls, "require-tls": False}, tmp_path)
    assert opted_out is not None and not opted_out.require_tls
    plain = {"networks": ["10.0.0.0/8"]}
    assert parse_access(plain, tmp_path) == parse_access({**plain, "require-tls": False}, tmp_path)
    access = parse_access(plain, tmp_path)
    assert access is not None and not access.require_tls
    with pytest.raises(
        AccessError, match=r"^access.require-tls: needs access.tls-cert and access.tls-key$"
    ):
        parse_access({**plain, "require-tls": True}, tmp_path)
    with pytest.raises(AccessError, match=r"^access.require-tls: must be true or false$"):
        parse_access({**tls, "require-tls": "yes"}, tmp_path)


def test_no_networks_is_no_access_but_the_key_file_is_still_checked(tmp_path: Path) -> None:
    """``networks = []`` changes nothing; a broken key file is said all the same."""
    write(tmp_path / "keys.toml", f'[[keys]]\nname = "a"\nsha256 = "{DIGEST}"\n')
    assert parse_access({"networks": [], "keys": "keys.toml"}, tmp_path) is None
    write(tmp_path / "keys.toml", '[[keys]]\nname = "a"\nsha256 = "nope"\n')
    with pytest.raises(AccessError, match=r"keys\[0\]\.sha256: must be 64 hex digits"):
        parse_access({"networks": [], "keys": "keys.toml"}, tmp_path)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([], "access: must be a table"),
        ({"network": []}, "access: unknown key(s) network"),
        ({"networks": "10.0.0.0/8"}, "access.networks: must be a list"),
        ({"networks": ["10.0.0.1/8"]}, "access.networks[0]: not a network: 10.0.0.1/8 has host"),
        ({"networks": ["10.0.0.0/8", 7]}, "access.networks[1]: must be a network"),
        ({"networks": ["x"]}, "access.networks[0]: not a network"),
        ({"networks": ["10.0.0.0/8"], "keys": ""}, "access.keys: must be a file name"),
        ({"networks": ["10.0.0.0/8"], "keys": "absent.toml"}, "access.keys: cannot read"),
        ({"networks": ["10.0.0.0/8"], "tls-cert": "a"}, "access.tls-cert: needs access.tls-key"),
        ({"networks": ["10.0.0.0/8"], "tls-key": "a"}, "access.tls-key: needs access.tls-cert"),
    ],
)
def test_a_bad_access_table_names_its_key(tmp_path: Path, table: object, message: str) -> None:
    with pytest.raises(AccessError) as raised:
        parse_access(table, tmp_path)
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[keys]]\nname = 'a'\nsha256 = '", "k.toml: not valid TOML"),
        ("other = 1\n", "k.toml: unknown key(s) other"),
        ("keys = 1\n", "k.toml: keys: must be an array of tables"),
        ("keys = [1]\n", "k.toml: keys[0]: must be a table"),
        (f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\nsecret = 'x'\n", "keys[0]: unknown key(s)"),
        (f"[[keys]]\nsha256 = '{DIGEST}'\n", "keys[0].name: must be 1-64 letters"),
        (f"[[keys]]\nname = 'a b'\nsha256 = '{DIGEST}'\n", "keys[0].name: must be 1-64"),
        (f"[[keys]]\nname = '{'a' * 65}'\nsha256 = '{DIGEST}'\n", "keys[0].name: must be 1-64"),
        ("[[keys]]\nname = 'a'\nsha256 = 'abc'\n", "keys[0].sha256: must be 64 hex digits"),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\nmodels = 'llama3'\n",
            "keys[0].models: must be a list of model name patterns",
        ),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\nmodels = ['']\n",
            "keys[0].models: must be a list",
        ),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\nmanage = 'yes'\n",
            "keys[0].manage: must be true or false",
        ),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\npriority = 'urgent'\n",
            'keys[0].priority: must be "high", "normal" or "low"',
        ),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\n"
            f"[[keys]]\nname = 'a'\nsha256 = '{'cd' * 32}'\n",
            "keys[1].name: 'a' is another key's name",
        ),
        (
            f"[[keys]]\nname = 'a'\nsha256 = '{DIGEST}'\n"
            f"[[keys]]\nname = 'b'\nsha256 = '{DIGEST}'\n",
            "keys[1].sha256: is also key 'a''s",
        ),
    ],
)
def test_a_bad_key_file_names_its_key(text: str, message: str) -> None:
    with pytest.raises(AccessError, match=re.escape(message)):
        parse_keys(text.encode(), "k.toml")


def test_an_empty_key_file_lets_no_key_in() -> None:
    """A key file with no key: every LAN caller needs one, and none is valid."""
    assert parse_keys(b"", "k.toml") == ()


def test_a_bad_key_file_is_a_fleet_file_error_naming_both_files(tmp_path: Path) -> None:
    """At start a usage error, at SIGHUP the running configuration kept: both read a
    FleetFileError (tests/integration/test_lan.py has the SIGHUP)."""
    write(tmp_path / "keys.toml", '[[keys]]\nname = "a"\nsha256 = "x"\n')
    path = write(
        tmp_path / "fleet.toml", FLEET + '[access]\nnetworks = ["10.0.0.0/8"]\nkeys = "keys.toml"\n'
    )
    with pytest.raises(FleetFileError) as raised:
        load_fleet(path)
    assert str(raised.value) == (
        f"{path}: access.keys: {tmp_path / 'keys.toml'}: keys[0].sha256: must be 64 hex "
        "digits: the SHA-256 of the secret"
    )


def test_tls_certificate_and_key_must_be_pem_and_a_pair(tmp_path: Path) -> None:
    ca = make_ca()
    server, other = issue(ca, ["a.lan"]), issue(ca, ["b.lan"])
    table = {"networks": ["10.0.0.0/8"], "tls-cert": "c.pem", "tls-key": "k.pem"}
    write(tmp_path / "c.pem", b"not a certificate")
    write(tmp_path / "k.pem", server.key_pem)
    with pytest.raises(AccessError, match=r"^access.tls-cert: holds no PEM certificate$"):
        parse_access(table, tmp_path)
    write(tmp_path / "c.pem", server.cert_pem)
    write(tmp_path / "k.pem", b"-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    with pytest.raises(AccessError, match=r"^access.tls-key: holds no unencrypted PEM"):
        parse_access(table, tmp_path)
    write(tmp_path / "k.pem", other.key_pem)
    with pytest.raises(AccessError, match=r"^access.tls-key: is not the key of"):
        parse_access(table, tmp_path)
    write(tmp_path / "k.pem", server.key_pem)
    access = parse_access(table, tmp_path)
    assert access is not None and access.tls == LanTls(server.cert_pem, server.key_pem)


def test_a_new_key_is_random_prefixed_and_its_block_names_its_digest() -> None:
    """``--new-key``: 32 random bytes as URL-safe text after ``nvp_``; the block is a key
    file's entry whose digest is the secret's."""
    secret, block = new_key("laptop")
    again, _ = new_key("laptop")
    assert secret != again
    assert re.fullmatch(rf"{SECRET_PREFIX}[A-Za-z0-9_-]{{43}}", secret)
    (key,) = parse_keys(block.encode(), "block")
    assert key == Key("laptop", hashlib.sha256(secret.encode()).digest())
    assert digest_of(secret.encode()) == key.digest


@pytest.mark.parametrize("name", ["", "a b", "-a", "x" * 65, "é"])
def test_a_new_key_needs_a_key_name(name: str) -> None:
    with pytest.raises(AccessError, match=r"--new-key: .* must be 1-64 letters"):
        new_key(name)


def test_the_example_fleet_files_access_uncommented_is_an_access(tmp_path: Path) -> None:
    """The shipped example shows [access] commented out; uncommented, beside the files it
    names, it is read as it says."""
    from nvpair import examples

    text = examples.text(examples.FLEET)
    start = text.index("# [access]")
    # The block runs to the first blank line: other commented tables follow it.
    lines = text[start:].split("\n\n", 1)[0].splitlines()
    block = "\n".join(line.removeprefix("# ") for line in lines)
    ca = make_ca()
    server = issue(ca, ["gpu.lan"])
    write(tmp_path / "lan.crt", server.cert_pem)
    write(tmp_path / "lan.key", server.key_pem)
    write(tmp_path / "keys.toml", new_key("laptop")[1])
    fleet = load_fleet(write(tmp_path / "fleet.toml", text + "\n" + block + "\n"))
    assert fleet.access is not None
    assert fleet.access.networks == (ipaddress.ip_network("192.168.1.0/24"),)
    assert fleet.access.keys is not None and [k.name for k in fleet.access.keys] == ["laptop"]
    assert fleet.access.tls == LanTls(server.cert_pem, server.key_pem)


def test_tls_from_systemd_credentials(tmp_path: Path) -> None:
    """docs/lan.md#as-a-service: ``credential:NAME`` is ``$CREDENTIALS_DIRECTORY/NAME``, so a
    dynamic user reads systemd's copy of a key it could not read where it is."""
    server = issue(make_ca(), ["gpu.lan"])
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    write(credentials / "lan.crt", server.cert_pem)
    write(credentials / "lan.key", server.key_pem)
    table = {
        "networks": ["10.0.0.0/8"],
        "tls-cert": "credential:lan.crt",
        "tls-key": "credential:lan.key",
    }
    environ = {"CREDENTIALS_DIRECTORY": str(credentials)}
    access = parse_access(table, tmp_path / "elsewhere", environ)
    assert access is not None and access.tls == LanTls(server.cert_pem, server.key_pem)
    with pytest.raises(AccessError, match=r"^access.tls-cert: credential lan.crt: .*not set"):
        parse_access(table, tmp_path, {})
    with pytest.raises(AccessError, match=r"^access.tls-key: credential '../k' is not a file"):
        parse_access({**table, "tls-key": "credential:../k"}, tmp_path, environ)
    (credentials / "lan.key").unlink()
    with pytest.raises(AccessError, match=r"^access.tls-key: cannot read .*lan.key"):
        parse_access(table, tmp_path, environ)
