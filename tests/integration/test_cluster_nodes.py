"""Two proxy processes as cluster members on loopback, and the loopback gate (issue 6)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest_twisted
import treq
from twisted.internet import threads

from tests.certs import make_identity, write_cluster_dir
from tests.integration.conftest import running_proxy, sims
from tests.integration.harness import ProxyProcess, free_port
from tests.integration.netns import lan_namespace

ALICE, BOB, MALLORY = make_identity("alice"), make_identity("bob"), make_identity("mallory")


async def member(proxy: ProxyProcess, engine: str, port: int) -> dict[str, object]:
    proxy.answer_subscribes()
    await proxy.enable(engine, port)
    ready = await proxy.wait_for_method(f"{engine}:ready")
    params: dict[str, object] = ready["params"]
    return params


@pytest_twisted.ensureDeferred
async def test_request_routed_to_a_peer_over_mutual_tls(tmp_path: Path) -> None:
    """Node A's facade sends to node B over pinned mTLS; B answers from its local engine."""
    a_dir = write_cluster_dir(tmp_path / "a-cluster", ALICE, [BOB])
    b_dir = write_cluster_dir(tmp_path / "b-cluster", BOB, [ALICE])
    a_port, b_port = free_port(), free_port()
    async with (
        sims(("llamacpp", ["tiny"], "bob-engine")) as (engine,),
        running_proxy(tmp_path / "a", "--cluster-dir", str(a_dir)) as a,
        running_proxy(tmp_path / "b", "--cluster-dir", str(b_dir)) as b,
    ):
        engine.chunk_interval = 0.02
        assert (await member(b, "llamacpp", b_port))["tls"] is True
        b.notify("llamacpp:node/set-local-backend", {"url": engine.url})
        # B's own discovery does not matter to a peer's request: it is never re-routed.
        b.discovery("llamacpp", [])
        await b.barrier()
        assert (await member(a, "llamacpp", a_port))["tls"] is True
        a.discovery(
            "llamacpp",
            [{"id": "bob", "url": f"https://127.0.0.1:{b_port}", "models": ["tiny"]}],
        )
        await a.barrier()
        response = await treq.post(
            f"http://127.0.0.1:{a_port}/completion",
            json.dumps({"model": "tiny", "prompt": "hi", "stream": True}).encode(),
        )
        body = await response.content()
        assert response.code == 200 and b"bob-engine" in body
        assert [r.path for r in engine.requests] == ["/completion"]
        completed = await a.wait_for_method("workload:completed")
        assert completed["params"]["workloadInfo"]["scheduledOn"] == "bob"
        # B reported no workload and no node activity of its own: the request is A's.
        assert not [
            f
            for f in b.frames
            if str(f.get("method", "")).startswith(("workload:", "discovery:node-activity"))
        ]


@pytest_twisted.ensureDeferred
async def test_unpinned_client_is_refused_and_leaving_needs_no_restart(tmp_path: Path) -> None:
    """Mallory (unpinned) is refused at the handshake; once B leaves, Alice is refused too."""
    a_dir = write_cluster_dir(tmp_path / "a-cluster", ALICE, [BOB])
    m_dir = write_cluster_dir(tmp_path / "m-cluster", MALLORY, [BOB])
    b_dir = write_cluster_dir(tmp_path / "b-cluster", BOB, [ALICE])
    b_port = free_port()
    async with (
        sims(("llamacpp", ["tiny"], "bob-engine")) as (engine,),
        running_proxy(tmp_path / "b", "--cluster-dir", str(b_dir)) as b,
        running_proxy(
            tmp_path / "a",
            "--cluster-dir",
            str(a_dir),
            "--retry-backoff",
            "50ms",
            "--job-deadline",
            "2s",
            "--max-dispatch-attempts",
            "2",
        ) as a,
        running_proxy(
            tmp_path / "m", "--cluster-dir", str(m_dir), "--max-dispatch-attempts", "1"
        ) as m,
    ):
        await member(b, "llamacpp", b_port)
        b.notify("llamacpp:node/set-local-backend", {"url": engine.url})
        await b.barrier()
        peer = [{"id": "bob", "url": f"https://127.0.0.1:{b_port}", "models": ["tiny"]}]
        ports = {}
        for name, proxy in (("a", a), ("m", m)):
            ports[name] = free_port()
            await member(proxy, "llamacpp", ports[name])
            proxy.discovery("llamacpp", peer)
            await proxy.barrier()

        async def status(name: str) -> int:
            response = await treq.post(
                f"http://127.0.0.1:{ports[name]}/completion", b'{"prompt":"x"}', timeout=10
            )
            await response.content()
            return int(response.code)

        assert await status("a") == 200
        assert await status("m") == 502  # the handshake failed: a transport failure
        assert len(engine.requests) == 1

        (b_dir / "membership.json").unlink()
        not_member = await b.wait_for(
            lambda f: f.get("method") == "llamacpp:ready" and f["params"]["tls"] is False,
            timeout=10,
        )
        assert not_member["params"]["port"] == b_port
        assert await status("a") == 502
        assert len(engine.requests) == 1
        # Plaintext from loopback still works on the same port.
        # B has no llama.cpp nodes of its own: the facade itself answers, over plaintext.
        health = await treq.get(f"http://127.0.0.1:{b_port}/health")
        await health.content()
        assert health.code == 502
        assert health.headers.getRawHeaders(b"x-nvpair-error") == [b"no-owner"]


@pytest_twisted.ensureDeferred
async def test_plaintext_from_a_non_loopback_address_is_forbidden(tmp_path: Path) -> None:
    """A LAN caller (from a namespace behind a veth pair) gets 403 forbidden."""
    with lan_namespace() as lan:
        ns, host_ip = lan.name, lan.host_ip
        async with running_proxy(tmp_path) as proxy:
            port = free_port()
            await member(proxy, "ollama", port)
            command = [
                "ip",
                "netns",
                "exec",
                ns,
                "curl",
                "-s",
                "-i",
                "--max-time",
                "5",
                f"http://{host_ip}:{port}/api/tags",
            ]
            result = await threads.deferToThread(
                subprocess.run, command, capture_output=True, timeout=10
            )
            head = result.stdout.decode("latin-1")
            assert head.startswith("HTTP/1.1 403"), head[:200]
            assert "X-Nvpair-Error: forbidden" in head
