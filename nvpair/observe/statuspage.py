"""The live status page at the admin listener's ``/`` (docs/operations.md#the-status-page).

One self-contained HTML document: its style and script are inline, it loads nothing else, and
it reads ``/status`` once a second with ``fetch``. Everything shown comes from that document
and goes into the DOM as text (``textContent``, ``dataset``, ``title``), never as markup: node
ids come from a fleet file and model names from engines. CSS classes are picked from fixed
lists, never built from data. :data:`CONTENT_SECURITY_POLICY` allows exactly this page's own
style and script (by hash) and requests to its own origin.
"""

from __future__ import annotations

import base64
import hashlib

from nvpair.observe.statusstyle import STYLE

SCRIPT = """
"use strict";
(() => {
  const REFRESH_MS = 1000;
  const NODE_STATES = new Set(["up", "down", "loading", "held-back", "hung", "pending",
    "listed", "unlisted"]);
  const WORK_STATES = new Set(["queued", "running", "completed", "failed", "cancelled"]);
  const AFFINITY = new Set(["followed", "moved", "new"]);
  const RESULTS = new Set(["served", "truncated", "status", "transport",
    "first_body_timeout", "node_left"]);
  let refreshes = 0;

  // Every value from /status enters the page through here or dataset/title: as text.
  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // A class from a fixed list, never from the data.
  function known(prefix, word, words) {
    return prefix + "-" + (words.has(word) ? word : "other");
  }

  function badge(prefix, word, words) {
    return el("span", "badge " + known(prefix, word, words), word);
  }

  function clock(iso) {
    if (!iso) return "";
    const when = new Date(iso);
    return Number.isNaN(when.getTime()) ? "" : when.toLocaleTimeString([], {hour12: false});
  }

  function loadText(node) {
    const load = node.load;
    const parts = [];
    if (load) {
      if (load.loading) parts.push("loading a model");
      if (load.sleeping) parts.push("sleeping (cold: model not in memory)");
      if (typeof load.slots === "number") {
        parts.push(load.busySlots + " of " + load.slots + " slots busy");
      } else if (load.busySlots) {
        parts.push(load.busySlots + " busy");
      }
      // A llama.cpp router: each model has slots of its own, and may be loading.
      for (const [model, own] of Object.entries(load.modelSlots || {})) {
        parts.push(model + ": " + own.busySlots + " of " + own.slots + " slots busy");
      }
      if ((load.loadingModels || []).length) {
        parts.push("loading " + load.loadingModels.join(", "));
      }
      if ((load.sleepingModels || []).length) {
        parts.push("sleeping (cold) " + load.sleepingModels.join(", "));
      }
    } else if (typeof node.pending === "number") {
      parts.push("pending " + node.pending + ", gpu pressure " + node.gpuPressure);
    }
    return parts.join(", ");
  }

  // What the node's answers said of its cache, and whether affinity skips it for now
  // (fleet mode: docs/fleet-scheduling.md#what-the-operator-sees-of-affinity).
  function cacheText(node) {
    const cache = node.cache;
    if (!cache || typeof cache.share !== "number") return "";
    let text = "cache " + Math.round(cache.share * 100) + "% of " + cache.promptTokens
      + " prompt tokens (" + cache.answers + (cache.answers === 1 ? " answer)" : " answers)");
    if (cache.suspendedUntil) text += ", affinity suspended until " + clock(cache.suspendedUntil);
    return text;
  }

  function nodeCell(engine, node, mode) {
    const cell = el("td", "cell");
    cell.dataset.engine = engine;
    cell.dataset.node = String(node.id);
    const head = el("div", "cell-head");
    const state = mode === "fleet" ? String(node.state) : (node.listed ? "listed" : "unlisted");
    head.append(badge("node", state, NODE_STATES));
    head.append(el("span", "figure", "in flight " + node.inFlight));
    if (node.reservations) head.append(el("span", "figure", "reserved " + node.reservations));
    cell.append(head);
    if (node.why) {
      cell.append(el("div", "why", node.why));
    } else if (node.health && node.health.failuresInARow > 0) {
      // Not held back (yet): still worth seeing that its last attempts failed.
      const count = node.health.failuresInARow;
      cell.append(el("div", "why", count + (count === 1 ? " failed attempt" : " failed attempts")
        + " in a row (last: " + node.health.lastFailure + ")"));
    }
    const load = loadText(node);
    if (load) cell.append(el("div", "load", load));
    const cache = cacheText(node);
    if (cache) cell.append(el("div", "load cache", cache));
    const inMemory = node.load ? node.load.inMemory : null;
    // inMemory holds the engine's model keys (Ollama's carry the registry host and
    // namespace: "registry.ollama.ai/library/llama3:latest"), models the names it lists.
    const warm = (Array.isArray(inMemory) ? inMemory : [])
      .map((key) => String(key).toLowerCase());
    const isWarm = (model) => {
      const name = String(model).toLowerCase();
      return warm.some((key) => key === name || key.endsWith("/" + name));
    };
    const models = el("ul", "models");
    for (const model of node.models || []) {
      const hot = inMemory === "all" || isWarm(model);
      const item = el("li", hot ? "warm" : "", model);
      if (hot) item.title = "in memory";
      models.append(item);
    }
    if (models.childElementCount) cell.append(models);
    if (node.url) cell.append(el("div", "url", node.url));
    return cell;
  }

  function renderFleet(doc) {
    const byEngine = doc.nodes || {};
    const engines = Object.keys(byEngine).sort();
    // A facade with no column of its own (openai, which reaches every engine's nodes).
    const spanning = Object.keys(doc.facades || {}).filter((f) => !(f in byEngine)).sort();
    document.getElementById("spanning").textContent = spanning.map(
      (f) => f + " facade on port " + doc.facades[f].port).join(", ");
    const ids = [];
    for (const engine of engines) {
      for (const node of byEngine[engine] || []) {
        if (!ids.includes(node.id)) ids.push(node.id);
      }
    }
    const head = el("tr");
    head.append(el("th", "", "node"));
    for (const engine of engines) {
      const facade = (doc.facades || {})[engine];
      const th = el("th", "", engine);
      if (facade) th.append(el("div", "muted", "port " + facade.port));
      head.append(th);
    }
    const rows = ids.map((id) => {
      const row = el("tr");
      row.append(el("th", "", id));
      for (const engine of engines) {
        const node = (byEngine[engine] || []).find((n) => n.id === id);
        row.append(node ? nodeCell(engine, node, doc.mode) : el("td", "empty", "\\u2014"));
      }
      return row;
    });
    document.getElementById("fleet-head").replaceChildren(head);
    document.getElementById("fleet-body").replaceChildren(...rows);
    document.getElementById("no-nodes").hidden = ids.length > 0;
  }

  function attemptChip(attempt) {
    const result = String(attempt.result);
    const chip = el("span", "attempt " + known("result", result, RESULTS));
    chip.dataset.node = String(attempt.node);
    chip.dataset.result = result;
    if (attempt.status != null) {
      chip.dataset.status = String(attempt.status);
    }
    chip.append(el("span", "node", attempt.node), " ");
    let said = result.replaceAll("_", " ");
    if (result === "status") said = String(attempt.status);
    else if (result === "served" && attempt.status) said = "served " + attempt.status;
    else if (result === "truncated" && attempt.status) said = "truncated " + attempt.status;
    chip.append(el("span", "said", said));
    if (attempt.detail) chip.title = attempt.detail;
    return chip;
  }

  // What the fleet's order did with the request's conversation at its first dispatch
  // (docs/fleet-scheduling.md#what-the-operator-sees-of-affinity).
  function affinityCell(work) {
    const cell = el("td");
    const result = String(work.affinity || "");
    if (!result) return cell;
    cell.dataset.affinity = result;
    const said = result === "moved" && work.affinityNode != null
      ? "moved from " + work.affinityNode + (work.affinityWhy ? ": " + work.affinityWhy : "")
      : result;
    cell.append(el("span", "affinity " + known("affinity", result, AFFINITY), said));
    return cell;
  }

  function renderRecent(doc) {
    const rows = (doc.recent || []).map((work) => {
      const row = el("tr");
      row.dataset.workload = String(work.id);
      row.dataset.state = String(work.state);
      row.append(el("td", "num", work.id));
      // The facade it came through, where that is not its engine's own (the openai facade).
      const via = work.facade && work.facade !== work.engine;
      row.append(el("td", "", via ? work.facade + " \u2192 " + work.engine : work.engine));
      const model = el("td", "", work.model);
      // A fleet key's name (docs/lan.md#keys), as text like every value.
      if (typeof work.key === "string") model.append(el("div", "key", "key " + work.key));
      row.append(model);
      const state = el("td");
      state.append(badge("work", String(work.state), WORK_STATES));
      row.append(state);
      const path = el("div", "path");
      (work.attempts || []).forEach((attempt, index) => {
        if (index) path.append(el("span", "arrow", "\\u2192"));
        path.append(attemptChip(attempt));
      });
      const pathCell = el("td");
      pathCell.append(path);
      row.append(pathCell);
      row.append(el("td", "error", work.error || ""));
      row.append(el("td", "num", work.ttftMs == null ? "" : work.ttftMs + " ms"));
      row.append(el("td", "num", work.tokensPerSecond == null ? "" : work.tokensPerSecond));
      row.append(el("td", "num", clock(work.admittedAt)));
      row.append(el("td", "num", work.queuedMs ? work.queuedMs + " ms" : ""));
      row.append(affinityCell(work));
      return row;
    });
    document.getElementById("recent-body").replaceChildren(...rows);
    document.getElementById("no-recent").hidden = rows.length > 0;
  }

  // Who waits for what in the fleet's queue (docs/fleet-scheduling.md#the-queue).
  function renderQueue(doc) {
    const queue = doc.queue || {waiting: {}};
    const rows = [];
    Object.keys(queue.waiting || {}).sort().forEach((facade) => {
      const models = queue.waiting[facade];
      Object.keys(models).sort().forEach((model) => {
        const waiting = models[model];
        const row = el("tr");
        row.dataset.model = model;
        row.append(el("td", "", facade));
        row.append(el("td", "", model));
        row.append(el("td", "num", String(waiting.waiting)));
        row.append(el("td", "num", (waiting.oldestMs / 1000).toFixed(1) + " s"));
        const callers = Object.keys(waiting.callers || {}).sort()
          .map((caller) => caller + " \u00d7" + waiting.callers[caller]).join(", ");
        row.append(el("td", "", callers));
        rows.push(row);
      });
    });
    document.getElementById("queue-body").replaceChildren(...rows);
    document.getElementById("queue").hidden = rows.length === 0;
    const none = document.getElementById("no-queue");
    none.hidden = rows.length > 0;
    none.textContent = doc.queue == null ? "No queue (broker mode)."
      : doc.queue.enabled ? "Nothing waits." : "The queue is off: every request goes at once.";
  }

  function render(doc) {
    document.getElementById("mode").textContent = doc.mode + " mode";
    document.getElementById("in-flight").textContent = "in flight " + doc.inFlight;
    renderFleet(doc);
    renderQueue(doc);
    renderRecent(doc);
  }

  async function refresh() {
    const line = document.getElementById("updated");
    try {
      const answer = await fetch("/status", {cache: "no-store",
        signal: AbortSignal.timeout(5000)});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      render(await answer.json());
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      line.className = "muted";
      line.textContent = "updated " + new Date().toLocaleTimeString([], {hour12: false});
    } catch (error) {
      line.className = "stale";
      line.textContent = "cannot read /status (" + error.message + "): showing the last view";
    } finally {
      setTimeout(refresh, REFRESH_MS);
    }
  }

  refresh();
})();
"""

PAGE_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nvpair-proxy status</title>
<style>{style}</style>
</head>
<body>
<header>
<h1>nvpair-proxy</h1>
<span id="mode" class="muted"></span>
<span id="in-flight" class="muted"></span>
<span id="spanning" class="muted"></span>
<span id="updated" class="muted">loading /status</span>
</header>
<h2>Fleet</h2>
<table id="fleet"><thead id="fleet-head"></thead><tbody id="fleet-body"></tbody></table>
<p id="no-nodes" class="muted" hidden>No node configured or discovered.</p>
<h2>Waiting</h2>
<table id="queue" hidden>
<thead><tr><th>facade</th><th>model</th><th>waiting</th><th>oldest</th><th>callers</th></tr></thead>
<tbody id="queue-body"></tbody>
</table>
<p id="no-queue" class="muted"></p>
<h2>Recent requests</h2>
<table id="recent">
<thead><tr><th>#</th><th>engine</th><th>model</th><th>state</th><th>attempts</th>
<th>error</th><th>first byte</th><th>tokens/s</th><th>admitted</th><th>queued</th>
<th>affinity</th></tr></thead>
<tbody id="recent-body"></tbody>
</table>
<p id="no-recent" class="muted" hidden>No inference request yet.</p>
<script>{script}</script>
</body>
</html>
"""


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE: bytes = PAGE_TEMPLATE.format(style=STYLE, script=SCRIPT).encode()

#: Nothing but this page's own inline style and script (each by its hash: no
#: ``'unsafe-inline'``) and ``fetch`` to its own origin; no frames, forms or base URL.
CONTENT_SECURITY_POLICY: bytes = (
    "default-src 'none'; "
    f"script-src {_digest(SCRIPT)}; "
    f"style-src {_digest(STYLE)}; "
    "connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
).encode()

__all__ = ["CONTENT_SECURITY_POLICY", "PAGE"]
