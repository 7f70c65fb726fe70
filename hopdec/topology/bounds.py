"""Hop Table 1: bounds on the iteration gap Iter(i) - Iter(j) and the queue sizes they imply (sec. 3-4).

Path lengths come from the graph's pattern (self-loops ignored, weights not looked at). The functions
below return dense n x n arrays; :func:`pair_summary` computes every figure ``hopdec topo analyze``
needs in one pass over blocks of breadth-first searches, in O(n) memory per block, for large graphs.

>>> from hopdec.topology.generators import ring
>>> diameter(ring(8)), max_gap_bound(ring(8)), max_gap_bound(ring(8), "backup", max_ig=1)
(4, 4.0, 4.0)
"""

import math
import numbers

import numpy as np

from hopdec.errors import ConfigError
from hopdec.topology.graph_io import in_neighbors

BLOCK_ENTRIES = 2 ** 22
"""Distances held at once by :func:`pair_summary` (rows x n; 32 MiB of float64)."""

_SETTINGS = ("standard", "notify-ack", "staleness", "backup", "hybrid")


def check_max_ig(max_ig, what="--max-ig"):
    """``max_ig`` must be an integer >= 1 (Hop sec. 4.2: the token queues start with max_ig tokens). The one
    check of it: the Table 1 bounds here, the protocol settings and the token ledger
    (:mod:`hopdec.hop.config`, :mod:`hopdec.hop.token_queue`) all call this."""
    if isinstance(max_ig, bool) or not isinstance(max_ig, numbers.Integral) or max_ig < 1:
        raise ConfigError(f"{what} {max_ig!r}: must be an integer >= 1")
    return int(max_ig)


def path_lengths(G):
    """``D[a, b]`` = length of the shortest directed path ``a -> b`` (hops; self-loops ignored).

    ``np.inf`` where ``b`` cannot be reached from ``a``; ``D[a, a] = 0``.

    >>> path_lengths(ring(4))[0].tolist()
    [0.0, 1.0, 2.0, 1.0]
    """
    from scipy.sparse import csgraph
    A = _csr_pattern(G)
    if A.shape[0] == 0:
        return np.zeros(A.shape)
    # every source's breadth-first search in C (one call, no Python loop over sources)
    return csgraph.shortest_path(A, method="D", directed=True, unweighted=True)


def _csr_pattern(G):
    """The graph's 0/1 adjacency as a scipy CSR matrix, self-loops left out."""
    import scipy.sparse as sp
    n = G.number_of_nodes()
    pairs = np.array([(int(u), int(v)) for u, v in G.edges() if u != v], dtype=np.int64).reshape(-1, 2)
    return sp.csr_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))


def _bfs_distances(A, source):
    """Hop distances from ``source`` over CSR pattern ``A`` (``inf``: unreachable).

    One breadth-first search in C (scipy), then the depth of every node in the BFS tree by pointer
    jumping: O(n log depth) numpy work instead of a Python loop over nodes.
    """
    from scipy.sparse import csgraph
    _, pred = csgraph.breadth_first_order(A, source, directed=True, return_predecessors=True)
    reached = pred >= 0
    reached[source] = True
    up = np.where(reached, pred, source)
    up[source] = source
    depth = np.where(reached, 1.0, 0.0)
    depth[source] = 0.0
    while True:
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        depth += depth[up]
        up = nxt
    depth[~reached] = np.inf
    return depth


def pair_summary(G, max_ig, staleness=None, visit=None):
    """Every all-pairs figure of ``hopdec topo analyze``, from one pass of breadth-first searches.

    Returns a dict: ``diameter``; ``bounds`` (the largest Table 1 bound per setting, as
    :func:`max_gap_bound` gives them: ``standard``, ``standard+tokens``, ``staleness`` and
    ``staleness+tokens`` when ``staleness`` is given, ``backup``, ``backup+tokens``, ``hybrid``,
    ``hybrid+tokens``, ``notify-ack``); ``update_queue_no_tokens`` and ``token_queue`` (the largest
    :func:`update_queue_capacity_no_tokens` and :func:`token_queue_capacity`). Distances are
    computed block by block (``L[i, :]`` forward, ``L[:, i]`` on the reversed graph unless the
    graph is symmetric), so memory stays O(n) per block and each distance is computed once. ``visit(rows,
    fwd, back)``, if given, sees every block too (``fwd[r, j] = L[i, j]``, ``back[r, j] = L[j, i]`` for the
    r-th node i of ``rows``): a time-varying graph's Table 1 comes from the same searches
    (:mod:`hopdec.topology.schedule_analysis`).

    >>> pair_summary(ring(8), 2)["bounds"]["standard+tokens"], pair_summary(ring(8), 2)["diameter"]
    (4.0, 4.0)
    """
    A = _csr_pattern(G)
    n = A.shape[0]
    back_graph = A.T.tocsr()
    symmetric = (A != back_graph).nnz == 0
    ig = float(max_ig)
    s1 = None if staleness is None else float(staleness) + 1
    best = dict.fromkeys(["diameter", "standard+tokens", "notify-ack", "staleness+tokens",
                          "update_queue_no_tokens", "token_queue"], 0.0)
    step = max(1, BLOCK_ENTRIES // max(n, 1))
    for start in range(0, n, step):
        rows = range(start, min(n, start + step))
        fwd = np.array([_bfs_distances(A, i) for i in rows])           # fwd[r, j] = L[i, j]
        back = fwd if symmetric else np.array([_bfs_distances(back_graph, i) for i in rows])
        if visit is not None:
            visit(rows, fwd, back)
        best["diameter"] = max(best["diameter"], fwd.max())
        best["standard+tokens"] = max(best["standard+tokens"], np.minimum(back, ig * fwd).max())
        best["notify-ack"] = max(best["notify-ack"], np.minimum(back, 2 * fwd).max())
        if s1 is not None:
            best["staleness+tokens"] = max(best["staleness+tokens"],
                                           np.minimum(s1 * back, ig * fwd).max())
        for r, i in enumerate(rows):
            senders = back_graph.indices[back_graph.indptr[i]:back_graph.indptr[i + 1]]  # N_in(i)
            ahead = fwd[r, senders]                                   # len Path i->j
            best["update_queue_no_tokens"] = max(best["update_queue_no_tokens"],
                                                 float((ahead + 1).sum()) + 1)
            if len(senders):
                best["token_queue"] = max(best["token_queue"], ig * (ahead.max() + 1))
    d = best["diameter"]
    unbounded = math.inf if n > 1 else 0.0
    bounds = {"standard": d, "standard+tokens": best["standard+tokens"]}
    if s1 is not None:
        bounds["staleness"] = s1 * d
        bounds["staleness+tokens"] = best["staleness+tokens"]
    bounds.update({"backup": unbounded, "backup+tokens": ig * d, "hybrid": unbounded,
                   "hybrid+tokens": ig * d, "notify-ack": best["notify-ack"]})
    return {"diameter": float(d), "bounds": {k: float(v) for k, v in bounds.items()},
            "update_queue_no_tokens": float(best["update_queue_no_tokens"]),
            "token_queue": float(best["token_queue"])}


def diameter(G):
    """Longest shortest directed path (``math.inf`` if not strongly connected).

    >>> diameter(ring(8)), diameter(ring_based(8)), diameter(complete(4))
    (4, 2, 1)
    """
    m = path_lengths(G).max()
    return int(m) if math.isfinite(m) else math.inf



def gap_bounds(G, setting="standard", max_ig=None, staleness=None):
    """``B[i, j]`` = upper bound on ``Iter(i) - Iter(j)`` per Hop Table 1 (``np.inf``: unbounded).

    With ``L = path_lengths(G)`` (so ``L[j, i]`` = len Path j->i):

    - ``"standard"`` (update queues only, Theorem 1): ``L[j, i]``
    - ``"notify-ack"`` (3.3): ``min(L[j, i], 2 L[i, j])``
    - ``"staleness"`` (bounded staleness s, no tokens): ``(s+1) L[j, i]``
    - ``"backup"`` / ``"hybrid"`` without tokens: ``inf``

    With ``max_ig`` (token queues, Theorem 2) the bound becomes ``min(b0 L[j, i], max_ig L[i, j])``
    with ``b0`` = 1 (standard), ``s+1`` (staleness), ``inf`` (backup, hybrid). Iteration
    skipping takes and gives tokens, so it keeps the token bound. Tokens also tighten
    notify-ack the same way. The diagonal is 0.

    >>> gap_bounds(ring(4))[0].tolist()               # worker 0 ahead of j: len Path j->0
    [0.0, 1.0, 2.0, 1.0]
    >>> gap_bounds(ring(4), "backup", max_ig=3)[0].tolist()
    [0.0, 3.0, 6.0, 3.0]
    """
    if setting not in _SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {', '.join(_SETTINGS)}")
    if max_ig is not None:
        max_ig = check_max_ig(max_ig, "max_ig")
    if setting == "staleness" and staleness is None:
        raise ValueError("setting 'staleness' needs staleness=s (s >= 0)")
    if staleness is not None and (int(staleness) != staleness or staleness < 0):
        raise ValueError(f"staleness must be a non-negative integer, got {staleness!r}")
    L = path_lengths(G)
    back = L.T  # back[i, j] = len Path j->i
    with np.errstate(invalid="ignore"):
        if setting == "standard":
            B = back.copy()
        elif setting == "notify-ack":
            B = np.minimum(back, 2 * L)
        elif setting == "staleness":
            B = (staleness + 1) * back
        else:  # backup, hybrid
            B = np.full_like(L, np.inf)
        if max_ig is not None:
            B = np.minimum(B, max_ig * L)
    np.fill_diagonal(B, 0.0)
    return B


def max_gap_bound(G, setting="standard", max_ig=None, staleness=None):
    """The largest ``Iter(i) - Iter(j)`` over all ordered pairs (``inf`` if unbounded).

    >>> G = exponential(8)
    >>> max_gap_bound(G), max_gap_bound(G, max_ig=2), max_gap_bound(G, "backup")
    (3.0, 2.0, inf)
    """
    return float(gap_bounds(G, setting, max_ig=max_ig, staleness=staleness).max())


def update_queue_capacity(G, max_ig, count_self=True):
    """``{i: (1 + max_ig) * |N_in(i)|}``: updates ``UpdateQ(i)`` must hold with token queues (4.2).

    Hop counts the self-loop in ``N_in(i)`` (in Fig. 4 a worker enqueues its own update too), and
    so does this by default; ``count_self=False`` gives ``(1 + max_ig) * (|N_in(i)| - 1)``, the
    updates received from other workers, for a runtime that keeps its own update locally.

    >>> update_queue_capacity(ring(4), 2), update_queue_capacity(ring(4), 2, count_self=False)[0]
    ({0: 9, 1: 9, 2: 9, 3: 9}, 6)
    """
    max_ig = check_max_ig(max_ig, "max_ig")
    extra = 1 if count_self else 0
    return {int(i): (1 + int(max_ig)) * (len(in_neighbors(G, i)) + extra) for i in G.nodes}


def token_queue_capacity(G, max_ig):
    """``C[i, j] = max_ig * (len Path i->j + 1)``: most tokens ``TokenQ(i->j)`` can hold (4.2).

    ``TokenQ(i->j)`` lives at worker ``i`` and holds tokens for its in-neighbour ``j`` (edge
    ``j -> i``); entries without such a queue (no edge ``j -> i``, or ``i == j``) are 0.

    >>> int(token_queue_capacity(ring(6), 2).max())      # len Path 0->1 = 1: 2 * (1 + 1)
    4
    >>> int(token_queue_capacity(exponential(8), 1)[1, 0])  # 0->1 is an edge; Path 1->0 has 3 hops
    4
    """
    max_ig = check_max_ig(max_ig, "max_ig")
    L = path_lengths(G)
    has_queue = (_pattern(G).T > 0)  # [i, j] true iff edge j -> i
    np.fill_diagonal(has_queue, False)
    C = np.where(has_queue, int(max_ig) * (L + 1), 0)
    return C.astype(int) if np.isfinite(C).all() else C    # inf: no path back (not strongly connected)


def update_queue_capacity_no_tokens(G, count_self=True):
    """``{i: sum_j (len Path i->j + 1)}`` over in-neighbours j: UpdateQ(i) without tokens (4.1).

    In-neighbour ``j`` can be ``len Path i->j`` iterations ahead of ``i``, so ``UpdateQ(i)`` must
    hold that many + 1 iterations of ``j``'s updates; this grows with the graph, tokens cap it.

    >>> update_queue_capacity_no_tokens(ring(8))[0]      # self 1 + two neighbours (1 + 1) each
    5
    """
    L = path_lengths(G)
    out = {}
    for i in G.nodes:
        senders = in_neighbors(G, i) + ([i] if count_self else [])
        total = sum(L[i, j] + 1 for j in senders)
        out[int(i)] = int(total) if math.isfinite(total) else math.inf
    return out


def _pattern(G):
    """0/1 adjacency matrix of ``G`` (``A[i, j] = 1`` iff edge ``i -> j``), ignoring weights."""
    n = G.number_of_nodes()
    A = np.zeros((n, n), dtype=int)
    for u, v in G.edges():
        A[int(u), int(v)] = 1
    return A
