"""The process-wide reservation map (docs/candidate-order.md#reservations): in-flight dispatches the
scheduler has not seen.

One map for every facade — that is why the engines share a process
(docs/candidate-order.md#reservations). A reservation is stamped with the scheduler generation it
was counted against; a newer snapshot supersedes it (its ``pending`` already includes that work), so
releasing or moving it later must not touch the count again. Values only: no reactor, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from attrs import define


@define(eq=False)
class Reservation:
    """One request's claim on one node, valid while ``generation`` is current.

    Identity matters (two requests on one node hold two reservations), hence ``eq=False``.
    """

    node: str
    generation: int
    released: bool = False


class Reservations:
    """Per-node counts of live reservations, cleared by every newer scheduler snapshot."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        #: Below any generation a scheduler sends: its first snapshot (even 0) supersedes
        #: what was reserved before it.
        self._generation = -1

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def counts(self) -> Mapping[str, int]:
        """Live reservations per node (read-only view; nodes at zero are absent)."""
        return MappingProxyType(self._counts)

    def take(self, node: str) -> Reservation:
        """Reserve ``node`` for a request at the current generation."""
        self._counts[node] = self._counts.get(node, 0) + 1
        return Reservation(node, self._generation)

    def release(self, reservation: Reservation | None) -> None:
        """Release a claim once; a claim from an older generation is dropped.

        Applying a superseded release would double-count the completion and drive the node's
        estimated load below zero, which reads as permanently idle and attracts everything.
        """
        if reservation is None or reservation.released:
            return
        reservation.released = True
        if reservation.generation != self._generation:
            return
        count = self._counts.get(reservation.node, 0) - 1
        if count > 0:
            self._counts[reservation.node] = count
        else:
            self._counts.pop(reservation.node, None)

    def move(self, reservation: Reservation | None, node: str) -> Reservation:
        """Follow the dispatch: the node that refused is not doing the work, ``node`` is.

        The claim on the old node is released (dropped if superseded) and a fresh one taken at
        the current generation: the scheduler has not seen this dispatch either way.
        """
        if (
            reservation is not None
            and not reservation.released
            and reservation.node == node
            and reservation.generation == self._generation
        ):
            return reservation
        self.release(reservation)
        return self.take(node)

    def new_snapshot(self, generation: int) -> None:
        """A scheduler snapshot was applied: it supersedes every reservation taken before it.

        The caller applies each generation at most once (a redelivered snapshot must not clear
        live reservations); an older or equal generation here is a caller bug.
        """
        if generation <= self._generation:
            raise ValueError(f"generation {generation} is not newer than {self._generation}")
        self._generation = generation
        self._counts.clear()
