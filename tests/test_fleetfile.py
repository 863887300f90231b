"""The fleet file's worst cases (nvpair/fleetfile.py): each is a FleetFileError naming what
is wrong, which the process reports in one line at start and on SIGHUP keeps its fleet for;
never another exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvpair.fleetfile import FleetFileError, load_fleet

HEAD = '[facades.ollama]\nport = 11434\n[[nodes]]\nid = "a"\n[nodes.engines]\n'


@pytest.mark.parametrize(
    "url", ["http://[abc", "http://a:99999", "http://a:port", "https://a", "http://", 7]
)
def test_a_url_that_is_no_http_url_names_its_key(tmp_path: Path, url: object) -> None:
    path = tmp_path / "fleet.toml"
    value = f'"{url}"' if isinstance(url, str) else str(url)
    path.write_text(HEAD + f"ollama = {value}\n")
    with pytest.raises(FleetFileError, match=r"nodes\[0\]\.engines\.ollama.*http:// URL"):
        load_fleet(path)


def test_nesting_too_deep_for_the_parser_is_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(FleetFileError, match="not valid TOML"):
        load_fleet(path)


def test_a_good_url_with_a_port_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(HEAD + 'ollama = "http://[::1]:11435"\n')
    assert load_fleet(path).nodes[0].engines == {"ollama": "http://[::1]:11435"}
