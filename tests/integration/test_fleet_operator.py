"""What an operator sees and changes in standalone fleet mode, through the real
``twistd -n nvpair-proxy --fleet`` (issue 13 items 4 and 6, issue 20 items 2 and 4;
docs/fleet-scheduling.md): every configured node in ``/status`` with its state and why, its
first failed poll logged, ``/readyz`` naming engines with no node up, the fleet file re-read on
SIGHUP without touching a request in flight, and the messages a new user's mistakes get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred

from nvpair.sim import SimEngine
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_schedules import (
    generate,
    ollama_error,
    polls,
    posts,
    sleep,
    started,
    stopped,
)


async def admin_get(admin: int, path: str) -> tuple[int, Any]:
    response = await treq.get(f"http://127.0.0.1:{admin}{path}", timeout=10)
    return int(response.code), json.loads(await response.content())


def by_id(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in status["nodes"]["ollama"]}


def said(proxy: ProxyProcess, start: str) -> Deferred[dict[str, Any]]:
    """The first log record whose message starts with ``start``, seen or still to come."""
    return proxy.wait_for_log(lambda r: str(r.get("msg")).startswith(start))


def logged(proxy: ProxyProcess, text: str) -> list[dict[str, Any]]:
    return [r for r in proxy.logs if text in str(r.get("msg", ""))]


@pytest_twisted.ensureDeferred
async def test_a_node_with_a_wrong_port_is_visible_logged_and_named(tmp_path: Path) -> None:
    """The new user's mistakes: one node's URL points at a closed port, another's ends in
    ``/v1`` (the OpenAI base URL, a reflex), so its poll asks ``/v1/api/tags``: 404. Each is in
    ``/status`` as down with the reason, its first failed poll is a warning naming it — the
    second saying the URL should be the engine's base URL (issue 20 item 2) — and once the one
    good node is gone ``/readyz`` names the engine that has no node up."""
    (a,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"))
    closed = free_port()
    port, admin = free_port(), free_port()
    urls = {"a": a.url, "typo": f"http://127.0.0.1:{closed}", "slash": f"{a.url}/v1"}
    fleet = write_fleet(tmp_path / "fleet.toml", port, urls)
    hint = f"status 404 (the URL should be the engine's base URL, {a.url}, without /v1)"
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(fleet), "--admin-port", str(admin)
        ) as proxy:
            warned = await proxy.wait_for_log(lambda r: r.get("node") == "typo")
            assert warned["level"] == "warn"
            assert f"127.0.0.1:{closed}" in warned["msg"] and "does not answer" in warned["msg"]
            slash = await proxy.wait_for_log(lambda r: r.get("node") == "slash")
            assert (slash["level"], slash["msg"]) == (
                "warn",
                f"slash's ollama at {a.url}/v1 does not answer its poll: {hint}",
            )
            assert "/v1/api/tags" in [r.path for r in a.requests]

            async def both_polled() -> bool:
                code, _ = await admin_get(admin, "/readyz")
                return code == 200

            await eventually(both_polled, "/readyz 200")
            _, status = await admin_get(admin, "/status")
            nodes = by_id(status)
            assert nodes["a"]["state"] == "up" and nodes["a"]["models"] == ["llama3:latest"]
            typo = nodes["typo"]
            assert typo["url"] == f"http://127.0.0.1:{closed}"
            assert typo["state"] == "down" and typo["lastPoll"] is not None
            assert "refused" in typo["lastError"] and typo["why"] == typo["lastError"]
            assert (nodes["slash"]["state"], nodes["slash"]["why"]) == ("down", hint)
            assert (await admin_get(admin, "/readyz"))[1]["enginesWithoutNodes"] == []
            # Polled every 100 ms, the down node is not warned about again.
            await sleep(0.5)
            assert len([r for r in proxy.logs if r.get("node") == "typo"]) == 1

            await a.refuse()
            await proxy.wait_for_log(lambda r: "a left ollama discovery" in str(r.get("msg")))
            code, ready = await admin_get(admin, "/readyz")
            assert code == 200 and ready["enginesWithoutNodes"] == ["ollama"]
            assert by_id((await admin_get(admin, "/status"))[1])["a"]["state"] == "down"
            assert log_problems(proxy) == []
    finally:
        await stopped([a])


@pytest_twisted.ensureDeferred
async def test_sighup_rereads_the_fleet_file_live(tmp_path: Path) -> None:
    """SIGHUP: a node added serves, a node removed is no longer polled, a request waiting for
    its first byte through the reload is answered by the node it was sent to, a port change
    is logged as needing a restart, and a broken file keeps the running fleet."""
    a, b = started(
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"),
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"),
    )
    port, admin = free_port(), free_port()
    path = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url})
    try:
        async with running_proxy(
            tmp_path, "--fleet", str(path), "--admin-port", str(admin)
        ) as proxy:
            await proxy.wait_for_log(lambda r: "a joined ollama discovery" in str(r.get("msg")))
            assert await generate(port) == (200, "a", None)

            # A request to ``a`` waits 1.5 s for its first byte; the reload comes meanwhile.
            a.faults.first_byte_delay = 1.5
            in_flight = ensureDeferred(generate(port))

            async def arrived() -> bool:
                return posts(a) == 2

            await eventually(arrived, "the request at a")
            write_fleet(path, port, {"a": a.url, "b": b.url}, interval="200ms")
            proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]
            await proxy.wait_for_log(lambda r: "b joined ollama discovery" in str(r.get("msg")))
            assert await in_flight == (200, "a", None)
            assert posts(a) == 2
            a.faults.clear()

            # ``a`` removed and the port changed: ``b`` serves, ``a`` is never polled again.
            write_fleet(path, port + 1, {"b": b.url})
            proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]
            removed = await proxy.wait_for_log(
                lambda r: "removed from the fleet file" in str(r.get("msg"))
            )
            assert removed["node"] == "a"
            (restart,) = logged(proxy, "needs a restart")
            assert restart["level"] == "warn"
            assert restart["change"] == f"facades.ollama.port {port} -> {port + 1}"
            assert await generate(port) == (200, "b", None)
            seen = polls(a, "/api/tags")
            await sleep(0.5)
            assert polls(a, "/api/tags") == seen
            _, status = await admin_get(admin, "/status")
            assert [n["id"] for n in status["nodes"]["ollama"]] == ["b"]
            assert status["facades"]["ollama"]["port"] == port

            # A file that no longer parses: reported, the running fleet kept.
            path.write_text("[[nodes]\nbroken")
            proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]
            refused = await proxy.wait_for_log(
                lambda r: "fleet file not reloaded" in str(r.get("msg"))
            )
            assert refused["level"] == "error" and "not valid TOML" in refused["msg"]
            assert await generate(port) == (200, "b", None)
            problems = [p for p in log_problems(proxy) if "fleet file not reloaded" not in p]
            assert problems == [], proxy.raw_stderr.decode()[-3000:]
    finally:
        await stopped([a, b])


@pytest_twisted.ensureDeferred
async def test_every_owner_down_is_said_not_a_wrong_model_name(tmp_path: Path) -> None:
    """Issue 20 item 2: with both nodes that serve llama3 switched off (their polls fail, they
    leave discovery), the 502 ``no-owner`` says its nodes are down, by id; a model nobody ever
    listed still reads as nobody advertising it."""
    a, b = started(
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"),
        SimEngine(reactor, "ollama", models=["llama3:latest"], node="b"),
    )
    port = free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": a.url, "b": b.url})
    fleet.write_text(fleet.read_text() + '[models]\n"fast" = ["llama3"]\n')
    try:
        async with running_proxy(tmp_path, "--fleet", str(fleet)) as proxy:
            for line in ("a joined", "b joined"):
                await said(proxy, line)
            assert await generate(port) == (200, "a", None)
            await a.refuse()
            await b.refuse()
            for line in ("a left", "b left"):
                await said(proxy, line)
            assert await ollama_error(port, "llama3") == (
                502,
                "no-owner",
                {"error": 'every node that serves model "llama3" is down: a, b'},
            )
            # An alias of it says the same (issue 31 item 6).
            assert await ollama_error(port, "fast") == (
                502,
                "no-owner",
                {"error": 'every node that serves model "fast" is down: a, b'},
            )
            assert await ollama_error(port, "mistral") == (
                502,
                "no-owner",
                {"error": 'no node advertises model "mistral"'},
            )
            assert log_problems(proxy) == []
    finally:
        await stopped([a, b])


@pytest_twisted.ensureDeferred
async def test_a_node_engine_without_a_facade_is_a_warning_at_start_and_on_sighup(
    tmp_path: Path,
) -> None:
    """Issue 20 item 4: nothing silently ignored. A node that lists LM Studio in a file with no
    ``[facades.lmstudio]``: a warning naming the node and the engine at start, and again at
    each re-read; a facade added by the re-read starts only with a restart, and says so."""
    (a,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"))
    port = free_port()
    path = tmp_path / "fleet.toml"
    head = f'inventory-interval = "100ms"\n[facades.ollama]\nport = {port}\n'
    node_a = f'[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "{a.url}"\nlmstudio = "{a.url}"\n'
    path.write_text(head + node_a)

    def ignored(proxy: ProxyProcess) -> list[tuple[str, str, str]]:
        return [
            (r["node"], r["engine"], r["msg"])
            for r in proxy.logs
            if "is ignored" in str(r.get("msg")) and r["level"] == "warn"
        ]

    try:
        async with running_proxy(tmp_path, "--fleet", str(path)) as proxy:
            await proxy.wait_for_log(lambda r: "a joined ollama discovery" in str(r.get("msg")))
            assert ignored(proxy) == [
                (
                    "a",
                    "lmstudio",
                    "a's lmstudio is ignored, neither polled nor served: the fleet file has no "
                    "[facades.lmstudio] table",
                )
            ]
            path.write_text(
                head
                + "[facades.llamacpp]\n"
                + node_a
                + f'[[nodes]]\nid = "b"\n[nodes.engines]\nllamacpp = "{a.url}"\n'
            )
            proxy.transport.signalProcess("HUP")  # type: ignore[union-attr]
            await proxy.wait_for_log(lambda r: r.get("node") == "b" and "ignored" in r["msg"])
            assert ignored(proxy)[1:] == [
                (
                    "a",
                    "lmstudio",
                    "a's lmstudio is ignored, neither polled nor served: the fleet file has no "
                    "[facades.lmstudio] table",
                ),
                (
                    "b",
                    "llamacpp",
                    "b's llamacpp is ignored, neither polled nor served: its facade was added "
                    "to the fleet file and starts with a restart",
                ),
            ]
            assert logged(proxy, "facades.llamacpp added needs a restart")
            # Only its ollama engine is polled: nothing asked a for LM Studio's list.
            assert not [r for r in a.requests if r.path.startswith(("/v1", "/api/v0"))]
    finally:
        await stopped([a])
