"""A real browser against the facades: each engine's CORS policy holds for a page
(docs/browser-policy.md, docs/inventories.md).

Headless Chromium loads a page from one of two loopback origins served by this test process and
``fetch()``es through the real proxy to simulated engines, two nodes per engine:

==========  ========================================  =========================================
facade      allowed page origin A                     denied page origin B
            (``http://127.0.0.1:<p>``)                (``http://127.0.0.2:<q>``)
==========  ========================================  =========================================
Ollama      o1 (also allows B) and o2 (default) both  o1 grants B, o2 answers 403: the fleet
            allow A (Ollama always allows 127.0.0.1)  denies
LM Studio   fleet m1, m2, both with "Enable CORS"     fleet m1 (CORS on), m3 (CORS off): no
                                                      headers from m3, the fleet denies
llama.cpp   l1 (``*``) and l2 (only A) both reflect   l1 reflects B, l2 sends no header: the
            A                                         fleet denies
==========  ========================================  =========================================

LM Studio's CORS is all-or-nothing, so its denial comes from the fleet (a node with CORS off)
rather than from the origin. For each facade and each origin the page sends a preflighted JSON
POST to an inference route (owned by the first, permissive node, so a preflight asked of that
node alone would wrongly pass) and a GET of the model list. With ``A`` the page reads both
answers; with ``B`` Chromium itself rejects the ``fetch()`` (``TypeError``). The test side then
checks what the browser cannot see: every node was asked, credentials were stripped, and the
proxy's headers are exactly the intersection docs/browser-policy.md#preflight-intersection
prescribes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IListeningPort, IReactorTCP
from twisted.internet.protocol import ServerFactory
from twisted.internet.threads import deferToThread
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Site

from nvpair.sim import SimEngine
from nvpair.sim import cors as sim_cors
from nvpair.sim.engine import CorsSetting
from tests.integration.browser import Browser, BrowserUnavailable, chromium
from tests.integration.conftest import running_proxy
from tests.integration.harness import ProxyProcess, free_port

pytestmark = pytest.mark.integration

ENGINES = ("ollama", "lmstudio", "llamacpp")

#: The inference route each facade is asked through, and its model list route.
INFERENCE_PATH = {
    "ollama": "/api/chat",
    "lmstudio": "/v1/chat/completions",
    "llamacpp": "/v1/chat/completions",
}
MODELS_PATH = {"ollama": "/api/tags", "lmstudio": "/v1/models", "llamacpp": "/v1/models"}
#: The path each node is asked for the model list (llama.cpp: always ``/models``).
NODE_MODELS_PATH = {"ollama": "/api/tags", "lmstudio": "/v1/models", "llamacpp": "/models"}

#: The page: ``probe(calls)`` fetches every call at once and reports, per call, what the page
#: could read or how the browser refused it.
PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>nvpair CORS probe</title>
<script>
window.probe = (calls) => Promise.all(calls.map(async (call) => {
  const init = {method: call.method, headers: call.headers, signal: AbortSignal.timeout(10000)};
  if (call.body !== null) init.body = call.body;
  try {
    const response = await fetch(call.url, init);
    return {outcome: "read", status: response.status, body: await response.text()};
  } catch (error) {
    return {outcome: "rejected", error: `${error.name}: ${error.message}`};
  }
}));
</script></head><body>nvpair CORS probe</body></html>
"""

PROBE = """
const done = arguments[arguments.length - 1];
window.probe(arguments[0]).then(done, (error) => done([{outcome: "script-error",
                                                        error: String(error)}]));
"""

CREDENTIALS = {
    "Cookie": "session=secret",
    "Authorization": "Bearer secret",
    "Proxy-Authorization": "Basic c2VjcmV0",
    "X-Api-Key": "secret",
}


# -- the browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium for the module; skipped only if it cannot be found or started."""
    try:
        with chromium() as session:
            yield session
    except BrowserUnavailable as missing:
        pytest.skip(f"headless Chromium unavailable: {missing}")


# -- pages, engines and the proxy -------------------------------------------------------------


class _Page(Resource):
    """The probe page, whatever the path (twisted.web.static.Data is not a leaf)."""

    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return PAGE


@contextlib.asynccontextmanager
async def pages() -> AsyncIterator[tuple[str, str]]:
    """The probe page on two loopback origins: ``(A, B)`` = 127.0.0.1 and 127.0.0.2."""
    # Twisted's Factory generic is invariant, so even a plain Site fails listenTCP's check.
    site = cast(ServerFactory, Site(_Page()))
    listening: list[IListeningPort] = []
    try:
        origins: list[str] = []
        for interface in ("127.0.0.1", "127.0.0.2"):
            port = IReactorTCP(reactor).listenTCP(0, site, interface=interface)
            listening.append(port)
            address = port.getHost()
            assert isinstance(address, IPv4Address)
            origins.append(f"http://{address.host}:{address.port}")
        yield origins[0], origins[1]
    finally:
        for port in listening:
            await maybeDeferred(port.stopListening)


@dataclass
class Node:
    engine: str
    node_id: str
    models: list[str]
    cors: CorsSetting
    sim: SimEngine = field(init=False)

    def message(self) -> dict[str, object]:
        return {"id": self.node_id, "url": self.sim.url, "models": self.models}


@dataclass
class Fleet:
    """The proxy with all three facades enabled, and the simulated nodes behind them.

    :ivar allowed: page origin ``A``; :ivar denied: page origin ``B``.
    :ivar current: the node ids each engine's discovery snapshot names right now, in order.
    """

    proxy: ProxyProcess
    allowed: str
    denied: str
    nodes: dict[str, Node]
    ports: dict[str, int] = field(default_factory=dict)
    current: dict[str, list[str]] = field(default_factory=dict)

    def base(self, engine: str) -> str:
        return f"http://127.0.0.1:{self.ports[engine]}"

    def fleet(self, engine: str) -> list[Node]:
        return [self.nodes[node_id] for node_id in self.current[engine]]

    async def use(self, engine: str, *node_ids: str) -> None:
        """Make ``node_ids`` (in this order) the engine's discovery snapshot."""
        self.current[engine] = list(node_ids)
        self.proxy.discovery(engine, [self.nodes[n].message() for n in node_ids])
        await self.proxy.barrier()

    async def for_origin(self, origin: str) -> None:
        """Set the fleets for a page from ``origin`` (only LM Studio's depends on it)."""
        await self.use("lmstudio", "m1", "m2" if origin == self.allowed else "m3")

    def forget_requests(self) -> None:
        for node in self.nodes.values():
            node.sim.requests.clear()


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Pages, two or three simulated nodes per engine, and the proxy with every facade."""
    async with pages() as (allowed, denied):
        nodes = {
            n.node_id: n
            for n in (
                Node("ollama", "o1", ["llama3:latest"], [denied]),
                Node("ollama", "o2", ["qwen2:7b"], None),
                Node("lmstudio", "m1", ["qwen2-7b-instruct"], True),
                Node("lmstudio", "m2", ["phi-3-mini"], True),
                Node("lmstudio", "m3", ["gemma-2-2b"], False),
                Node("llamacpp", "l1", ["tiny"], "*"),
                Node("llamacpp", "l2", ["big"], [allowed]),
            )
        }
        for node in nodes.values():
            node.sim = SimEngine(
                reactor, node.engine, models=node.models, node=node.node_id, cors=node.cors
            )
            node.sim.listen()
        try:
            async with running_proxy(tmp_path) as proxy:
                setup = Fleet(proxy, allowed, denied, nodes)
                proxy.answer_subscribes()
                for engine in ENGINES:
                    setup.ports[engine] = free_port()
                    await proxy.enable(engine, setup.ports[engine])
                await setup.use("ollama", "o1", "o2")
                await setup.use("llamacpp", "l1", "l2")
                await setup.for_origin(allowed)
                yield setup
        finally:
            for node in nodes.values():
                await node.sim.stop()


# -- what the page asks ----------------------------------------------------------------------

#: The model each inference call names: the first node's, which grants ``B`` where anything does.
OWNER = {"ollama": "o1", "lmstudio": "m1", "llamacpp": "l1"}


def inference_body(engine: str, setup: Fleet) -> str:
    model = setup.nodes[OWNER[engine]].models[0]
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": model, "messages": messages, "stream": False})


def calls(setup: Fleet) -> list[dict[str, Any]]:
    """Per facade: a preflighted JSON POST to an inference route, and a model-list GET."""
    out: list[dict[str, Any]] = []
    for engine in ENGINES:
        out.append(
            {
                "engine": engine,
                "kind": "inference",
                "url": setup.base(engine) + INFERENCE_PATH[engine],
                "method": "POST",
                "headers": {"Content-Type": "application/json"},
                "body": inference_body(engine, setup),
            }
        )
        out.append(
            {
                "engine": engine,
                "kind": "models",
                "url": setup.base(engine) + MODELS_PATH[engine],
                "method": "GET",
                "headers": {},
                "body": None,
            }
        )
    return out


async def probe(browser: Browser, origin: str, setup: Fleet) -> list[tuple[dict[str, Any], Any]]:
    """Load the page from ``origin`` and run every call in it; ``(call, result)`` pairs."""
    asked = calls(setup)

    def run() -> Any:
        browser.navigate(origin + "/")
        loaded = browser.execute("return typeof window.probe")
        assert loaded == "function", f"the probe page did not load from {origin}: {loaded}"
        return browser.execute_async(PROBE, asked)

    results = await deferToThread(run)
    assert isinstance(results, list) and len(results) == len(asked), results
    return list(zip(asked, results, strict=True))


def generated_text(engine: str, document: Any) -> str:
    if engine == "ollama":
        return str(document["message"]["content"])
    return str(document["choices"][0]["message"]["content"])


def listed_models(engine: str, document: Any) -> list[str]:
    if engine == "ollama":
        return [str(entry["name"]) for entry in document["models"]]
    return [str(entry["id"]) for entry in document["data"]]


def sim_log_problems(setup: Fleet, origin: str, allowed: bool) -> list[str]:
    """What the nodes received from the browser: every node of each engine got the preflight
    and the model-list GET (fan-out); the POST reached the owner only if the origin is allowed.
    """
    problems: list[str] = []
    for engine in ENGINES:
        for node in setup.fleet(engine):
            seen = node.sim.requests
            options = [
                r for r in seen if r.method == "OPTIONS" and r.path == INFERENCE_PATH[engine]
            ]
            if not options:
                problems.append(
                    f"{engine} node {node.node_id} never received the preflight "
                    f"OPTIONS {INFERENCE_PATH[engine]} (a preflight fans out to every node)"
                )
            elif any(r.headers.get("origin") != [origin] for r in options):
                problems.append(f"{engine} node {node.node_id}: preflight Origin was not {origin}")
            gets = [r for r in seen if r.method == "GET" and r.path == NODE_MODELS_PATH[engine]]
            if not gets:
                problems.append(
                    f"{engine} node {node.node_id} never received GET {NODE_MODELS_PATH[engine]} "
                    "(a model list fans out to every node)"
                )
            posts = [r for r in seen if r.method == "POST"]
            should_post = allowed and node.node_id == OWNER[engine]
            if should_post and len(posts) != 1:
                problems.append(
                    f"{engine} owner {node.node_id} received {len(posts)} POSTs, expected 1"
                )
            if not should_post and posts:
                problems.append(
                    f"{engine} node {node.node_id} received POST {posts[0].path} "
                    + ("(not the owner)" if allowed else "although the preflight should deny it")
                )
    return problems


# -- the browser tests ------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_allowed_origin_reads_every_facade(tmp_path: Path, browser: Browser) -> None:
    """From origin ``A``, which every node of every engine allows, the page reads the answer to
    a preflighted JSON POST (generated by the owner) and the merged model list of every node,
    through each facade; every node saw the preflight and the model-list GET."""
    async with fleet(tmp_path) as setup:
        origin = setup.allowed
        await setup.for_origin(origin)
        results = await probe(browser, origin, setup)
        problems: list[str] = []
        for call, result in results:
            engine, what = call["engine"], f"{call['method']} {call['url']} from {origin}"
            if result.get("outcome") != "read":
                problems.append(f"{engine}: {what} should be readable, browser said {result}")
                continue
            if result["status"] != 200:
                problems.append(f"{engine}: {what} -> {result['status']} {result['body'][:200]}")
                continue
            document = json.loads(result["body"])
            if call["kind"] == "inference":
                owner = OWNER[engine]
                if owner not in generated_text(engine, document):
                    problems.append(f"{engine}: {what} was not answered by {owner}: {document}")
            else:
                expected = sorted(m for node in setup.fleet(engine) for m in node.models)
                listed = sorted(listed_models(engine, document))
                if listed != expected:
                    problems.append(
                        f"{engine}: {what} listed {listed}, expected every node's {expected}"
                    )
        problems += sim_log_problems(setup, origin, allowed=True)
        assert not problems, "\n".join(problems)


@pytest_twisted.ensureDeferred
async def test_denied_origin_is_blocked_by_the_browser(tmp_path: Path, browser: Browser) -> None:
    """From origin ``B``, which one node of each engine denies, Chromium itself refuses every
    ``fetch()`` (TypeError): the preflight fails so the POST is never sent, and the model list
    is unreadable -- even though the first node of each engine would have granted ``B``."""
    async with fleet(tmp_path) as setup:
        origin = setup.denied
        await setup.for_origin(origin)
        results = await probe(browser, origin, setup)
        problems: list[str] = []
        for call, result in results:
            engine, what = call["engine"], f"{call['method']} {call['url']} from {origin}"
            if result.get("outcome") != "rejected" or not str(result["error"]).startswith(
                "TypeError"
            ):
                shown = {**result, "body": str(result.get("body", ""))[:200]}
                problems.append(
                    f"{engine}: {what} should be blocked by the browser (TypeError), got {shown}"
                )
        problems += sim_log_problems(setup, origin, allowed=False)
        assert not problems, "\n".join(problems)


# -- the proxy's answers, seen from outside the browser ---------------------------------------

LIST_HEADERS = frozenset({"access-control-allow-methods", "access-control-allow-headers"})


def cors_headers(headers: Headers) -> dict[str, str]:
    """``Access-Control-*`` headers, lower-cased names; list-valued ones normalised to a sorted,
    lower-cased, comma-joined set (they are intersected case-insensitively:
    docs/browser-policy.md#preflight-intersection)."""
    out: dict[str, str] = {}
    for raw_name, values in headers.getAllRawHeaders():
        name = raw_name.decode("latin-1").lower()
        if not name.startswith("access-control-"):
            continue
        value = ",".join(v.decode("latin-1") for v in values)
        if name in LIST_HEADERS:
            value = ",".join(sorted({p.strip().lower() for p in value.split(",") if p.strip()}))
        out[name] = value
    return out


def vary(headers: Headers) -> set[str]:
    values = headers.getRawHeaders(b"vary") or []
    return {p.strip().lower() for v in values for p in v.decode("latin-1").split(",")}


def listed(*items: str) -> str:
    return ",".join(sorted({i.lower() for i in items}))


# What Ollama's CORS middleware sends (the simulator's record of it), as the proxy's
# intersection spells it: one list, compared without regard to case or order.
OLLAMA_METHODS = listed(*sim_cors.OLLAMA_METHODS.split(","))
OLLAMA_HEADERS = listed(*sim_cors.OLLAMA_HEADERS.split(","))


def granted_preflight(engine: str, origin: str) -> dict[str, str]:
    """The intersected headers for origin ``A``: each engine's nodes agree, so the
    intersection is their common policy (docs/browser-policy.md#preflight)."""
    if engine == "ollama":
        return {
            "access-control-allow-origin": origin,
            "access-control-allow-methods": OLLAMA_METHODS,
            "access-control-allow-headers": OLLAMA_HEADERS,
            "access-control-max-age": "43200",
        }
    if engine == "lmstudio":
        return {
            "access-control-allow-origin": "*",
            "access-control-allow-methods": listed("GET", "HEAD", "PUT", "PATCH", "POST", "DELETE"),
            "access-control-allow-headers": "content-type",
        }
    return {
        "access-control-allow-origin": origin,
        "access-control-allow-credentials": "true",
        "access-control-allow-methods": listed("GET", "POST", "DELETE", "OPTIONS"),
        "access-control-allow-headers": "*",
    }


#: The status of the first non-granting node for origin ``B``: Ollama's o2 answers 403, LM
#: Studio's m3 (CORS off) and llama.cpp's l2 (origin not listed) answer 200 without headers.
DENIED_PREFLIGHT_STATUS = {"ollama": 403, "lmstudio": 200, "llamacpp": 200}


@pytest_twisted.ensureDeferred
async def test_preflight_intersects_every_node_without_credentials(tmp_path: Path) -> None:
    """A preflight reaches every node of the engine with Cookie, Authorization,
    Proxy-Authorization and X-Api-Key removed. Allowed origin: 204 with exactly the intersected
    Access-Control-* headers (Vary: Origin when the origin is echoed). Denied origin: the first
    non-granting node's status, no Access-Control-* headers, empty body, no X-Nvpair-Error."""
    async with fleet(tmp_path) as setup:
        problems: list[str] = []
        for origin in (setup.allowed, setup.denied):
            await setup.for_origin(origin)
            for engine in ENGINES:
                setup.forget_requests()
                path = INFERENCE_PATH[engine]
                what = f"{engine}: OPTIONS {path} from {origin}"
                request = {
                    "Origin": origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type",
                    **CREDENTIALS,
                }
                response = await treq.request(
                    "OPTIONS",
                    setup.base(engine) + path,
                    headers=Headers({k: [v] for k, v in request.items()}),
                )
                body = await response.content()
                got = cors_headers(response.headers)
                if origin == setup.allowed:
                    expected = granted_preflight(engine, origin)
                    if response.code != 204 or got != expected:
                        problems.append(
                            f"{what}: expected 204 {expected}, got {response.code} {got} {body!r}"
                        )
                    echoed = expected["access-control-allow-origin"] == origin
                    if echoed and "origin" not in vary(response.headers):
                        problems.append(f"{what}: origin echoed without Vary: Origin")
                else:
                    status = DENIED_PREFLIGHT_STATUS[engine]
                    error = response.headers.getRawHeaders(b"x-nvpair-error")
                    if (response.code, got, body, error) != (status, {}, b"", None):
                        problems.append(
                            f"{what}: expected the denial mirrored ({status}, no "
                            f"Access-Control-*, empty body, no X-Nvpair-Error), got "
                            f"{response.code} {got} {body[:200]!r} X-Nvpair-Error={error}"
                        )
                for node in setup.fleet(engine):
                    asked = [r for r in node.sim.requests if r.method == "OPTIONS"]
                    if len(asked) != 1:
                        problems.append(
                            f"{what}: node {node.node_id} received {len(asked)} OPTIONS, "
                            "expected 1 (a preflight fans out to every node)"
                        )
                        continue
                    leaked = sorted(
                        name for name in CREDENTIALS if name.lower() in asked[0].headers
                    )
                    if leaked:
                        problems.append(f"{what}: node {node.node_id} received {leaked}")
                    if asked[0].headers.get("origin") != [origin]:
                        problems.append(f"{what}: node {node.node_id} was not sent the Origin")
                    if asked[0].path != path:
                        problems.append(f"{what}: node {node.node_id} asked {asked[0].path}")
        assert not problems, "\n".join(problems)


def granted_inventory(engine: str, origin: str) -> dict[str, str]:
    """Model-list GET answers carry only ``Access-Control-Allow-Origin`` from these nodes."""
    return {"access-control-allow-origin": "*" if engine == "lmstudio" else origin}


@pytest_twisted.ensureDeferred
async def test_model_list_with_origin_needs_every_node(tmp_path: Path) -> None:
    """A model-list GET with Origin fans out to every node. Allowed origin: 200, the merged list
    of every node, and exactly the intersected CORS headers. Denied origin (one node denies):
    403 ``cors-denied`` from the proxy, no Access-Control-* headers, no partial list."""
    async with fleet(tmp_path) as setup:
        problems: list[str] = []
        for origin in (setup.allowed, setup.denied):
            await setup.for_origin(origin)
            for engine in ENGINES:
                setup.forget_requests()
                path = MODELS_PATH[engine]
                what = f"{engine}: GET {path} from {origin}"
                response = await treq.get(
                    setup.base(engine) + path, headers=Headers({"Origin": [origin]})
                )
                body = await response.content()
                got = cors_headers(response.headers)
                error = response.headers.getRawHeaders(b"x-nvpair-error")
                if origin == setup.allowed:
                    expected = granted_inventory(engine, origin)
                    if (response.code, got) != (200, expected):
                        problems.append(
                            f"{what}: expected 200 {expected}, got {response.code} {got} "
                            f"{body[:200]!r} X-Nvpair-Error={error}"
                        )
                    else:
                        names = sorted(listed_models(engine, json.loads(body)))
                        every = sorted(m for n in setup.fleet(engine) for m in n.models)
                        if names != every:
                            problems.append(f"{what}: listed {names}, expected {every}")
                    if got.get("access-control-allow-origin") == origin and "origin" not in vary(
                        response.headers
                    ):
                        problems.append(f"{what}: origin echoed without Vary: Origin")
                elif (response.code, got, error) != (403, {}, [b"cors-denied"]):
                    problems.append(
                        f"{what}: expected 403 cors-denied without Access-Control-*, got "
                        f"{response.code} {got} X-Nvpair-Error={error} {body[:200]!r}"
                    )
                for node in setup.fleet(engine):
                    asked = [r.path for r in node.sim.requests if r.method == "GET"]
                    if asked != [NODE_MODELS_PATH[engine]]:
                        problems.append(
                            f"{what}: node {node.node_id} was asked {asked}, expected "
                            f"[{NODE_MODELS_PATH[engine]!r}] (a model list fans out to every node)"
                        )
        assert not problems, "\n".join(problems)
