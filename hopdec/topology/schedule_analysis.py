"""What ``hopdec topo analyze`` reports about a time-varying topology (:mod:`hopdec.topology.schedule`).

Mixing: a period of P steps applies W_0, then W_1, ..., so the workers' parameters after a period are the
product ``M = W_0 W_1 ... W_{P-1}`` applied to them (``W[i, j]``: weight of i in j's average). Its spectral
gap |l1(M)| - |l2(M)| is the period's; ``1 - |l2(M)|^(1/P)`` is the *per-step* gap, the figure to compare
with a static graph's |l1(W)| - |l2(W)| = 1 - |l2(W)| (the same contraction per iteration). The per-step
matrices' own gaps and the union graph's (every edge at every step, eq. (1) weights) come beside it.

Hop Table 1 with time-varying edges (:mod:`hopdec.hop.time_varying` gives the argument): token queues on the
union graph bound Iter(i) - Iter(j) by ``max_ig * len Path_U(i->j)`` (Theorem 2); the update side becomes a
shortest path ``j -> i`` whose edges are as long as their *activation gap* g (an edge used once a period
lets its receiver run P iterations ahead of its sender, not 1), plus s per edge with bounded staleness:
``min(dist_b(j->i), max_ig * len_U(i->j))`` with b = g (standard), g + s (staleness), inf (backup, hybrid,
and iteration skipping, whose jump may leave an edge that was not active at the target unwaited).
"""

import math

import numpy as np
import scipy.sparse as sp

from hopdec.topology.schedule import schedule_of

DENSE_MAX_N = 500
"""Up to this many nodes the period's product is formed densely; beyond, ARPACK applies the steps."""

ALL_PAIRS_MAX_N = 20_000
"""Largest schedule whose all-pairs figures (Table 1, queue sizes) are computed (as for static graphs)."""


def _gap(moduli):
    return float(max(moduli[0] - moduli[1], 0.0)) if len(moduli) > 1 else float(moduli[0])


def product_moduli(schedule, k=2):
    """The ``k`` largest eigenvalue moduli of the period's product ``M = W_0 ... W_{P-1}`` (None when the
    sparse solver does not converge)."""
    mats = schedule.matrices()
    n = schedule.n
    if n <= DENSE_MAX_N:
        M = np.eye(n)
        for W in mats:
            M = M @ W.toarray()
        return np.sort(np.abs(np.linalg.eigvals(M)))[::-1][:k]
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigs

    from hopdec.topology.spectral import _start
    rev = [W.tocsr() for W in reversed(mats)]

    def apply(x):                    # M @ x = W_0 (W_1 (... (W_{P-1} x)))
        for W in rev:
            x = W @ x
        return x
    op = LinearOperator((n, n), matvec=apply, dtype=float)
    try:
        vals = eigs(op, k=k, which="LM", return_eigenvectors=False, maxiter=20 * n, tol=1e-10,
                    v0=_start(rev[0]))          # (a fixed start: the figure must not depend on what was solved before)
    except ArpackNoConvergence:
        return None
    return np.sort(np.abs(vals))[::-1]


def mixing(schedule):
    """The period's mixing figures: ``period_gap`` (of the product), ``per_step_gap``
    (``1 - |l2(M)|^(1/P)``), ``step_gaps`` (each W_m's), ``steps_doubly_stochastic``."""
    from hopdec.topology import spectral as S
    from hopdec.topology import weights as Wt
    m = product_moduli(schedule)
    out = dict(period=schedule.period, period_gap=None, per_step_gap=None)
    if m is not None:
        l2 = float(m[1]) if len(m) > 1 else 0.0
        out.update(period_gap=round(_gap(m), 12),
                   per_step_gap=round(1.0 - l2 ** (1.0 / schedule.period), 12) if l2 > 1e-12 else 1.0)
    mats = schedule.matrices()
    gaps = [S.spectral_gap(W if W.shape[0] > S.DENSE_MAX_N else W.toarray()) for W in mats]
    out["step_gaps"] = [None if g is None else round(g, 12) for g in gaps]
    out["steps_doubly_stochastic"] = all(Wt.is_doubly_stochastic(W) for W in mats)
    out["steps_column_stochastic"] = all(Wt.is_column_stochastic(W) for W in mats)
    return out


def _lengths(U, schedule, per_edge):
    """Sparse union adjacency with edge u->v of length ``per_edge(u, v)`` (finite ones only)."""
    rows, cols, vals = [], [], []
    for (u, v) in schedule.activations:
        b = per_edge(u, v)
        if math.isfinite(b):
            rows.append(u)
            cols.append(v)
            vals.append(float(b))
    n = schedule.n
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def edge_lengths(schedule, setting, staleness=None, skipping=False):
    """The update side's length of each union edge for a Table 1 setting: its activation gap g (standard),
    g + s (staleness), inf (backup, hybrid, or with iteration skipping)."""
    if setting in ("backup", "hybrid") or skipping:
        return lambda u, v: math.inf
    if setting == "staleness":
        return lambda u, v: schedule.activation_gap(u, v) + staleness
    if setting == "standard":
        return schedule.activation_gap
    raise ValueError(f"setting {setting!r} has no time-varying bound (notify-ack needs a static graph)")


def gap_bounds(U, setting="standard", max_ig=None, staleness=None, skipping=False):
    """``B[i, j]``: the bound on Iter(i) - Iter(j) on a time-varying topology (module docstring):
    ``min(dist_b(j -> i), max_ig * len_U(i -> j))``, ``np.inf`` where unbounded; diagonal 0.

    >>> from hopdec.topology.generators import one_peer_exponential
    >>> from hopdec.topology.schedule_analysis import gap_bounds as time_varying_bounds
    >>> U = one_peer_exponential(4)              # every edge is used every other step: g = 2
    >>> time_varying_bounds(U)[1].tolist()       # worker 1 ahead of j: dist_g(j -> 1)
    [2.0, 0.0, 4.0, 2.0]
    >>> time_varying_bounds(U, max_ig=1)[1].tolist(), time_varying_bounds(U, "backup", max_ig=1)[1].tolist()
    ([2.0, 0.0, 1.0, 1.0], [2.0, 0.0, 1.0, 1.0])
    """
    from scipy.sparse.csgraph import shortest_path
    s = schedule_of(U)
    if setting == "staleness" and staleness is None:
        raise ValueError("setting 'staleness' needs staleness=s (s >= 0)")
    per_edge = edge_lengths(s, setting, staleness, skipping)
    fwd = _lengths(U, s, per_edge)
    with np.errstate(invalid="ignore"):
        D = shortest_path(fwd, method="D", directed=True) if fwd.nnz else np.full((s.n, s.n), np.inf)
        B = D.T.copy()                                      # B[i, j] = dist_b(j -> i)
        if max_ig is not None:
            L = shortest_path(_lengths(U, s, lambda u, v: 1.0), method="D", directed=True, unweighted=True)
            B = np.minimum(B, max_ig * L)
    np.fill_diagonal(B, 0.0)
    return B


def max_gap_bound(U, setting="standard", max_ig=None, staleness=None, skipping=False):
    """The largest bound over all ordered pairs (``inf`` if unbounded)."""
    return float(gap_bounds(U, setting, max_ig, staleness, skipping).max())


def ahead_bounds(U):
    """``{i: how far an in-neighbour of i may be ahead of it}`` without token queues: the longest
    ``dist_g(i -> j)`` over i's union in-neighbours j (sizes queue-only update queues). Searches from a block
    of nodes at a time (O(n) memory per block, not the n x n distances)."""
    from scipy.sparse.csgraph import dijkstra

    from hopdec.topology.bounds import BLOCK_ENTRIES
    s = schedule_of(U)
    A = s.gap_matrix()
    senders = A.T.tocsr()                                   # row i: i's union in-neighbours
    out, step = {}, max(1, BLOCK_ENTRIES // max(s.n, 1))
    for start in range(0, s.n, step):
        rows = np.arange(start, min(s.n, start + step))
        D = dijkstra(A, directed=True, indices=rows)        # D[r, j] = dist_g(i -> j)
        for r, i in enumerate(rows.tolist()):
            ins = senders.indices[senders.indptr[i]:senders.indptr[i + 1]]
            out[i] = int(D[r, ins].max(initial=1.0) if len(ins) else 1.0)
    return out


class _TableOne:
    """The Table 1 figures of :func:`summarize`, gathered block by block from the union's hop distances as
    :func:`hopdec.topology.bounds.pair_summary` computes them (its ``visit``): the same numbers as
    :func:`gap_bounds` and all-pairs ``dist_g`` (the activation gaps as edge lengths) give, without their n x n arrays, each computed once.
    Where every union edge has the same activation gap g (a one-peer graph: every edge once a period)
    ``dist_g`` is g times the hop distance; otherwise each block's sources are searched again by Dijkstra
    on the edges' gaps."""

    def __init__(self, schedule, max_ig, staleness):
        self.n, self.ig, self.staleness = schedule.n, float(max_ig), staleness
        self.A = schedule.gap_matrix()
        self.senders = self.A.T.tocsr()                     # row i: i's union in-neighbours
        gaps = np.unique(self.A.data)
        self.g = float(gaps[0]) if len(gaps) == 1 else None
        self.best = dict.fromkeys(["standard", "standard+tokens", "diameter", "staleness", "staleness+tokens",
                                   "update_queue_no_tokens"], 0.0)
        self.seen = False

    @staticmethod
    def _search(rows, lengths):
        """Shortest distances from each of ``rows`` over the edges of ``lengths`` (a CSR of edge lengths)."""
        from scipy.sparse.csgraph import dijkstra
        return dijkstra(lengths, directed=True, indices=np.asarray(list(rows)))

    def visit(self, rows, fwd, back):
        """One block: ``fwd[r, j]`` = len_U(i -> j), ``back[r, j]`` = len_U(j -> i), for the r-th node i."""
        self.seen = True
        b, ig = self.best, self.ig
        if self.g is not None:
            ahead, behind = self.g * fwd, self.g * back         # dist_g(i -> j), dist_g(j -> i)
        else:
            ahead = self._search(rows, self.A)
            behind = self._search(rows, self.senders)
        b["standard"] = max(b["standard"], behind.max())
        b["standard+tokens"] = max(b["standard+tokens"], np.minimum(behind, ig * fwd).max())
        b["diameter"] = max(b["diameter"], fwd.max())
        if self.staleness is not None:
            s = float(self.staleness)
            if self.g is not None:
                stale = (self.g + s) * back
            else:
                T = self.senders.copy()
                T.data = T.data + s
                stale = self._search(rows, T)
            b["staleness"] = max(b["staleness"], stale.max())
            b["staleness+tokens"] = max(b["staleness+tokens"], np.minimum(stale, ig * fwd).max())
        for r, i in enumerate(rows):
            ins = self.senders.indices[self.senders.indptr[i]:self.senders.indptr[i + 1]]
            b["update_queue_no_tokens"] = max(b["update_queue_no_tokens"], 1 + float((ahead[r, ins] + 1).sum()))

    def bounds(self):
        """The figures, in the order :func:`summarize` reports them."""
        b, ig = self.best, self.ig
        out = {"standard": b["standard"], "standard+tokens": b["standard+tokens"],
               "backup": math.inf if self.n > 1 else 0.0, "backup+tokens": ig * b["diameter"],
               "skip+tokens": ig * b["diameter"], "notify-ack": None}
        if self.staleness is not None:
            out["staleness"], out["staleness+tokens"] = b["staleness"], b["staleness+tokens"]
        return out


def summarize(U, max_ig=2, staleness=None):
    """``hopdec topo analyze``'s figures for a schedule, as a JSON-ready dict. The keys ``hopdec topo
    compare`` shows mean what they mean for a static graph: ``spectral_gap`` is the per-step gap of the
    period's product, ``gap_bounds`` Table 1 on the time-varying graph, degrees and edges the union's."""
    from hopdec.topology.analysis import _num
    from hopdec.topology.analysis import summarize as static_summary
    s = schedule_of(U)
    table = _TableOne(s, max_ig, staleness)
    base = static_summary(U, max_ig, staleness, table.visit)        # the union graph's figures (and Table 1's
    mix = mixing(s)                                                 # path lengths, block by block)
    degrees = [s.degrees(m) for m in range(s.period)]
    out = dict(base)
    out.update(
        schedule=s.name or "schedule", period=s.period,
        step_max_in_degree=[int(i.max(initial=0)) for i, _ in degrees],
        step_max_out_degree=[int(o.max(initial=0)) for _, o in degrees],
        messages_per_iteration=round(sum(s.messages(m) for m in range(s.period)) / s.period, 6),
        union_spectral_gap=base["spectral_gap"], union_normalized_laplacian_gap=base["normalized_laplacian_gap"],
        spectral_gap=mix["per_step_gap"], period_spectral_gap=mix["period_gap"], step_spectral_gaps=mix["step_gaps"],
        doubly_stochastic=mix["steps_doubly_stochastic"], column_stochastic=mix["steps_column_stochastic"],
        normalized_laplacian_gap=None, metropolis_spectral_gap=None,
    )
    if s.n <= ALL_PAIRS_MAX_N:          # unbounded pairs are inf, as for a static graph that is not connected
        if not table.seen:                  # (the union's figures did not search: search here)
            from hopdec.topology.bounds import pair_summary
            pair_summary(U, max_ig, staleness, table.visit)
        out["gap_bounds"] = {k: _num(v) for k, v in table.bounds().items()}
        out["update_queue_capacity_no_tokens"] = _num(table.best["update_queue_no_tokens"])
        out["activation_gap_max"] = int(table.A.data.max(initial=1))
    return out


def summarize_any(G, max_ig=2, staleness=None):
    """:func:`summarize` for a schedule, :func:`hopdec.topology.analysis.summarize` for a static graph."""
    if schedule_of(G) is not None:
        return summarize(G, max_ig, staleness)
    from hopdec.topology.analysis import summarize as static_summary
    return static_summary(G, max_ig, staleness)


def _product(period):
    """``W_0 W_1 ... W_{P-1}`` as the report writes it (short periods in full)."""
    return " ".join(f"W_{m}" for m in range(period)) if period <= 3 else f"W_0 W_1 ... W_{period - 1}"


def report_lines(s, max_ig, staleness=None, f=str):
    """The text ``hopdec topo analyze`` prints for a schedule's summary ``s`` (``f``: how a value is shown)."""
    b = s.get("gap_bounds") or {}
    steps = s["step_spectral_gaps"]
    shown = ", ".join(f(g) for g in steps[:8]) + (f", ... ({len(steps)} steps)" if len(steps) > 8 else "")
    lines = [
        f"{s['file']}",
        f"  schedule              {s['schedule']}: period {s['period']} steps (iteration k uses step k mod "
        f"{s['period']})",
        f"  nodes                 {s['nodes']}",
        f"  messages / iteration  {s['messages_per_iteration']:g} (mean over the period; the union has "
        f"{s['edges']} edges)",
        f"  degree per step       in {max(s['step_max_in_degree'])}, out {max(s['step_max_out_degree'])} at most "
        f"(union: in {s['in_degree']['min']}..{s['in_degree']['max']}, out {s['out_degree']['min']}.."
        f"{s['out_degree']['max']}; token queues live on the union)",
        f"  strongly connected    {f(s['strongly_connected'])}   (the union of the steps)",
        f"  doubly-stochastic     {f(s['doubly_stochastic'])}   (every step's W)",
        f"  spectral gap, period  {f(s['period_spectral_gap'])}   (|l1|-|l2| of M = {_product(s['period'])})",
        f"  spectral gap per step {f(s['spectral_gap'])}   (1-|l2(M)|^(1/{s['period']}): compare with a static "
        f"graph's gap)",
        f"  each step's gap       {shown}",
        f"  union's gap           {f(s['union_spectral_gap'])}   (every union edge at every step, eq. (1))",
        f"  union diameter        {f(s['diameter'])}",
    ]
    if b:
        lines += [
            "",
            f"Hop Table 1 on the time-varying graph: max over pairs of the bound on Iter(i)-Iter(j)  "
            f"(max_ig={max_ig}" + (f", s={staleness}" if staleness is not None else "") + "; "
            f"g: an edge's activation gap, at most {s['activation_gap_max']})",
            f"  standard (update queues)       {f(b['standard']):>4}   dist_g(j->i)",
            f"  standard + token queues        {f(b['standard+tokens']):>4}   min(dist_g(j->i), "
            f"{max_ig}*len_U(i->j))",
        ]
        if staleness is not None:
            lines += [f"  bounded staleness s={staleness}          {f(b['staleness']):>4}   dist_(g+s)(j->i)",
                      f"  staleness + token queues       {f(b['staleness+tokens']):>4}   "
                      f"min(dist_(g+s)(j->i), {max_ig}*len_U(i->j))"]
        lines += [
            f"  backup / hybrid + token queues {f(b['backup+tokens']):>4}   {max_ig}*len_U(i->j)",
            f"  with iteration skipping        {f(b['skip+tokens']):>4}   {max_ig}*len_U(i->j) (a jump may "
            f"skip an edge's only step)",
            "  notify-ack                        -   not with a time-varying graph",
            "",
            f"Queues (max_ig={max_ig})",
            f"  largest update queue  {s['update_queue_capacity']}   (1+max_ig)*|N_in(i)| over the union",
            f"  largest token queue   {f(s['token_queue_capacity'])}   max_ig*(len_U Path i->j + 1)",
        ]
    if s.get("skipped"):
        lines += ["", f"skipped: {s['skipped']}"]
    return lines
