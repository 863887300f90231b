"""What an operator sees of a request that failed over, through the real
``twistd -n nvpair-proxy --fleet`` with an admin listener (issue 12 items 3 and 4;
docs/operations.md#recent-workloads and #the-status-page): ``recent`` in ``/status``, and the
live status page at ``/`` in headless Chromium.

Two simulated Ollama nodes own the model; the first by id, which is then each time the one
dispatched to least recently, answers every inference request 503, so each request fails over
to the second. The page test names the nodes with markup, as a
careless or hostile fleet file could: the page must show it as text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.threads import deferToThread

from nvpair.sim import SimEngine
from tests.integration.browser import Browser, BrowserUnavailable, chromium
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port, log_problems, write_fleet
from tests.integration.test_fleet import eventually
from tests.integration.test_fleet_operator import admin_get
from tests.integration.test_fleet_schedules import started, stopped

pytestmark = pytest.mark.integration

#: A prompt that must never reach the status (operational state only).
CANARY = "canary-7f3a-do-not-show"


@contextlib.asynccontextmanager
async def failing_over(
    tmp_path: Path, first: str, second: str
) -> AsyncIterator[tuple[ProxyProcess, int, int]]:
    """The proxy in fleet mode over two nodes, ``first`` answering 503; yields the proxy, its
    Ollama facade port and its admin port once both nodes have been polled."""
    # Answers of 24 tokens: long enough for a rate to be shown (docs/operations.md#status).
    a, b = started(
        *(
            SimEngine(reactor, "ollama", models=["llama3:latest"], node=node, tokens=["t "] * 24)
            for node in ("a", "b")
        )
    )
    a.faults.status = 503
    port, admin = free_port(), free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {first: a.url, second: b.url})
    try:
        async with every_node_up(tmp_path, fleet, admin) as proxy:
            yield proxy, port, admin
    finally:
        await stopped([a, b])


@contextlib.asynccontextmanager
async def every_node_up(
    tmp_path: Path, fleet: Path, admin: int, *options: str
) -> AsyncIterator[ProxyProcess]:
    """The proxy over ``fleet`` with its admin listener on ``admin`` (and ``options``), once it
    is ready and every node of every engine is up."""
    args = ("--fleet", str(fleet), "--admin-port", str(admin), *options)
    async with running_proxy(tmp_path, *args) as proxy:

        async def all_up() -> bool:
            try:
                code, _ = await admin_get(admin, "/readyz")
            except ConnectionRefusedError:
                return False  # not listening yet
            if code != 200:
                return False
            _, status = await admin_get(admin, "/status")
            return all(n["state"] == "up" for nodes in status["nodes"].values() for n in nodes)

        await eventually(all_up, "every node up")
        yield proxy


async def chat(port: int) -> tuple[int, str | None, dict[str, Any]]:
    """POST /api/chat (not streamed); (status, X-Nvpair-Node, the answer)."""
    response = await treq.post(
        f"http://127.0.0.1:{port}/api/chat",
        json.dumps(
            {
                "model": "llama3",
                "messages": [{"role": "user", "content": CANARY}],
                "stream": False,
            }
        ).encode(),
        timeout=20,
    )
    body = json.loads(await response.content())
    node = response.headers.getRawHeaders(b"x-nvpair-node")
    return int(response.code), node[0].decode() if node else None, body


async def settled(admin: int) -> dict[str, Any]:
    """``/status`` once its newest workload has ended."""
    seen: dict[str, Any] = {}

    async def ended() -> bool:
        _, status = await admin_get(admin, "/status")
        seen.update(status)
        recent = status["recent"]
        return bool(recent) and recent[0]["endedAt"] is not None

    await eventually(ended, "the workload's end in /status")
    return seen


@pytest_twisted.ensureDeferred
async def test_status_recent_shows_the_failover_and_its_outcome(tmp_path: Path) -> None:
    """``recent[0]``: the workload, both attempts in order (``a`` a retried 503, ``b``
    served 200), ``completed``, the time to first byte and the engine's reported rate — and
    none of the request's content."""
    async with failing_over(tmp_path, "a", "b") as (proxy, port, admin):
        code, node, answer = await chat(port)
        assert (code, node) == (200, "b"), answer
        status = await settled(admin)
        (entry,) = status["recent"]
        assert {k: entry[k] for k in ("engine", "model", "state", "error")} == {
            "engine": "ollama",
            "model": "llama3:latest",
            "state": "completed",
            "error": None,
        }
        assert entry["attempts"] == [
            {"node": "a", "result": "status", "status": 503, "detail": None},
            {"node": "b", "result": "served", "status": 200, "detail": None},
        ]
        assert isinstance(entry["ttftMs"], int) and entry["ttftMs"] >= 0
        # The simulated Ollama reports eval_count and eval_duration: the engine's own rate.
        assert isinstance(entry["tokensPerSecond"], float) and entry["tokensPerSecond"] > 0
        assert entry["id"] and entry["admittedAt"] <= entry["endedAt"]
        assert CANARY not in json.dumps(status)
        # A second request is newest.
        assert (await chat(port))[:2] == (200, "b")
        later = await settled(admin)
        assert [e["id"] for e in later["recent"]][1] == entry["id"]
        assert log_problems(proxy) == []


# -- the status page in a browser -------------------------------------------------------------

#: Node ids as markup: the page must show them as text and create no element from them.
FIRST = "a<img src=x>"
SECOND = "b</td><b>bold</b>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module; skipped only if it cannot be found or started."""
    try:
        with chromium() as session:
            session.set_window_size(1280, 900)
            yield session
    except BrowserUnavailable as missing:
        pytest.skip(f"headless Chromium unavailable: {missing}")


#: Waits (up to ``arguments[0]`` ms) until ``#recent-body`` has a completed first row, or
#: until the page has refreshed at least once when ``arguments[1]`` is false; then reports
#: what the page shows: each node's cell with its ``.cache`` line (None without one).
READ_PAGE = """
const [patience, wantRow] = arguments;
const done = arguments[arguments.length - 1];
const deadline = Date.now() + patience;
function read() {
  const rows = [...document.querySelectorAll("#recent-body tr")].map((row) => ({
    workload: row.dataset.workload,
    state: row.dataset.state,
    key: row.querySelector(".key")?.textContent ?? null,
    cells: [...row.children].map((cell) => cell.textContent),
    attempts: [...row.querySelectorAll(".attempt")].map((chip) => ({
      node: chip.dataset.node, result: chip.dataset.result,
      status: chip.dataset.status === undefined ? null : Number(chip.dataset.status),
      text: chip.textContent})),
  }));
  return {
    refreshes: Number(document.body.dataset.refreshes || 0),
    updated: document.getElementById("updated").textContent,
    engines: [...document.querySelectorAll("#fleet-head th")].map((th) => th.textContent),
    nodes: [...document.querySelectorAll("#fleet-body tr > th")].map((th) => th.textContent),
    cells: [...document.querySelectorAll("#fleet-body td.cell")].map((cell) => ({
      engine: cell.dataset.engine, node: cell.dataset.node,
      state: cell.querySelector(".badge").textContent,
      models: [...cell.querySelectorAll("ul.models li")].map((li) => li.textContent),
      warm: [...cell.querySelectorAll("ul.models li.warm")].map((li) => li.textContent),
      cache: cell.querySelector(".cache")?.textContent ?? null,
      text: cell.textContent})),
    injected: document.querySelectorAll("img, b, td td").length,
    rows,
  };
}
(function look() {
  const seen = read();
  const ready = wantRow ? seen.rows.length > 0 && seen.rows[0].state === "completed"
                        : seen.refreshes > 0 && seen.cells.length === 2;
  if (ready || Date.now() > deadline) done(seen); else setTimeout(look, 100);
})();
"""


def page_and_screenshot(browser: Browser, admin: int) -> tuple[Any, bytes]:
    """The status page loaded afresh: what :data:`READ_PAGE` reads once its first recent row
    has completed, and a screenshot (blocking: run it in a thread)."""
    browser.navigate(f"http://127.0.0.1:{admin}/")
    seen = browser.execute_async(READ_PAGE, 10_000, True)
    return seen, browser.screenshot()


def keep_screenshot(png: bytes, shot: Path) -> Path:
    """A screenshot (a PNG) written to ``shot``, in pytest's tmp dir, and copied to
    ``$NVPAIR_ARTIFACTS``."""
    assert png.startswith(b"\x89PNG"), png[:8]
    shot.write_bytes(png)
    where = os.environ.get("NVPAIR_ARTIFACTS")
    kept = shot
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        kept = Path(where) / shot.name
        shutil.copyfile(shot, kept)
    print(f"status page screenshot: {kept}")
    return kept


@pytest_twisted.ensureDeferred
async def test_the_status_page_shows_the_fleet_and_a_failover_live(
    tmp_path: Path, browser: Browser
) -> None:
    """Loaded before the request and never reloaded, the page shows the fleet (both nodes up
    with their model, under the Ollama facade), then the request: both attempts in order —
    the first node's 503, the second's served 200 — and ``completed``. Node ids written as
    markup appear as text, and no element comes of them. A screenshot is kept."""
    async with failing_over(tmp_path, FIRST, SECOND) as (proxy, port, admin):
        page = f"http://127.0.0.1:{admin}/"
        response = await treq.get(page, timeout=10)
        assert response.code == 200
        await response.content()
        headers = response.headers
        assert headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
        (policy,) = headers.getRawHeaders(b"content-security-policy") or [b""]
        assert policy.startswith(b"default-src 'none'") and b"connect-src 'self'" in policy
        assert headers.getRawHeaders(b"x-content-type-options") == [b"nosniff"]

        def load() -> Any:
            browser.navigate(page)
            return browser.execute_async(READ_PAGE, 10_000, False)

        fleet = await deferToThread(load)
        assert fleet["refreshes"] > 0, fleet
        assert fleet["engines"] == ["node", f"ollamaport {port}"], fleet
        assert fleet["nodes"] == [FIRST, SECOND], fleet
        assert [(c["engine"], c["node"], c["state"]) for c in fleet["cells"]] == [
            ("ollama", FIRST, "up"),
            ("ollama", SECOND, "up"),
        ], fleet
        # Listed, and in memory (the simulator's /api/ps).
        assert all(c["models"] == c["warm"] == ["llama3:latest"] for c in fleet["cells"]), fleet
        assert fleet["rows"] == [], fleet

        code, node, _ = await chat(port)
        assert (code, node) == (200, SECOND)

        def after() -> tuple[Any, bytes]:
            seen = browser.execute_async(READ_PAGE, 10_000, True)
            return seen, browser.screenshot()

        seen, png = await deferToThread(after)
        keep_screenshot(png, tmp_path / "status-page.png")
        (row,) = seen["rows"]
        assert row["state"] == "completed", seen
        assert [(a["node"], a["result"], a["status"]) for a in row["attempts"]] == [
            (FIRST, "status", 503),
            (SECOND, "served", 200),
        ], seen
        assert [a["text"] for a in row["attempts"]] == [f"{FIRST} 503", f"{SECOND} served 200"]
        number, engine, model, state, _path, error, first_byte = row["cells"][:7]
        assert (engine, model, state, error) == ("ollama", "llama3:latest", "completed", "")
        assert number and first_byte.endswith(" ms"), row
        assert seen["injected"] == 0, seen
        assert log_problems(proxy) == []


@pytest_twisted.ensureDeferred
async def test_the_page_names_the_openai_facade_and_its_nodes_engines(
    tmp_path: Path, browser: Browser
) -> None:
    """Fleet mode with ``[facades.openai]`` alone (docs/openai-facade.md#what-an-operator-sees):
    the header names the facade and its port, each node sits in its own engine's column, and a
    request that failed over from Ollama to llama.cpp is the serving engine's."""
    ollama, llama = started(
        SimEngine(reactor, "ollama", models=["tiny:latest"], node="a"),
        SimEngine(reactor, "llamacpp", models=["tiny"], node="b"),
    )
    ollama.faults.status = 503
    port, admin = free_port(), free_port()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f'inventory-interval = "100ms"\n[facades.openai]\nport = {port}\n'
        f'[[nodes]]\nid = "a"\n[nodes.engines]\nollama = "{ollama.url}"\n'
        f'[[nodes]]\nid = "b"\n[nodes.engines]\nllamacpp = "{llama.url}"\n'
    )
    try:
        async with every_node_up(tmp_path, fleet, admin) as proxy:
            body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
            response = await treq.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", body.encode(), timeout=20
            )
            assert response.code == 200
            await response.content()

            def load() -> tuple[Any, str]:
                browser.navigate(f"http://127.0.0.1:{admin}/")
                seen = browser.execute_async(READ_PAGE, 10_000, True)
                return seen, browser.execute(
                    "return document.getElementById('spanning').textContent"
                )

            seen, spanning = await deferToThread(load)
            assert spanning == f"openai facade on port {port}"
            assert seen["engines"] == ["node", "llamacpp", "ollama"], seen
            assert [(c["engine"], c["node"], c["state"]) for c in seen["cells"]] == [
                ("llamacpp", "b", "up"),
                ("ollama", "a", "up"),
            ], seen
            (row,) = seen["rows"]
            # The facade it came through, beside the engine that served it.
            assert row["cells"][1:4] == ["openai \u2192 llamacpp", "tiny", "completed"], row
            assert [(a["node"], a["result"]) for a in row["attempts"]] == [
                ("a", "status"),
                ("b", "served"),
            ]
            assert log_problems(proxy) == []
    finally:
        await stopped([ollama, llama])


#: The recent rows' model cells and the fleet key each names, once the first row completed.
READ_KEYS = """
const done = arguments[arguments.length - 1];
const deadline = Date.now() + arguments[0];
(function look() {
  const rows = [...document.querySelectorAll("#recent-body tr")];
  if ((rows.length && rows[0].dataset.state === "completed") || Date.now() > deadline) {
    done(rows.map((row) => {
      const key = row.children[2].querySelector(".key");
      return [row.children[2].firstChild.textContent, key ? key.textContent : null];
    }));
  } else setTimeout(look, 100);
})();
"""


@pytest_twisted.ensureDeferred
async def test_the_status_page_names_the_fleet_key_a_request_came_with(
    tmp_path: Path, browser: Browser
) -> None:
    """Where [access] is in force, a request's row names its key (docs/lan.md#keys); a
    keyless one names none. A loopback caller that shows a valid key counts as that key."""
    from twisted.web.http_headers import Headers

    from nvpair.fleet.lanconfig import new_key

    (sim,) = started(SimEngine(reactor, "ollama", models=["llama3:latest"], node="a"))
    secret, block = new_key("laptop")
    (tmp_path / "keys.toml").write_text(block)
    port, admin = free_port(), free_port()
    fleet = write_fleet(tmp_path / "fleet.toml", port, {"a": sim.url})
    with fleet.open("a") as text:
        text.write('[access]\nnetworks = ["192.0.2.0/24"]\nkeys = "keys.toml"\n')
    try:
        async with running_proxy(
            tmp_path / "state", "--fleet", str(fleet), "--admin-port", str(admin)
        ):

            async def up() -> bool:
                try:
                    return (await admin_get(admin, "/readyz"))[0] == 200
                except ConnectionRefusedError:
                    return False

            await eventually(up, "ready")
            body = json.dumps({"model": "llama3", "prompt": "hi", "stream": False}).encode()
            for headers in ({b"authorization": [b"Bearer " + secret.encode()]}, {}):
                response = await treq.post(
                    f"http://127.0.0.1:{port}/api/generate", body, headers=Headers(headers)
                )
                await response.content()
                assert response.code == 200
            await settled(admin)

            def look() -> Any:
                browser.navigate(f"http://127.0.0.1:{admin}/")
                return browser.execute_async(READ_KEYS, 10_000)

            rows = await deferToThread(look)
            assert rows == [["llama3:latest", None], ["llama3:latest", "key laptop"]]
    finally:
        await stopped([sim])
