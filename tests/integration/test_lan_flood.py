"""A LAN flood of idle connections and half-finished TLS handshakes against fleet mode, from
many addresses of a second network namespace, while loopback and a keyed LAN caller go on
being answered (docs/robustness.md#connection-bounds, issue 29).

The proxy runs with an open-files limit of :data:`OPEN_FILES`, so the flood reaches the LAN's
share of it: the reserve, not the flood, decides whether loopback callers are answered.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.threads import deferToThread
from twisted.python.failure import Failure

from nvpair.fleet.lanconfig import new_key
from nvpair.wire.trust.connbounds import HANDSHAKES, PER_SOURCE, lan_capacity
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import free_port, open_fds
from tests.integration.netns import lan_namespace, more_addresses
from tests.integration.test_lan import fleet_file, keys_file, listed, tls_access

#: The proxy's open-files limit: its LAN share is 384 connections.
OPEN_FILES = 512

#: The flood's waves: TLS ClientHellos then silence, from a few addresses (past the bound on
#: handshakes and past each address's bound); one idle connection from each of many addresses
#: of one IPv6 /64; idle connections from more addresses, past the LAN's share.
TLS_SOURCES, TLS_EACH, IDLE_AFTER_TLS = 5, 60, 10
IPV6_ADDRESSES = 100
IDLE_SOURCES, IDLE_EACH = 4, 70

_FLOOD = r"""
import asyncio, http.client, json, resource, socket, ssl, sys, threading, time

spec = json.loads(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, key = spec["host"], spec["port"], spec["key"]
trusted = ssl.create_default_context(cafile=spec["ca"])


def say(**fields):
    print(json.dumps(fields), flush=True)


def client_hello():
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="gpu.lan")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def ask(connection):
    connection.request("GET", "/api/tags", headers={"Authorization": "Bearer " + key})
    response = connection.getresponse()
    response.read()
    return response.status


def fresh():
    try:
        return ask(http.client.HTTPSConnection(host, port, context=trusted, timeout=5))
    except Exception as error:
        return type(error).__name__


def keyed(ready, stop, out):
    # One keep-alive connection, made before the flood, asked again and again during it.
    connection = http.client.HTTPSConnection(host, port, context=trusted, timeout=5)
    out["before"] = ask(connection)
    ready.set()
    while not stop.is_set():
        try:
            out["during"].append(ask(connection))
        except Exception as error:
            out["during"].append(type(error).__name__)
        time.sleep(0.25)


async def opened(loop, family, source, target, first):
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.bind((source, 0))
    try:
        await loop.sock_connect(sock, target)
        if first:
            await loop.sock_sendall(sock, first)
    except OSError:
        pass
    return sock, time.monotonic()


async def watched(loop, sock, since, source, kind):
    try:
        while await loop.sock_recv(sock, 65536):
            pass
    except OSError:
        pass
    sock.close()
    return {"source": source, "kind": kind, "lived": time.monotonic() - since}


async def wave(loop, family, target, plan):
    socks = await asyncio.gather(
        *(opened(loop, family, source, target, first) for source, _, first in plan)
    )
    return [
        asyncio.ensure_future(watched(loop, sock, since, source, kind))
        for (sock, since), (source, kind, first) in zip(socks, plan)
    ]


async def main():
    loop = asyncio.get_running_loop()
    out = {"during": []}
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=keyed, args=(ready, stop, out))
    thread.start()
    ready.wait(10)
    # A plaintext caller outside the networks is refused at its head, as without bounds.
    outside = http.client.HTTPConnection(host, port, source_address=(spec["ipv4"][-1], 0))
    outside.request("GET", "/api/tags")
    answer = outside.getresponse()
    out["outside"] = [answer.status, answer.getheader("x-nvpair-error")]
    outside.close()
    say(event="warm")
    sys.stdin.readline()
    hello = client_hello()
    tls, idle = spec["ipv4"][: spec["tls_sources"]], spec["ipv4"][spec["tls_sources"] :]
    plan = [(s, "tls", hello) for s in tls for _ in range(spec["tls_each"])]
    plan += [(s, "idle", b"") for s in tls for _ in range(spec["idle_after_tls"])]
    tasks = await wave(loop, socket.AF_INET, (host, port), plan)
    six = [(s, "ipv6", b"") for s in spec["ipv6"]]
    tasks += await wave(loop, socket.AF_INET6, (spec["host6"], port), six)
    more = [(s, "idle", b"") for s in idle for _ in range(spec["idle_each"])]
    tasks += await wave(loop, socket.AF_INET, (host, port), more)
    say(event="flooded", connections=len(tasks))
    await asyncio.sleep(0.5)
    out["fresh during"] = await loop.run_in_executor(None, fresh)
    done = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    stop.set()
    thread.join()
    out["fresh after"] = fresh()
    say(event="done", connections=done, **out)


asyncio.run(main())
"""


class Flood(ProcessProtocol):
    """The flood script in the namespace: its JSON lines, by event."""

    def __init__(self) -> None:
        self.events: dict[str, Deferred[dict[str, Any]]] = {
            name: Deferred() for name in ("warm", "flooded", "done")
        }
        self._buffer = b""
        self.stderr = b""
        self.ended: Deferred[None] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            record = json.loads(line)
            self.events[record["event"]].callback(record)

    def errReceived(self, data: bytes) -> None:
        self.stderr += data

    def processEnded(self, reason: Failure) -> None:
        for waiting in self.events.values():
            if not waiting.called:
                waiting.errback(AssertionError(self.stderr.decode(errors="replace")))
        self.ended.callback(None)

    def go(self) -> None:
        assert self.transport is not None
        self.transport.write(b"go\n")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError("no VmRSS")


def loopback(port: int, n: int) -> int | str:
    """One request on a new loopback connection: every third an inference, which needs an
    engine connection too."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        if n % 3 == 2:
            body = json.dumps({"model": "llama3", "prompt": "hi", "stream": False})
            connection.request("POST", "/api/generate", body=body)
        else:
            connection.request("GET", "/api/tags")
        response = connection.getresponse()
        response.read()
        return response.status
    except Exception as error:
        return type(error).__name__
    finally:
        connection.close()


async def sleep(seconds: float) -> None:
    await task.deferLater(reactor, seconds, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_lan_flood_leaves_loopback_and_keyed_callers_answered(tmp_path: Path) -> None:
    """Idle connections and unfinished handshakes from many addresses, none of them in
    ``networks``: each address holds at most 64 (an IPv6 /64 as one), at most 256 handshakes
    are in progress, the LAN holds at most its share of the open-files limit, an unfinished
    handshake is closed at 5 s and a silent connection at 10 s; meanwhile every loopback
    request and every keyed request on a LAN caller's connection is answered, and afterwards
    descriptors and memory are back near where they were."""
    key, _ = new_key("laptop")
    keys_file(tmp_path / "keys.toml", ("laptop", key, ()))
    port = free_port()
    figures: dict[str, Any] = {"open-files limit": OPEN_FILES}
    with lan_namespace() as lan:
        extra = more_addresses(lan, TLS_SOURCES + IDLE_SOURCES + 1, IPV6_ADDRESSES)
        access = tls_access(tmp_path, lan, f"{lan.ns_ip}/32")
        async with sims(("ollama", ["llama3:latest"], "node-a")) as (sim,):
            fleet = fleet_file(tmp_path / "fleet.toml", "ollama", port, {"node-a": sim.url}, access)
            async with running_proxy(
                tmp_path / "state", "--fleet", str(fleet), open_files=OPEN_FILES
            ) as proxy:
                await listed(port, "/api/tags", "models", "name", "llama3:latest")
                assert await deferToThread(loopback, port, 2) == 200
                spec = {
                    "host": lan.host_ip,
                    "host6": extra.host_ipv6,
                    "port": port,
                    "key": key,
                    "ca": str(tmp_path / "ca.crt"),
                    "ipv4": list(extra.ipv4),
                    "ipv6": list(extra.ipv6),
                    "tls_sources": TLS_SOURCES,
                    "tls_each": TLS_EACH,
                    "idle_after_tls": IDLE_AFTER_TLS,
                    "idle_each": IDLE_EACH,
                }
                flood = Flood()
                argv = lan.command(sys.executable, "-c", _FLOOD, json.dumps(spec))
                reactor.spawnProcess(flood, argv[0], argv, env=None)
                await flood.events["warm"]
                await sleep(0.5)
                pid = proxy.pid
                baseline = (open_fds(pid), rss_mib(pid))
                flood.go()
                flooded = await flood.events["flooded"]
                started = time.monotonic()
                peak = list(baseline)
                answers: list[int | str] = []
                finished = flood.events["done"]
                while not finished.called:
                    answers.append(await deferToThread(loopback, port, len(answers)))
                    peak = [max(peak[0], open_fds(pid)), max(peak[1], rss_mib(pid))]
                    await sleep(0.1)
                done = await finished
                await flood.ended
                # The last closes reach the proxy's count a moment after the client's.
                await sleep(1.0)
                after = (open_fds(pid), rss_mib(pid))

        figures.update(
            {
                "flood connections": flooded["connections"],
                "descriptors before/peak/after": (baseline[0], peak[0], after[0]),
                "RSS MiB before/peak/after": tuple(
                    round(v, 1) for v in (baseline[1], *peak[1:], after[1])
                ),
                "loopback answers during": f"{answers.count(200)}/{len(answers)}",
                "seconds flooded": round(time.monotonic() - started, 1),
            }
        )
        held = [c for c in done["connections"] if c["lived"] >= 1.0]
        per_source: dict[str, int] = {}
        for connection in held:
            source = "ipv6 /64" if connection["kind"] == "ipv6" else connection["source"]
            per_source[source] = per_source.get(source, 0) + 1
        tls = [c["lived"] for c in held if c["kind"] == "tls"]
        idle = [c["lived"] for c in held if c["kind"] != "tls"]
        figures.update(
            {
                "held": len(held),
                "held per source": per_source,
                "handshakes held": len(tls),
                "handshake lifetimes": (round(min(tls), 2), round(max(tls), 2)),
                "idle lifetimes": (round(min(idle), 2), round(max(idle), 2)),
                "keyed during": f"{done['during'].count(200)}/{len(done['during'])}",
                "keyed fresh during/after": (done["fresh during"], done["fresh after"]),
            }
        )
        print(json.dumps(figures, indent=1))

        # Every loopback request and every keyed request was answered.
        assert answers and set(answers) == {200}, answers
        assert done["before"] == 200 and done["during"] and set(done["during"]) == {200}
        assert done["fresh after"] == 200
        # The bounds: per source (the /64 as one), handshakes, the LAN's share.
        assert max(per_source.values()) <= PER_SOURCE and per_source["ipv6 /64"] == PER_SOURCE
        assert len(tls) == HANDSHAKES
        capacity = lan_capacity(OPEN_FILES)
        assert capacity is not None and len(held) + 1 <= capacity  # + the keyed connection
        assert peak[0] < OPEN_FILES
        # The deadlines: 5 s for a handshake, 10 s for a first byte.
        assert min(tls) >= 4.5 and max(tls) <= 7.0
        assert min(idle) >= 9.5 and max(idle) <= 13.0
        # A plaintext caller outside the networks is refused at its head, as before.
        assert done["outside"] == [403, "forbidden"]
        logged = {r.get("why") for r in proxy.logs if "closed unanswered" in r.get("msg", "")}
        assert logged == {"per-source", "handshakes", "reserve"}
        # Afterwards: descriptors back, memory near where it was.
        assert after[0] <= baseline[0] + 4
        assert after[1] <= baseline[1] + 8
