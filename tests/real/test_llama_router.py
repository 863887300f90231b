"""llama.cpp router mode behind the proxy (issue 22 item 5;
docs/fleet-scheduling.md#llamacpp-router-mode): two real ``llama-server --models-dir DIR
--models-max 1`` routers over the same two GGUFs, as the nodes of one fleet.

Each router holds one model at a time, loading another on demand and unloading the one it had.
The proxy lists both models, reads which one each router holds from its ``/v1/models``
``status``, reads that model's slots with ``/slots?model=`` (without ever loading a model by
asking), and sends a request to the router holding its model before the one that would have to
load it — which the node ids alone would not do. When the routers swap models, the order
follows at the next polls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import pytest_twisted
import treq
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers

from nvpair.engines.loadstate import LISTING_LAG
from nvpair.fleet.lanconfig import new_key
from tests.integration.browser import Browser, BrowserUnavailable, chromium
from tests.integration.harness import free_port, log_problems
from tests.integration.netns import lan_namespace
from tests.integration.test_lan import keys_file, python_in
from tests.integration.test_status_page import READ_PAGE
from tests.real.servers import fleet_proxy, llama_server_binary, llama_server_process, sleep
from tests.real.tiny_gguf import write_tiny_gguf

#: The fleet file's ``inventory-interval``.
POLL = "100ms"


class Routers(NamedTuple):
    """Router ``a`` would win on node id alone; ``b`` is the other."""

    a: str
    b: str


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routers]:
    binary = llama_server_binary()
    models = tmp_path_factory.mktemp("models")
    write_tiny_gguf(models / "alpha.gguf", seed=7)
    write_tiny_gguf(models / "beta.gguf", seed=8)
    router = ("--models-dir", str(models), "--models-max", "1")
    with (
        llama_server_process(binary, None, *router) as a,
        llama_server_process(binary, None, *router) as b,
    ):
        yield Routers(a.url, b.url)


async def chat(url: str, model: str) -> tuple[int, str | None]:
    """A short chat completion for ``model`` at ``url``: status and ``X-Nvpair-Node``."""
    response = await treq.post(
        url + "/v1/chat/completions",
        json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        ).encode(),
        headers=Headers({b"Content-Type": [b"application/json"]}),
        timeout=60,
    )
    await response.content()
    node = response.headers.getRawHeaders(b"x-nvpair-node", [None])[0]
    return response.code, node.decode() if node is not None else None


async def holds(url: str) -> dict[str, str]:
    """The router's own word: model id -> status."""
    response = await treq.get(url + "/v1/models", timeout=10)
    document = json.loads(await response.content())
    return {entry["id"]: entry["status"]["value"] for entry in document["data"]}


async def hold(url: str, model: str) -> None:
    """Make the router hold ``model`` (and, with ``--models-max 1``, nothing else), asked
    straight, never through the proxy: only its ``/v1/models`` can tell the proxy."""
    assert (await chat(url, model))[0] == 200
    deadline = time.monotonic() + 30
    while (await holds(url)).get(model) != "loaded" or "loading" in (await holds(url)).values():
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} never held only {model}: {await holds(url)}")
        await sleep(0.1)


async def fleet_view(admin: int) -> dict[str, dict[str, Any]]:
    response = await treq.get(f"http://127.0.0.1:{admin}/status", timeout=10)
    return {n["id"]: n for n in json.loads(await response.content())["nodes"]["llamacpp"]}


async def until_seen(admin: int, a: str, b: str) -> dict[str, dict[str, Any]]:
    """The proxy's view once it says router a holds ``a`` and router b holds ``b``, with each
    one's slots read."""
    deadline = time.monotonic() + 20
    while True:
        view = await fleet_view(admin)
        loads = {node: view[node]["load"] for node in ("a", "b")}
        if all(
            loads[node]["inMemory"] == [model] and model in loads[node]["modelSlots"]
            for node, model in (("a", a), ("b", b))
        ):
            return view
        if time.monotonic() > deadline:
            raise AssertionError(f"never a={a}, b={b}: {loads}")
        await sleep(0.1)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium for the status page; skipped only if it cannot be started."""
    try:
        with chromium() as session:
            yield session
    except BrowserUnavailable as missing:
        pytest.skip(f"headless Chromium unavailable: {missing}")


@pytest_twisted.ensureDeferred
async def test_a_request_goes_to_the_router_holding_its_model(
    tmp_path: Path, routers: Routers, browser: Browser
) -> None:
    await hold(routers.a, "beta")
    await hold(routers.b, "alpha")
    admin = free_port()
    async with fleet_proxy(
        tmp_path, {"a": routers.a, "b": routers.b}, "--admin-port", str(admin), interval=POLL
    ) as (proxy, port):
        url = f"http://127.0.0.1:{port}"
        view = await until_seen(admin, a="beta", b="alpha")
        # Every model of each router listed, and each loaded model's own slots read (-np 2).
        assert view["a"]["models"] == view["b"]["models"] == ["alpha", "beta"]
        assert view["a"]["load"]["modelSlots"] == {"beta": {"slots": 2, "busySlots": 0}}
        assert view["a"]["state"] == view["b"]["state"] == "up"
        listed = json.loads(await (await treq.get(url + "/v1/models", timeout=10)).content())
        assert [m["id"] for m in listed["data"]] == ["alpha", "beta"]

        # The status page shows each router's model in memory and its own slots.
        def read_page() -> Any:
            browser.navigate(f"http://127.0.0.1:{admin}/")
            return browser.execute_async(READ_PAGE, 10_000, False)

        page = await deferToThread(read_page)
        cells = {cell["node"]: cell for cell in page["cells"]}
        assert cells["a"]["warm"] == ["beta"] and cells["b"]["warm"] == ["alpha"], page
        assert "alpha: 0 of 2 slots busy" in cells["b"]["text"], page

        # Warm first: alpha to b, beta to a — a wins only on id.
        for _ in range(3):
            assert await chat(url, "alpha") == (200, "b")
            assert await chat(url, "beta") == (200, "a")
        # Dozens of polls have read each router's slots: none loaded a model by asking
        # (with --models-max 1 it would have unloaded the one there).
        assert await holds(routers.a) == {"alpha": "unloaded", "beta": "loaded"}
        assert await holds(routers.b) == {"alpha": "loaded", "beta": "unloaded"}

        # The routers swap: the order follows once the polls have read it, and once what the
        # proxy itself sent above no longer counts as loaded there: only a poll asked at least
        # LISTING_LAG after a dispatch speaks for it
        # (docs/fleet-scheduling.md#dispatched-is-loading).
        await hold(routers.a, "alpha")
        await hold(routers.b, "beta")
        await sleep(LISTING_LAG + 0.5)
        await until_seen(admin, a="alpha", b="beta")
        assert await chat(url, "beta") == (200, "b")
        assert await chat(url, "alpha") == (200, "a")
        # A router's 400 for /slots without ?model= is no error: nothing logged as one.
        assert log_problems(proxy) == []
        assert not [r for r in proxy.logs if "left llamacpp discovery" in str(r.get("msg"))]


_LAN_PROBE = """
import json, sys, httpx
base, key = sys.argv[1:3]
auth = {"Authorization": f"Bearer {key}"}
out = {}
for name, method, path, body in (
    ("props beta", "GET", "/props?model=beta", None),
    ("props beta encoded", "GET", "/props?autoload=true&mod%65l=beta", None),
    ("slots beta", "GET", "/slots?model=beta", None),
    ("tokenize beta", "POST", "/tokenize", b'{"model":"beta","content":"hi"}'),
    ("load alpha", "POST", "/models/load", b'{"model":"alpha"}'),
    ("unload alpha", "POST", "/models/unload", b'{"model":"alpha"}'),
    ("slot erase", "POST", "/slots/0?action=erase", b""),
):
    answer = httpx.request(method, base + path, content=body, headers=auth, timeout=10)
    out[name] = [answer.status_code, answer.headers.get("x-nvpair-error")]
listed = httpx.get(base + "/v1/models", headers=auth, timeout=10).json()["data"]
out["listed"] = {m["id"]: sorted(m["status"]) for m in listed}
print(json.dumps(out))
"""


@pytest_twisted.ensureDeferred
async def test_a_lan_key_cannot_make_a_router_load_or_show_what_it_may_not(
    tmp_path: Path, routers: Routers
) -> None:
    """A key limited to ``alpha`` without ``manage``, from another machine (a network
    namespace), on two real routers: a ``model`` query, a body naming ``beta`` on an "other"
    route and the management routes are refused before they reach a router — neither loads
    ``beta`` nor unloads what it holds — and the model list shows it no file paths
    (``status.args``), which the operator's own machine still sees
    (docs/lan.md#what-a-key-can-and-cannot-do)."""
    await hold(routers.a, "alpha")
    await hold(routers.b, "alpha")
    phone, _ = new_key("phone")
    keys_file(tmp_path / "keys.toml", ("phone", phone, ["alpha"]))
    with lan_namespace() as lan:
        access = f'[access]\nnetworks = ["{lan.network}"]\nkeys = "keys.toml"\n'
        nodes = {"a": routers.a, "b": routers.b}
        async with fleet_proxy(tmp_path, nodes, interval=POLL, extra=access) as (_, port):
            out = await python_in(lan, _LAN_PROBE, f"http://{lan.host_ip}:{port}", phone)
            loopback = await treq.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
            local = json.loads(await loopback.content())["data"]
    forbidden_model, forbidden_route = [403, "forbidden-model"], [403, "forbidden-route"]
    assert out == {
        "props beta": forbidden_model,
        "props beta encoded": forbidden_model,
        "slots beta": forbidden_model,
        "tokenize beta": forbidden_model,
        "load alpha": forbidden_route,
        "unload alpha": forbidden_route,
        "slot erase": forbidden_route,
        # Only the model the key may use, and without the router's command line.
        "listed": {"alpha": ["value"]},
    }
    assert all("args" in entry["status"] for entry in local), local
    # Neither router was made to load beta or drop alpha.
    for url in routers:
        assert await holds(url) == {"alpha": "loaded", "beta": "unloaded"}
