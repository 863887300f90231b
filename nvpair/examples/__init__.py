"""The files a user installs beside the proxy, shipped inside the package: a ``pip install``
has them without the source tree, and ``nvpair-proxy --example-fleet`` and ``nvpair-proxy
--systemd-unit`` print them (docs/README.md#command-line). These are the only copies.
"""

from __future__ import annotations

from importlib import resources

#: The commented example fleet file.
FLEET = "fleet.example.toml"

#: The systemd unit that runs fleet mode from /etc/nvpair/fleet.toml.
SYSTEMD_UNIT = "nvpair-proxy.service"


def text(name: str) -> str:
    """One shipped file's text, as installed."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
