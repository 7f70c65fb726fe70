"""A discrete-event queue in virtual time: callbacks run in time order (ties in scheduling order).

While it runs, Python's automatic cycle collector is paused and the young generations are collected every
:data:`COLLECT_EVERY` events instead. Why: a full automatic collection walks every live object, and a
simulation of n workers holds O(n) of them (cores, queues, logs); the longer an object lives in events,
the likelier it is promoted to the old generation, and at n = 10,000 events in flight live for thousands
of events, so full collections came often and each walked millions of objects -- the cost per event
grew with n. The simulator's own objects form no reference cycles (tests/test_sim_speed.py checks it),
so reference counting frees all of them; the periodic young collection bounds what a cycle made by other
code (a user's model) can hold, without walking the old objects.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

Event = Callable[[], Any]

COLLECT_EVERY: int = 1_000_000
"""Events between two collections of the young generations while :meth:`EventQueue.run` runs."""


@contextmanager
def collector_paused() -> Iterator[bool]:
    """Python's automatic cycle collector off inside (see the module's note: :meth:`EventQueue.run` runs in
    here; so do building n workers and their first steps, whose full collections walked them all, 0.6-0.8 s
    at 10,000 workers), back on after if it was on; yields whether it turned it off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield was
    finally:
        if was:
            gc.enable()


class EventQueue:
    """``at(t, fn)`` schedules ``fn()`` at virtual time ``t``; :meth:`run` calls them in order.

    ``at_instant_end(fn)`` runs ``fn()`` once after the last event of the current instant, before time
    moves on (the network model re-rates its transfers there, once for everything that started or ended
    at that instant).

    >>> q, seen = EventQueue(), []
    >>> q.at(2.0, lambda: seen.append("b")); q.at(1.0, lambda: seen.append("a"))
    >>> _ = q.run(); seen, q.now
    (['a', 'b'], 2.0)
    """

    def __init__(self) -> None:
        self.now: float = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq: Iterator[int] = itertools.count()
        self._end: list[Event] = []
        self._bg: int = 0                  # background events pending (see every)
        self.events: int = 0
        self._watch: Optional[tuple[int, Event]] = None  # (every so many events, fn): see watch

    def at(self, t: float, fn: Event) -> None:
        if t < self.now:
            raise ValueError(f"cannot schedule at {t} before now ({self.now})")
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def after(self, delay: float, fn: Event) -> None:
        self.at(self.now + delay, fn)

    def at_instant_end(self, fn: Event) -> None:
        self._end.append(fn)

    def every(self, interval: float, fn: Event) -> None:
        """Run ``fn()`` every ``interval`` virtual seconds from now on, in the background: :meth:`run`
        stops when only background events are left, so it never keeps a finished simulation going.

        A time on that grid with no event since the last call is skipped: nothing changed, so ``fn()``
        would see what it saw (an evaluation would repeat its row). So the calls are at most one per event
        whatever the interval -- ``--eval-interval 1e-9`` ends -- and an interval below the clock's
        resolution (``now + interval == now``) still moves on.

        >>> q, seen = EventQueue(), []
        >>> q.every(1.0, lambda: seen.append(q.now)); q.at(2.5, lambda: None); q.at(7.25, lambda: None)
        >>> _ = q.run(); seen       # not 2.0 (nothing since 1.0), nor 4..8 (after the last event)
        [1.0, 3.0]
        """
        def tick() -> None:
            self._bg -= 1
            fn()
            self._bg += 1
            due = self.now + interval
            heap = self._heap
            if heap and heap[0][0] > due:       # skip the grid times before the next event
                first = heap[0][0]
                due = self.now + math.ceil((first - self.now) / interval) * interval
                if due < first:                 # (rounding)
                    due += interval
            if due <= self.now:                 # interval below the clock's resolution here
                due = heap[0][0] if heap else self.now
            self.at(due, tick)
        self._bg += 1
        self.at(self.now + interval, tick)

    def watch(self, events: int, fn: Event) -> None:
        """Call ``fn()`` after every ``events`` events while :meth:`run` runs (not an event: it schedules
        nothing and sees no virtual time pass; e.g. a progress line by the wall clock)."""
        if events < 1:
            raise ValueError(f"watch every {events} events: must be >= 1")
        self._watch = (int(events), fn)

    def __len__(self) -> int:
        return len(self._heap)

    def run(self, until: Optional[float] = None, on_event: Optional[Event] = None) -> EventQueue:
        """Run events up to virtual time ``until`` (all when None); ``on_event()`` after each one."""
        heap, pop = self._heap, heapq.heappop
        limit = math.inf if until is None else until
        base, done = self.events, 0
        collect_at: float = COLLECT_EVERY   # events until the next young collection
        every: float
        watcher: Any
        every, watcher = self._watch or (math.inf, None)
        watch_at = every
        left = min(collect_at, watch_at)    # the next of the two, one comparison per event
        end = self._end                     # at_instant_end appends here; emptied in place
        # the collector paused meanwhile; if this run paused it, it collects the young generations itself
        with collector_paused() as paused:
            try:
                while True:
                    if end and (not heap or heap[0][0] > self.now):
                        hooks = end[:]
                        del end[:]
                        for fn in hooks:
                            fn()
                        continue
                    if len(heap) <= self._bg or (until is not None and heap[0][0] > limit):
                        return self
                    self.now, _, fn = pop(heap)
                    fn()
                    done += 1
                    if done >= left:
                        if done >= collect_at:
                            collect_at = done + COLLECT_EVERY
                            if paused:
                                gc.collect(1)
                        if done >= watch_at:
                            watch_at = done + every
                            self.events = base + done
                            watcher()
                        left = min(collect_at, watch_at)
                    if on_event is not None:
                        self.events = base + done
                        on_event()
            finally:
                self.events = base + done
