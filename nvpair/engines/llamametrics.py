"""Pure reading of a llama-server's busy slots from its Prometheus ``/metrics``
(docs/fleet-scheduling.md#sleeping-servers).

Every ``/slots`` request counts as work for a server's idle timer, so a server polled there more
often than its ``--sleep-idle-seconds`` never falls asleep. Its ``/metrics`` (on with
``--metrics``) does not: llama-server posts it as a metrics task, the one kind that leaves the
timer alone (``server-queue.cpp``, ``task_resets_idle_timer``), and answers a sleeping server from
what it cached. It says ``llamacpp:requests_processing``, the slots generating now, counted as
``/slots`` counts ``is_processing``; ``/props`` says ``total_slots`` and whether ``/metrics`` is on
(``endpoint_metrics``). This module reads those two answers and nothing else: what it cannot
read is None, never an exception — the text comes from an engine, so it may be huge, garbled or
say ``NaN``.
"""

from __future__ import annotations

import math

__all__ = ["BUSY_METRIC", "metrics_slots", "requests_processing"]

#: The gauge of the slots generating now.
BUSY_METRIC = b"llamacpp:requests_processing"

#: More slots than any server runs: a figure past it is garbage, not a reading.
_MOST_SLOTS = 1 << 16


def metrics_slots(props: object) -> int | None:
    """The server's slot count from its ``/props``, when it also says ``/metrics`` is on
    (``endpoint_metrics: true``) — then its busy slots are read there rather than at
    ``/slots``; None otherwise (``/slots`` it is)."""
    if not isinstance(props, dict) or props.get("endpoint_metrics") is not True:
        return None
    total = props.get("total_slots")
    # bool is an int: true is no slot count.
    if not isinstance(total, int) or isinstance(total, bool) or not 0 < total <= _MOST_SLOTS:
        return None
    return total


def requests_processing(body: bytes, slots: int) -> int | None:
    """``llamacpp:requests_processing`` out of a ``/metrics`` text: a whole number of busy slots
    of the server's ``slots``, or None when the sample is missing, repeated with another value,
    or not a finite whole number from 0 to ``slots``."""
    found: int | None = None
    for line in body.splitlines():
        name, _, rest = line.partition(b" ")
        if name != BUSY_METRIC:
            # Comments (# HELP, # TYPE), other samples, and a labelled series of another name.
            continue
        # A sample line: the value, then perhaps a timestamp.
        value = _count(rest.split(b" ", 1)[0])
        if value is None or value > slots or (found is not None and value != found):
            return None
        found = value
    return found


def _count(text: bytes) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or not value.is_integer() or not 0 <= value <= _MOST_SLOTS:
        return None
    return int(value)
