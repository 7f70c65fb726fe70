"""ZipLine: the ElasticBSP barrier search (Zhao et al., *ZipLine: an optimized algorithm for the elastic bulk synchronous parallel model*, sec. 4-5).

Problem 1 of the paper: ``times`` is an n x R array, row p holding worker p's next R predicted push
times (non-decreasing). Choose exactly one time per worker so that the span ``max - min`` of the
chosen times (the waiting time of the first worker to reach the barrier) is minimal.

Three solvers, all returning ``(indices, span)`` -- ``indices[p]`` is the 0-based column chosen in
row p, ``span`` a Python float:

* :func:`zipline` -- the fast one, O(R n log n): the heap-based "smallest range covering one element
  of each of n sorted lists" scan. It visits candidate windows in the same order as ZipLine's
  left-to-right scan (by their earliest element), and a binary heap plays the part of
  ZipLineOptBS's sorted container (seeds README: "ZipLineOptBS needs a sorted container (or the
  heap-based smallest-range algorithm) to be O(R n log n)").
* :func:`zipline_plain` -- the paper's plain ZipLine (Algorithm 2): one pass over all R n points
  sorted by time, keeping the latest point per worker and searching the candidate's minimum in
  O(n) (done with numpy, so n=1000, R=150 is still feasible), O(R n^2) overall.
* :func:`zipline_exhaustive` -- brute force over all R^n choices (small n only), the test oracle.

Ties ("earliest optimum", paper sec. 4.2 and Corollary 1: the earliest barrier means the least
stale gradients). Precisely, all three return the same answer:

1. the smallest span;
2. among optimal choices, the smallest barrier time ``t_sync = max`` of the chosen times;
3. within that window ``[t_sync - span, t_sync]`` each worker takes its *latest* push that is not
   after ``t_sync`` (the largest index j with ``times[p, j] <= t_sync``). That is the choice
   ZipLine's scan makes (a new point of a worker replaces that worker's older one, Lemma 2), it
   lets every worker do as much work as possible before the barrier, and it is the
   lexicographically largest index vector among the optimal choices with that t_sync.

For ElasticBSP the barrier is then a per-worker push count (seeds README): worker p stops after
its ``indices[p] + 1``-th predicted push.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Tuple

import numpy as np

from hopdec.errors import ConfigError

__all__ = ["zipline", "zipline_plain", "zipline_exhaustive", "predict_pushes"]


def _as_times(times) -> np.ndarray:
    """Validate and convert ``times`` to a float64 n x R array (one line on bad input)."""
    try:
        arr = np.asarray(times, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"zipline: times must be an n x R array of numbers ({err})") from None
    if arr.ndim != 2:
        raise ConfigError(f"zipline: times must be a 2-D n x R array, got {arr.ndim}-D")
    n, r = arr.shape
    if n < 1 or r < 1:
        raise ConfigError(f"zipline: times must have at least one worker and one time, got {n}x{r}")
    if not np.all(np.isfinite(arr)):
        raise ConfigError("zipline: times must be finite (no NaN or inf)")
    if r > 1 and np.any(np.diff(arr, axis=1) < 0):
        p = int(np.nonzero(np.any(np.diff(arr, axis=1) < 0, axis=1))[0][0])
        raise ConfigError(f"zipline: row {p} of times is not non-decreasing")
    return arr


def _indices_for(arr: np.ndarray, t_sync: float) -> np.ndarray:
    """Tie rule 3: per row, the largest index whose time is <= t_sync."""
    idx = np.empty(arr.shape[0], dtype=np.int64)
    for p in range(arr.shape[0]):
        idx[p] = np.searchsorted(arr[p], t_sync, side="right") - 1
    return idx


def zipline(times) -> Tuple[np.ndarray, float]:
    """Fast ZipLine, O(R n log n): smallest span choosing one time per worker, earliest optimum.

    Heap-based smallest range: keep one pointer per row (initially column 0) and a min-heap of the
    pointed times; the window [heap min, current max] always holds one point per worker. Pop the
    minimum, score the window, advance that row's pointer; stop when a row runs out. Windows come
    out in non-decreasing order of their minimum, so keeping the first strictly better (span,
    t_sync) gives the earliest optimum. See the module docstring for the exact tie rule.
    """
    arr = _as_times(times)
    n, r = arr.shape
    rows = arr.tolist()  # Python floats: heap operations on lists of floats are much faster
    heap = [(rows[p][0], p) for p in range(n)]
    heapq.heapify(heap)
    ptr = [0] * n
    cur_max = max(row[0] for row in rows)
    best_span = float("inf")
    best_max = float("inf")
    heappop, heappush = heapq.heappop, heapq.heappush
    while True:
        t_min, p = heappop(heap)
        span = cur_max - t_min
        if span < best_span or (span == best_span and cur_max < best_max):
            best_span, best_max = span, cur_max
        j = ptr[p] + 1
        if j == r:
            break
        ptr[p] = j
        t_next = rows[p][j]
        if t_next > cur_max:
            cur_max = t_next
        heappush(heap, (t_next, p))
    return _indices_for(arr, best_max), float(best_span)


def zipline_plain(times) -> Tuple[np.ndarray, float]:
    """The paper's plain ZipLine (Algorithm 2), O(R n^2): for comparison and as a second oracle.

    Sort all R n points by (time, worker) into Omega; scan left to right, a new point replacing
    the same worker's older point in the candidate Z; once Z holds all n workers, d_Z = new time -
    min(Z) (the O(n) minimum search of the paper, here one numpy ``min``). The first candidate
    with the smallest d_Z is kept (the chronologically first, Fig. 9).
    """
    arr = _as_times(times)
    n, r = arr.shape
    flat = arr.ravel()
    workers = np.repeat(np.arange(n), r)
    order = np.lexsort((workers, flat))  # by time, then worker id (paper, sec. 5.2 step 1)
    ts = flat[order].tolist()
    ws = workers[order].tolist()
    current = np.full(n, np.inf)  # Z: the latest scanned time of each worker (inf = not yet)
    have = 0
    best_span = float("inf")
    best_max = float("inf")
    for t, w in zip(ts, ws):
        if current[w] == np.inf:
            have += 1
        current[w] = t
        if have == n:
            span = t - float(current.min())
            if span < best_span:
                best_span, best_max = span, t
    return _indices_for(arr, best_max), float(best_span)


def zipline_exhaustive(times, max_candidates: int = 2_000_000) -> Tuple[np.ndarray, float]:
    """Brute force over all R^n choices (the paper's naive search); small instances only.

    Minimises (span, max time, then the lexicographically largest index vector), which is the
    same tie rule as :func:`zipline` (see the module docstring).
    """
    arr = _as_times(times)
    n, r = arr.shape
    if r ** n > max_candidates:
        raise ConfigError(f"zipline_exhaustive: {r}^{n} candidates is too many (limit {max_candidates})")
    rows = arr.tolist()
    best_key = None
    best_idx = None
    for combo in itertools.product(range(r), repeat=n):
        vals = [rows[p][j] for p, j in enumerate(combo)]
        hi, lo = max(vals), min(vals)
        key = (hi - lo, hi, tuple(-j for j in combo))
        if best_key is None or key < best_key:
            best_key, best_idx = key, combo
    return np.asarray(best_idx, dtype=np.int64), float(best_key[0])


def predict_pushes(last_push_times, intervals, R: int) -> np.ndarray:
    """ElasticBSP's lookahead: row p is ``t_p + i * gamma_p`` for i = 1..R (seeds README decision).

    ``last_push_times[p]`` is worker p's latest push time t_p and ``intervals[p]`` its latest
    iteration interval gamma_p (>= 0). Returns an n x R float64 array, ready for :func:`zipline`.
    """
    if isinstance(R, bool) or not isinstance(R, (int, np.integer)) or R < 1:
        raise ConfigError(f"--lookahead must be an integer >= 1, got {R!r}")
    t = np.asarray(last_push_times, dtype=np.float64).reshape(-1)
    g = np.asarray(intervals, dtype=np.float64).reshape(-1)
    if t.shape != g.shape:
        raise ConfigError(f"predict_pushes: {t.size} push times but {g.size} intervals")
    if np.any(g < 0) or not np.all(np.isfinite(g)) or not np.all(np.isfinite(t)):
        raise ConfigError("predict_pushes: intervals must be finite and >= 0")
    return t[:, None] + np.arange(1, int(R) + 1, dtype=np.float64)[None, :] * g[:, None]
