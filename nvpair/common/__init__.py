"""Small building blocks every package may use: Go-style durations, strict JSON, a JSON body's
top level read where it lies (and its model renamed there), the collector's settings for a
long-running process and the memory a flood held given back, deadlines of one duration on one
timer, the proxy's answer reasons, and the log: its sink, live level, text form and Twisted's
own lines in words.

Owns no state of the proxy's own. May import nothing else from ``nvpair``
(docs/architecture.md#layers).
"""
