"""Small building blocks every package may use: Go-style durations, strict JSON, the collector's
settings for a long-running process, and the log sink with its live level.

Owns no state of the proxy's own. May import nothing else from ``nvpair``
(docs/architecture.md#layers).
"""
