"""A second network namespace, for callers that are not loopback (issues 6 and 22).

The proxy listens on ``::`` in the host's namespace; a process run inside the namespace (with
``ip netns exec``) reaches it at the host side of a veth pair, from a non-loopback address, as
a machine on the LAN would.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from attrs import frozen


@frozen
class Namespace:
    """:ivar name: for ``ip netns exec``; :ivar host_ip: the proxy's machine as the namespace
    reaches it; :ivar ns_ip: the caller's address; :ivar network: the pair's /30;
    :ivar host_if: the host's end of the veth pair; :ivar ns_if: the namespace's."""

    name: str
    host_ip: str
    ns_ip: str
    network: str
    host_if: str = ""
    ns_if: str = ""

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@contextlib.contextmanager
def lan_namespace(names: Sequence[str] = ()) -> Iterator[Namespace]:
    """A namespace joined to this host by a veth pair on a /30 of its own: each test (and
    each suite run at once on this machine) draws its own, so no two share an address.

    :param names: host names that resolve, inside the namespace, to this host's side (its
        ``/etc/hosts``: ``ip netns exec`` mounts ``/etc/netns/<name>/hosts`` over it).
    """
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed: cannot create a network namespace")
    tag = uuid.uuid4().hex[:6]
    ns, host_if, ns_if = f"nvp{tag}", f"nvh{tag}", f"nvn{tag}"
    base = f"10.{random.randrange(232, 250)}.{random.randrange(256)}.{4 * random.randrange(64)}"
    prefix, last = base.rsplit(".", 1)
    host_ip, ns_ip = f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    try:
        ip("netns", "add", ns)
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"network namespaces are not permitted here: {error}")
    etc = Path("/etc/netns") / ns
    try:
        if names:
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{host_ip} {' '.join(names)}\n")
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        ip("netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield Namespace(ns, host_ip, ns_ip, f"{base}/30", host_if, ns_if)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        if names:
            shutil.rmtree(etc, ignore_errors=True)


@frozen
class MoreAddresses:
    """Addresses a namespace's callers may also come from (:func:`more_addresses`).

    :ivar ipv4: addresses of a /24 routed to the namespace, outside its /30;
    :ivar host_ipv6: the proxy's machine on an IPv6 /64 shared with the namespace;
    :ivar ipv6: the namespace's addresses on that /64.
    """

    ipv4: tuple[str, ...]
    host_ipv6: str
    ipv6: tuple[str, ...]


def more_addresses(lan: Namespace, ipv4: int, ipv6: int) -> MoreAddresses:
    """Give the namespace ``ipv4`` more IPv4 addresses (routed from this host through it) and
    ``ipv6`` addresses of one IPv6 /64 (this host has one too): many callers, or one caller
    that takes address after address of its /64. Gone with the namespace and its veth pair."""
    block = f"10.{random.randrange(250, 254)}.{random.randrange(256)}"
    groups = (random.randrange(256), *(random.randrange(1, 0x10000) for _ in range(3)))
    prefix = "fd{:02x}:{:x}:{:x}:{:x}".format(*groups)
    v4 = tuple(f"{block}.{n}" for n in range(1, ipv4 + 1))
    v6 = tuple(f"{prefix}::{n + 2:x}" for n in range(ipv6))
    # nodad: usable at once, with no duplicate detection to wait for.
    inside = [f"addr add {a}/32 dev {lan.ns_if}" for a in v4]
    inside += [f"addr add {a}/64 dev {lan.ns_if} nodad" for a in v6]
    outside = [
        f"route add {block}.0/24 via {lan.ns_ip} dev {lan.host_if}",
        f"addr add {prefix}::1/64 dev {lan.host_if} nodad",
    ]
    for namespace, lines in ((["-n", lan.name], inside), ([], outside)):
        subprocess.run(
            ["ip", *namespace, "-batch", "-"],
            input="\n".join(lines) + "\n",
            text=True,
            check=True,
            capture_output=True,
            timeout=30,
        )
    return MoreAddresses(v4, f"{prefix}::1", v6)
