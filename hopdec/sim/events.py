"""A discrete-event queue in virtual time: callbacks run in time order (ties in scheduling order)."""

import heapq
import itertools


class EventQueue:
    """``at(t, fn)`` schedules ``fn()`` at virtual time ``t``; :meth:`run` calls them in order.

    >>> q, seen = EventQueue(), []
    >>> q.at(2.0, lambda: seen.append("b")); q.at(1.0, lambda: seen.append("a"))
    >>> _ = q.run(); seen, q.now
    (['a', 'b'], 2.0)
    """

    def __init__(self):
        self.now = 0.0
        self._heap = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t, fn):
        if t < self.now:
            raise ValueError(f"cannot schedule at {t} before now ({self.now})")
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def after(self, delay, fn):
        self.at(self.now + delay, fn)

    def __len__(self):
        return len(self._heap)

    def run(self, until=None, on_event=None):
        """Run events up to virtual time ``until`` (all when None); ``on_event()`` after each one."""
        while self._heap and (until is None or self._heap[0][0] <= until):
            self.now, _, fn = heapq.heappop(self._heap)
            fn()
            self.events += 1
            if on_event:
                on_event()
        return self
