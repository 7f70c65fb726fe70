"""The iteration gap a run observed, from its logs: the largest Iter(i) - Iter(j) (Hop Table 1's quantity).

Every log record says "worker r entered iteration k at time t"; replaying those events in time order
(events at the same time together) gives each pair's gap at every instant. The summary of a real run, the
simulator's summary and ``hopdec report`` all compute the gap here, from ``entries[r] = [(time, iter)]``.
A worker declared dead (``gone[r]``: the time of the heal that removed it, ``--fault-tolerance``) counts
until then: the survivors' gap is bounded on the healed graph, not against a worker that stopped.
"""

import numpy as np


def _events(entries, gone):
    """Time-ordered ``(t, r, k)``; a removal of worker r at ``gone[r]`` is ``(t, r, None)``, sorted after
    the records of the same instant."""
    events = [(t, 0, r, k) for r, ev in enumerate(entries) for t, k in ev]
    events += [(t, 1, r, None) for r, t in enumerate(gone or ()) if t is not None]
    events.sort(key=lambda e: (e[0], e[1], e[2], -1 if e[3] is None else e[3]))
    return [(t, r, k) for t, _, r, k in events]


def max_iteration_gap(entries, gone=None):
    """Largest observed Iter(i) - Iter(j) for every ordered pair, from ``entries[r] = [(time, iter)]``.

    Replays all "worker r entered iteration k at time t" events in time order (events at the same time
    together) and tracks each pair's gap, each removed worker only until ``gone[r]``. Returns an n x n matrix.
    """
    n = len(entries)
    events = _events(entries, gone)
    cur = np.full(n, -1, dtype=np.int64)           # -1: not started yet
    alive = np.ones(n, dtype=bool)
    best = np.zeros((n, n), dtype=np.int64)
    started = False         # every live worker has entered an iteration (then it stays so: cur only grows)
    i = 0
    while i < len(events):
        t = events[i][0]
        moved = set()
        while i < len(events) and events[i][0] == t:
            _, r, k = events[i]
            if k is None:
                alive[r] = False
            elif alive[r] and k > cur[r]:
                cur[r] = k
                moved.add(r)
            i += 1
        if not started:
            started = bool((cur[alive] >= 0).all())
            if not started:
                continue
            live = np.flatnonzero(alive & (cur >= 0))          # the first time: every pair
            sub = cur[live]
            best[np.ix_(live, live)] = np.maximum(best[np.ix_(live, live)], sub[:, None] - sub[None, :])
            continue
        # after that only the pairs of a worker that moved can have a new largest gap (the others' gap is
        # what it was at the last instant, already counted): O(n) per instant, not O(n^2)
        live = np.flatnonzero(alive)
        for r in moved:
            if alive[r]:
                best[r, live] = np.maximum(best[r, live], cur[r] - cur[live])
                best[live, r] = np.maximum(best[live, r], cur[live] - cur[r])
    return best


def gap_sweep(entries, gone=None):
    """``(t, largest Iter(i) - Iter(j) at t)`` after each instant some worker entered an iteration, once every
    worker has started, from ``entries[r] = [(time, iter)]`` (events at the same time together; a record
    not past the worker's current iteration is ignored; a worker removed at ``gone[r]`` no longer counts).
    O(E log E): its maximum is that of :func:`max_iteration_gap` without the n x n matrix (what the simulator
    and ``hopdec plot`` use)."""
    n = len(entries)
    events = _events(entries, gone)
    cur = [-1] * n
    removed = [False] * n
    at, started, low, high = {}, 0, None, -1     # at[k]: workers now at k; low only rises
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, r, k = events[i]
            i += 1
            if removed[r]:
                continue
            if k is None:                          # declared dead: out of the live set
                removed[r] = True
                n -= 1
                if cur[r] >= 0:
                    at[cur[r]] -= 1
                    started -= 1
                continue
            if k <= cur[r]:
                continue
            if cur[r] >= 0:
                at[cur[r]] -= 1
            else:
                started += 1
            cur[r] = k
            at[k] = at.get(k, 0) + 1
            high = max(high, k)
        if started == n and n > 0:
            low = min(k for k, c in at.items() if c) if low is None else low
            while not at.get(low):
                low += 1
            high = max(k for k, c in at.items() if c) if not at.get(high) else high
            yield t, high - low


def largest_gap(entries, gone=None):
    """The largest Iter(i) - Iter(j) over all pairs, from :func:`gap_sweep` (no n x n matrix)."""
    return max((g for _, g in gap_sweep(entries, gone)), default=0)
