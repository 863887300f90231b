"""The status page's style sheet (:mod:`nvpair.observe.statuspage`): inline in the page, allowed
by its hash, so that the page loads nothing else (docs/operations.md#the-status-page)."""

from __future__ import annotations

STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700;
  --hold: #bc4c00; --idle: #6e7781; --run: #0969da; --line: #d0d7de; }
* { box-sizing: border-box; }
body { margin: 0; padding: 1rem 1.5rem; font: 14px/1.4 system-ui, sans-serif; }
header { display: flex; flex-wrap: wrap; gap: .5rem 1.5rem; align-items: baseline; }
h1 { font-size: 1.25rem; margin: 0; }
h2 { font-size: 1rem; margin: 1.5rem 0 .5rem; }
.muted, .url, .why, .figure { color: var(--idle); }
.stale { color: var(--bad); font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
#fleet { width: auto; }
#fleet td.cell { min-width: 18rem; }
#fleet-body th { white-space: nowrap; }
th, td { border: 1px solid var(--line); padding: .35rem .5rem; text-align: left;
  vertical-align: top; }
th { font-weight: 600; }
td.empty { color: var(--idle); text-align: center; }
.cell-head { display: flex; flex-wrap: wrap; gap: .25rem .75rem; align-items: center; }
.url, .why, .load, .key { font-size: 12px; }
.key { color: var(--idle); }
.why { font-style: italic; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: .6rem; color: #fff;
  font-size: 12px; font-weight: 600; background: var(--idle); }
.node-up, .work-completed, .result-served, .node-listed { background: var(--ok); }
.node-down, .node-hung, .work-failed { background: var(--bad); }
.node-loading, .work-queued { background: var(--warn); }
.node-held-back { background: var(--hold); }
.work-running { background: var(--run); }
ul.models { list-style: none; margin: .25rem 0 0; padding: 0; display: flex;
  flex-wrap: wrap; gap: .25rem; }
ul.models li { border: 1px solid var(--line); border-radius: .3rem; padding: 0 .3rem;
  font-family: ui-monospace, monospace; font-size: 12px; }
ul.models li.warm { border-color: var(--ok); box-shadow: inset 0 0 0 1px var(--ok); }
.path { display: flex; flex-wrap: wrap; gap: .25rem; align-items: center; }
.attempt { border: 1px solid var(--line); border-radius: .3rem; padding: 0 .35rem;
  font-size: 12px; white-space: nowrap; }
.attempt .node { font-weight: 600; }
.attempt.result-served { color: #fff; background: var(--ok); border-color: var(--ok); }
.attempt.result-served .said { font-weight: 600; }
.attempt.result-status, .attempt.result-transport, .attempt.result-first_body_timeout {
  border-color: var(--bad); }
.attempt.result-node_left { border-color: var(--hold); }
.attempt.result-truncated { color: #fff; background: var(--warn); border-color: var(--warn); }
.arrow { color: var(--idle); }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.affinity { font-size: 12px; }
.affinity-followed { color: var(--ok); }
.affinity-moved { color: var(--hold); }
"""
