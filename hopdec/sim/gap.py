"""The largest iteration gap of a simulation, Iter(i) - Iter(j) over the workers, measured as it runs.

Evaluated at the end of an instant (after every event at that virtual time), as the logs' replay
(:mod:`hopdec.report.gaps`) reads the iterations workers entered; counted per iteration, so a worker
entering one costs O(1) however many workers there are (a scan of every worker at every instant took
seconds per iteration at 10,000 workers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hopdec.sim.events import EventQueue


class GapMeter:
    """``entered(r, k)`` when worker ``r`` enters iteration ``k``; ``max_gap``: the largest gap seen at the
    end of an instant once every worker has started (workers that :meth:`left` no longer count).

    >>> from hopdec.sim.events import EventQueue
    >>> q = EventQueue(); g = GapMeter(2, q)
    >>> for t, r, k in [(0.0, 0, 0), (0.0, 1, 0), (1.0, 0, 1), (2.0, 0, 2), (3.0, 1, 1)]:
    ...     q.at(t, lambda r=r, k=k: g.entered(r, k))
    >>> _ = q.run(); g.max_gap
    2
    """

    __slots__ = ("n", "q", "cur", "at", "started", "low", "high", "max_gap", "pending")

    def __init__(self, n: int, queue: EventQueue) -> None:
        self.n, self.q = n, queue
        self.cur: list[int] = [-1] * n         # each worker's iteration (-1: not started)
        self.at: dict[int, int] = {}           # iteration -> workers there now
        self.started = 0
        self.low, self.high = 0, -1
        self.max_gap = 0
        self.pending = False

    def entered(self, r: int, k: int) -> None:
        old = self.cur[r]
        at = self.at
        if old >= 0:
            at[old] -= 1
        else:
            self.started += 1
        self.cur[r] = k
        at[k] = at.get(k, 0) + 1
        # The gap can only reach a new maximum at an instant where the highest iteration rose (the lowest
        # never falls), or where the last worker started: evaluate it at the end of those instants only.
        if k > self.high:
            self.high = k
        elif old >= 0 or self.started < self.n:
            return
        if not self.pending:
            self.pending = True
            self.q.at_instant_end(self._now)

    def left(self, r: int) -> None:
        """Worker ``r`` died: the gap counts the living only."""
        if self.cur[r] >= 0:
            self.at[self.cur[r]] -= 1

    def _now(self) -> None:
        self.pending = False
        if self.started < self.n:
            return
        at, low, high = self.at, self.low, self.high
        while low <= high and not at.get(low):
            at.pop(low, None)
            low += 1
        if low > high:          # every worker died at this instant: nobody left to measure (the heal
            return              # that follows ends the run); the scan stops at the highest iteration
        self.low = low
        if self.high - low > self.max_gap:
            self.max_gap = self.high - low
