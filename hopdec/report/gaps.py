"""The iteration gap a run observed, from its logs: the largest Iter(i) - Iter(j) (Hop Table 1's quantity).

Every log record says "worker r entered iteration k at time t"; replaying those events in time order
(events at the same time together) gives each pair's gap at every instant. The summary of a real run, the
simulator's summary and ``hopdec report`` all compute the gap here, from ``entries[r] = [(time, iter)]``.
"""

import numpy as np


def max_iteration_gap(entries):
    """Largest observed Iter(i) - Iter(j) for every ordered pair, from ``entries[r] = [(time, iter)]``.

    Replays all "worker r entered iteration k at time t" events in time order (events at the same time
    together) and tracks each pair's gap. Returns an n x n matrix.
    """
    n = len(entries)
    events = sorted((t, r, k) for r, ev in enumerate(entries) for t, k in ev)
    cur = np.full(n, -1, dtype=np.int64)           # -1: not started yet
    best = np.zeros((n, n), dtype=np.int64)
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, r, k = events[i]
            cur[r] = max(cur[r], k)
            i += 1
        started = cur >= 0
        if started.all():
            best = np.maximum(best, cur[:, None] - cur[None, :])
    return best


def gap_sweep(entries):
    """``(t, largest Iter(i) - Iter(j) at t)`` after each instant some worker entered an iteration, once every
    worker has started, from ``entries[r] = [(time, iter)]`` (events at the same time together; a record
    not past the worker's current iteration is ignored). O(E log E): its maximum is that of
    :func:`max_iteration_gap` without the n x n matrix (what the simulator and ``hopdec plot`` use)."""
    n = len(entries)
    events = sorted((t, r, k) for r, ev in enumerate(entries) for t, k in ev)
    cur = [-1] * n
    at, started, low, high = {}, 0, None, -1     # at[k]: workers now at k; low only rises
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            _, r, k = events[i]
            i += 1
            if k <= cur[r]:
                continue
            if cur[r] >= 0:
                at[cur[r]] -= 1
            else:
                started += 1
            cur[r] = k
            at[k] = at.get(k, 0) + 1
            high = max(high, k)
        if started == n:
            low = min(k for k, c in at.items() if c) if low is None else low
            while not at.get(low):
                low += 1
            yield t, high - low


def largest_gap(entries):
    """The largest Iter(i) - Iter(j) over all pairs, from :func:`gap_sweep` (no n x n matrix)."""
    return max((g for _, g in gap_sweep(entries)), default=0)
