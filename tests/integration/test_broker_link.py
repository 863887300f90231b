"""The broker link and facade lifecycle through the real process (broker-protocol.md)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import UNIXServerEndpoint
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver
from twisted.web.http_headers import Headers

from tests.integration.conftest import enabled_proxy_for, running_proxy, sims
from tests.integration.harness import free_port


def node(node_id: str, url: str, *models: str) -> dict[str, object]:
    return {"id": node_id, "url": url, "models": list(models)}


@pytest_twisted.ensureDeferred
async def test_stdout_is_frames_and_logs_are_json_on_stderr(tmp_path: Path) -> None:
    """Every stdout byte is a JSON-RPC frame; stderr lines are JSON with component/engine."""
    async with running_proxy(tmp_path, "--log-level", "debug") as proxy:
        proxy.answer_subscribes()
        await proxy.enable("ollama", free_port())
        proxy.send(b"not json at all")
        await proxy.barrier()
        proxy.close_stdin()
        assert await proxy.ended == 0
    for line in proxy.raw_stdout.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert proxy.bad_log_lines == []
    assert proxy.logs and all(r["component"] == "nvpair-proxy" for r in proxy.logs)
    facade = [r for r in proxy.logs if "facade listening" in r["msg"]]
    assert facade and facade[0]["engine"] == "ollama"


@pytest_twisted.ensureDeferred
async def test_stdin_eof_stops_facades_and_exits_zero(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as proxy:
        proxy.answer_subscribes()
        port = free_port()
        await proxy.enable("llamacpp", port)
        proxy.close_stdin()
        assert await proxy.ended == 0
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


@pytest_twisted.ensureDeferred
async def test_error_answers(tmp_path: Path) -> None:
    """-32700 / -32600 (1 MiB) / -32601 / -32602 with field / -32004, link stays up."""
    async with running_proxy(tmp_path) as proxy:
        proxy.send(b"{broken")
        parse = await proxy.wait_for(lambda f: f.get("error", {}).get("code") == -32700)
        assert parse["id"] is None
        proxy.send(
            b'{"jsonrpc":"2.0","id":5,"method":"x","params":{"p":"' + b"a" * (1 << 20) + b'"}}'
        )
        await proxy.wait_for(lambda f: f.get("error", {}).get("code") == -32600)
        unknown = await proxy.request("no/such", {})
        assert unknown["error"]["code"] == -32601
        cases: list[tuple[dict[str, object], str]] = [
            ({"engine": "vllm"}, "engine"),
            ({}, "engine"),
            ({"engine": "ollama", "port": 70000}, "port"),
            ({"engine": "ollama", "port": -1}, "port"),
            ({"engine": "ollama", "port": "80"}, "port"),
            ({"engine": "ollama", "aliases": ["192.168.1.2:11434"]}, "aliases"),
        ]
        for params, field in cases:
            answer = await proxy.request("facade/enable", dict(params))
            assert answer["error"]["code"] == -32602
            assert answer["error"]["data"]["field"] == field
        for method, reason in [
            ("discovery:nodes", "unaddressed"),
            ("ollama:set-port", "facade-not-enabled"),
        ]:
            answer = await proxy.request(method, {"nodes": [], "port": 1})
            assert answer["error"]["code"] == -32004
            assert answer["error"]["data"]["reason"] == reason
        proxy.answer_subscribes()
        await proxy.enable("ollama", free_port())
        bad = await proxy.request("ollama:discovery:nodes", {"nodes": [{"id": "a"}]})
        assert bad["error"]["data"]["field"] == "nodes[0].url"


@pytest_twisted.ensureDeferred
async def test_lost_bind_race_is_tagged_and_contained(tmp_path: Path) -> None:
    """A taken port: -32001 tag bind + <engine>:error; the other facade keeps serving."""
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path) as proxy,
    ):
        port = await enabled_proxy_for(proxy, "llamacpp", [node("a", a.url, "tiny")])
        with socket.socket(socket.AF_INET6) as squatter:
            squatter.bind(("::", 0))
            squatter.listen()
            taken = squatter.getsockname()[1]
            answer = await proxy.request("facade/enable", {"engine": "ollama", "port": taken})
            assert answer["error"]["code"] == -32001
            assert answer["error"]["data"] == {"tag": "bind", "engine": "ollama", "port": taken}
            error = await proxy.wait_for_method("ollama:error")
            assert error["params"]["tag"] == "bind" and error["params"]["port"] == taken
        response = await treq.get(f"http://127.0.0.1:{port}/health")
        assert response.code == 200
        retry = await proxy.request("facade/enable", {"engine": "ollama", "port": free_port()})
        assert "result" in retry


@pytest_twisted.ensureDeferred
async def test_set_port_moves_the_facade_and_persists(tmp_path: Path) -> None:
    async with (
        sims(("llamacpp", ["tiny"], "a")) as (a,),
        running_proxy(tmp_path) as proxy,
    ):
        first = await enabled_proxy_for(proxy, "llamacpp", [node("a", a.url, "tiny")])
        second = free_port()
        moved = await proxy.request("llamacpp:set-port", {"port": second})
        assert moved["result"] == {"engine": "llamacpp", "port": second}
        assert json.loads((tmp_path / "llamacpp-proxy-port.json").read_text()) == {"port": second}
        assert (await treq.get(f"http://127.0.0.1:{second}/health")).code == 200
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", first)) != 0
        # A failed move keeps the facade where it was.
        with socket.socket(socket.AF_INET6) as squatter:
            squatter.bind(("::", 0))
            squatter.listen()
            failed = await proxy.request("llamacpp:set-port", {"port": squatter.getsockname()[1]})
            assert failed["error"]["data"]["tag"] == "bind"
        assert (await treq.get(f"http://127.0.0.1:{second}/health")).code == 200

    # The persisted port wins over the requested one on the next start...
    async with running_proxy(tmp_path) as proxy:
        proxy.answer_subscribes()
        answer = await proxy.enable("llamacpp", first)
        assert answer["result"]["port"] == second
    # ...unless the broker says to ignore it.
    async with running_proxy(tmp_path) as proxy:
        proxy.answer_subscribes()
        answer = await proxy.enable("llamacpp", first, ignorePersistedPort=True)
        assert answer["result"]["port"] == first


@pytest_twisted.ensureDeferred
async def test_corrupt_port_file_is_reported_and_ignored(tmp_path: Path) -> None:
    (tmp_path / "proxy-port.json").write_text("{not json")
    async with running_proxy(tmp_path) as proxy:
        proxy.answer_subscribes()
        port = free_port()
        answer = await proxy.enable("ollama", port)
        assert answer["result"]["port"] == port
        report = await proxy.wait_for_method("ollama:errors:report")
        assert report["params"]["severity"] == "warn"
        assert report["params"]["code"] == "port-file-corrupt"


@pytest_twisted.ensureDeferred
async def test_occupied_alias_is_a_warning(tmp_path: Path) -> None:
    async with running_proxy(tmp_path) as proxy:
        proxy.answer_subscribes()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            occupied = f"127.0.0.1:{squatter.getsockname()[1]}"
            free = f"127.0.0.1:{free_port()}"
            answer = await proxy.enable("ollama", free_port(), aliases=[occupied, free])
            assert answer["result"]["aliases"] == [free]
            report = await proxy.wait_for_method("ollama:errors:report")
            assert report["params"]["code"] == "alias-occupied"
            ready = await proxy.wait_for_method("ollama:ready")
            assert ready["params"]["aliases"] == [free]
            # The alias enters the same routing path: no node yet, so the facade answers.
            response = await treq.get(f"http://{free}/api/version")
            await response.content()
            assert response.code == 502
            assert response.headers.getRawHeaders(b"x-nvpair-error") == [b"no-owner"]


@pytest_twisted.ensureDeferred
async def test_log_level_changes_live_and_canary_never_logged(tmp_path: Path) -> None:
    """log/set-level takes effect at once; at debug, with the access log on, no prompt text,
    query string or header value reaches any log line."""
    canary = "CANARY-7f3a9-do-not-log"
    async with (
        sims(("ollama", ["llama3:latest"], "a")) as (a,),
        running_proxy(tmp_path, "--access-log") as proxy,
    ):
        port = await enabled_proxy_for(proxy, "ollama", [node("a", a.url, "llama3:latest")])
        url = f"http://127.0.0.1:{port}/api/generate"
        body = json.dumps({"model": "llama3", "prompt": canary, "stream": False}).encode()
        await (await treq.post(url, body)).content()
        assert not [r for r in proxy.logs if r["level"] == "debug"]
        proxy.notify("log/set-level", {"level": "debug"})
        await proxy.barrier()
        response = await treq.post(
            f"{url}?token={canary}",
            body,
            headers=Headers({b"Authorization": [f"Bearer {canary}".encode()]}),
        )
        await response.content()
        assert response.code == 200
        await proxy.wait_for_log(
            lambda r: r["level"] == "debug" and r.get("path") == "/api/generate"
        )

        # The access line of each request: written, with its path and nothing of its query.
        def access_lines() -> list[dict[str, Any]]:
            return [
                r for r in proxy.logs if r.get("namespace", "").startswith("nvpair.facades.access")
            ]

        await proxy.wait_for_log(lambda _: len(access_lines()) == 2)
        access = access_lines()
        assert [(r["path"], r["status"], r["node"]) for r in access] == [
            ("/api/generate", 200, "a"),
            ("/api/generate", 200, "a"),
        ]
        proxy.close_stdin()
        await proxy.ended
    assert canary.encode() not in proxy.raw_stderr
    assert canary.encode() not in proxy.raw_stdout


class _BrokerSide(LineOnlyReceiver):
    delimiter = b"\n"

    def __init__(self) -> None:
        self.frames: list[dict[str, object]] = []
        self.linked: Deferred[_BrokerSide] = Deferred()
        self.arrived: Deferred[None] | None = None

    def connectionMade(self) -> None:
        self.linked.callback(self)

    def lineReceived(self, line: bytes) -> None:
        self.frames.append(json.loads(line))
        if self.arrived is not None:
            arrived, self.arrived = self.arrived, None
            arrived.callback(None)

    async def next_frame(self) -> dict[str, object]:
        while not self.frames:
            self.arrived = Deferred()
            await self.arrived.addTimeout(10, reactor)
        return self.frames.pop(0)


@pytest_twisted.ensureDeferred
async def test_broker_endpoint_is_the_alternative_link(tmp_path: Path) -> None:
    """--broker unix:path=...: same framing over a socket; its close ends the process (0)."""
    socket_path = tmp_path / "broker.sock"
    side = _BrokerSide()
    endpoint = UNIXServerEndpoint(reactor, str(socket_path))
    listening = await endpoint.listen(Factory.forProtocol(lambda: side))
    try:
        async with running_proxy(tmp_path, "--broker", f"unix:path={socket_path}") as proxy:
            await side.linked.addTimeout(20, reactor)
            port = free_port()
            side.sendLine(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "facade/enable",
                        "params": {"engine": "llamacpp", "port": port},
                    }
                ).encode()
            )
            methods = []
            for _ in range(3):
                frame = await side.next_frame()
                methods.append(frame.get("method", f"answer {frame.get('id')}"))
            assert methods == ["llamacpp:ready", "llamacpp:discovery:subscribe", "answer 1"]
            assert side.transport is not None
            side.transport.loseConnection()
            assert await proxy.ended == 0
            assert proxy.raw_stdout == b""
    finally:
        await listening.stopListening()
