"""Spectral measures of a mixing matrix: how fast averaging spreads information (Hop footnote 2, Fig. 21).

Up to :data:`DENSE_MAX_N` nodes every eigenvalue is computed (dense). Beyond, only the two that
matter, with sparse ARPACK solvers: when W is similar to a symmetric matrix (symmetric W, and Hop
eq. (1) weights on a symmetric graph) by shift-invert around 1, which converges even when the gap is
tiny (a ring of 100,000), on graphs narrow enough for its factorisation to stay sparse, and by Lanczos
iteration on the others (:func:`_top_two`). A column-stochastic W without such a twin first has its
pattern read (two closed classes or a periodic one: a second modulus of 1, gap 0,
:func:`_second_of_modulus_one`); a normal one (any circulant graph, a one-peer step) has its moduli as
singular values, from the symmetric solvers on W^T W (:func:`_normal_top_two`); otherwise plain Arnoldi
iteration, which may not converge (then None).

>>> from hopdec.topology.generators import ring
>>> round(spectral_gap(ring(8)), 4)
0.1953
"""

import networkx as nx
import numpy as np

from hopdec.topology.weights import _matrix, is_column_stochastic, sparse_mixing_matrix

DENSE_MAX_N = 500
"""Largest n whose eigenvalues are all computed with a dense solver (about 0.2 s at 500)."""

LANCZOS_RESTARTS = 100
"""Restarts of plain Lanczos before shift-invert takes over (about 0.25 s at 10,000 nodes when it fails)."""

ARNOLDI_WORK = 4e10
"""Work allowed to one plain Arnoldi solve (W not similar to a symmetric matrix), in matrix entries
touched: each restart multiplies by W about ncv - k = 18 times (nnz each) and orthogonalises against ncv
vectors (ncv * n each). The restarts follow from it (:func:`_arnoldi_restarts`): one to three minutes on a
2-core machine at worst, whatever the size. Random directed graphs of 10,000 nodes (4-20 edges each:
at most 230 restarts, 2 s), 30,000 (at most 880) and 100,000 with 5 edges each (680 of the 850 allowed)
converge inside it; a random directed graph of 100,000 nodes with 20
edges each has many eigenvalues of nearly the second-largest modulus, where Arnoldi does not converge
in 5,000 restarts (half an hour): bounded, its gap is reported as not computed."""

NARROW = 16
"""A graph whose reverse Cuthill-McKee bandwidth b has b^2 <= NARROW * n goes straight to shift-invert."""

_SHIFT = 1 + 1e-10
"""Shift-invert target just above the top eigenvalue 1 (``W - I`` itself is singular): eigenvalue
1 - g maps to -1/(g + 1e-10), so even gaps of 1e-9 (a ring of 100,000) are well separated."""


def eigenvalue_moduli(G_or_W):
    """Moduli of the eigenvalues of W, largest first (dense: every eigenvalue)."""
    return np.sort(np.abs(np.linalg.eigvals(_matrix(G_or_W))))[::-1]


def spectral_gap(G_or_W):
    """``|lambda_1(W)| - |lambda_2(W)|``, eigenvalues sorted by modulus (Hop footnote 2).

    Bigger means information spreads faster. For a ring of n with self-loops and eq. (1) weights
    the eigenvalues are ``(1 + 2 cos(2 pi k / n)) / 3``:

    >>> round(spectral_gap(ring(5)), 4), round(spectral_gap(complete(6)), 4)
    (0.4607, 1.0)

    None when n > :data:`DENSE_MAX_N`, W is not similar to a symmetric matrix and ARPACK does
    not converge.
    """
    W = _operand(G_or_W)
    if W.shape[0] == 1:
        return float(abs(W[0, 0]))
    if W.shape[0] <= DENSE_MAX_N:
        m = eigenvalue_moduli(W.toarray() if hasattr(W, "toarray") else W)
    else:
        m = _top_moduli(W)
        if m is None:
            return None
    return float(max(m[0] - m[1], 0.0))


def normalized_laplacian_gap(G_or_W):
    """``1 - Re(lambda_2)`` of W with self-loops removed and columns renormalised.

    For an undirected graph this is the algebraic connectivity of the normalized Laplacian. It
    is the quantity that reproduces the spectral gaps Hop quotes for Fig. 21 (0.6667 for the
    ring-based graph of 8, 0.2682 and 0.2688 for :func:`hierarchical` variants ``a`` and ``b``);
    footnote 2's definition (:func:`spectral_gap`) gives different numbers for those graphs.

    >>> round(normalized_laplacian_gap(ring_based(8)), 4), round(spectral_gap(ring_based(8)), 4)
    (0.6667, 0.5)
    """
    import scipy.sparse as sp
    W = sp.csr_matrix(_operand(G_or_W), copy=True)       # the caller's W stays as it is
    n = W.shape[0]
    if n == 1:
        return 1.0
    W.setdiag(0.0)
    W.eliminate_zeros()
    col = np.asarray(W.sum(axis=0)).ravel()
    P = sp.csr_matrix(W @ sp.diags(np.divide(1.0, col, out=np.zeros(n), where=col > 0)))
    if (col <= 0).any():            # a worker that hears from nobody keeps its own value (eigenvalue 1), it
        P = sp.csr_matrix(P + sp.diags((col <= 0).astype(float)))   # does not vanish (a zero column)
    if n <= DENSE_MAX_N:
        re = np.sort(np.linalg.eigvals(P.toarray()).real)[::-1]
    else:
        re = _top_real(P)
        if re is None:
            return None
    return float(re[0] - re[1])


def _operand(G_or_W):
    """A graph becomes its sparse W beyond DENSE_MAX_N nodes (never a dense n x n array there)."""
    if isinstance(G_or_W, nx.Graph):
        if G_or_W.number_of_nodes() > DENSE_MAX_N:
            return sparse_mixing_matrix(G_or_W)
        return _matrix(G_or_W)
    if hasattr(G_or_W, "toarray"):
        return G_or_W
    return np.asarray(G_or_W, float)


def _symmetric_twin(M):
    """``D^-1/2 M D^1/2`` when that is symmetric for D = 1 or D = diag(entries per column), else None.

    W = A D^-1 (Hop eq. (1) on a symmetric pattern A, D the in-degrees with the self-loop) becomes
    D^-1/2 A D^-1/2; a symmetric W (e.g. Metropolis-Hastings) is its own twin. Same eigenvalues.
    """
    import scipy.sparse as sp
    M = sp.csr_matrix(M)
    for d in (np.ones(M.shape[0]), np.diff(M.tocsc().indptr).astype(float)):
        if (d <= 0).any():
            continue
        r = np.sqrt(d)
        S = sp.csr_matrix(sp.diags(1 / r) @ M @ sp.diags(r))
        if abs(S - S.T).max() <= 1e-12 * max(abs(S).max(), 1e-300):
            return S
    return None


def _top_moduli(W):
    """The two largest eigenvalue moduli of sparse W, largest first, or None (no convergence).

    With a symmetric twin S: the two largest eigenvalues by shift-invert near 1; the smallest one
    only when it could matter, since every eigenvalue is >= 2 min(diag W) - 1 (Gershgorin, W
    column-stochastic), so when lambda_2 >= 1 - 2 min(diag W) it is the second-largest modulus.
    """
    import scipy.sparse.linalg as sla
    S = _symmetric_twin(W)
    try:
        if S is None:
            if is_column_stochastic(W):
                if _second_of_modulus_one(W):
                    return np.array([1.0, 1.0])
                top = _normal_top_two(W)
                if top is not None:
                    return top
            vals = sla.eigs(W, k=2, which="LM", v0=_start(W), return_eigenvectors=False,
                            maxiter=_arnoldi_restarts(W))
            return np.sort(np.abs(vals))[::-1]
        top = _top_two(S)
        floor = 1 - 2 * float(W.diagonal().min())
        if top[1] >= floor:
            return np.abs(top)
        low = sla.eigsh(S, k=1, which="SA", v0=_start(S), return_eigenvectors=False, maxiter=5000)[0]
        return np.array([abs(top[0]), max(abs(top[1]), abs(low))])
    except (sla.ArpackNoConvergence, sla.ArpackError, RuntimeError):
        return None


def _second_of_modulus_one(W):
    """Whether column-stochastic sparse W has a second eigenvalue of modulus 1 (gap 0), read off its pattern.

    Averaging with W (``x' = W^T x``) is a Markov chain in which j listens to i where ``W[i, j] > 0``. Its
    eigenvalue 1 comes once per *closed* class -- workers that listen only to each other (a strong component
    that no edge enters), each keeping an average of its own -- and a closed class that is periodic (its cycle
    lengths share a factor d > 1: no self-weights on it) adds the d-th roots of unity. Every other eigenvalue
    has modulus < 1. So two closed classes, or a periodic one, is a gap of exactly 0 -- where Arnoldi, facing a
    repeated eigenvalue, can miss the second copy or not converge at all (a one-peer step i -> i + 2^m splits
    n = 10,000 into 2^m separate cycles: a minute of restarts per step, for no answer)."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import breadth_first_order, connected_components
    A = sp.csr_matrix(W, copy=True)
    A.data = (A.data > 0).astype(np.int8)
    A.eliminate_zeros()
    k, label = connected_components(A, directed=True, connection="strong")
    coo = A.tocoo()
    cross = label[coo.row] != label[coo.col]
    entered = np.zeros(k, bool)
    entered[label[coo.col[cross]]] = True
    closed = np.flatnonzero(~entered)
    if len(closed) != 1:
        return len(closed) > 1
    nodes = np.flatnonzero(label == closed[0])
    C = A[nodes][:, nodes].tocsr()
    order, pred = breadth_first_order(C, 0, directed=True, return_predecessors=True)
    depth = np.zeros(len(nodes), dtype=np.int64)
    for v in order[1:]:                     # breadth-first: a node's predecessor comes before it
        depth[v] = depth[pred[v]] + 1
    c = C.tocoo()
    return int(np.gcd.reduce(np.abs(depth[c.row] + 1 - depth[c.col]))) > 1


def _normal_top_two(W):
    """The two largest eigenvalue moduli of column-stochastic sparse W when W is normal (``W W^T = W^T W``,
    tested on random vectors), else None. A normal W's moduli are its singular values, the square roots of
    the eigenvalues of the symmetric ``W^T W`` (here at most 1, the largest 1: a normal column-stochastic W is
    doubly stochastic), which the symmetric solvers of :func:`_top_two` find where Arnoldi on W would crawl:
    a one-peer step ``(I + P)/2`` (P a cyclic shift of 100,000 nodes, second modulus cos(pi/n), 1 - 5e-10
    away from the first) or any circulant graph (the exponential graph). Called once
    :func:`_second_of_modulus_one` has ruled out a repeated top modulus, so the second is below 1."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla
    W = sp.csr_matrix(W)
    X = np.random.default_rng(0).standard_normal((W.shape[0], 2))
    a, b = W @ (W.T @ X), W.T @ (W @ X)
    if np.abs(a - b).max() > 1e-12 * max(1.0, np.abs(a).max()):
        return None
    pattern = abs(W) + abs(W.T)
    if _narrow(pattern):                    # W^T W is as narrow (twice the band): factorise it
        N = sp.csr_matrix(W.T @ W)
        vals = _shift_invert_top_two((N + N.T) / 2)
    else:
        N = sla.LinearOperator(W.shape, matvec=lambda x: W.T @ (W @ x), dtype=float)
        try:
            vals = sla.eigsh(N, k=2, which="LA", v0=_start(W), maxiter=LANCZOS_RESTARTS,
                             return_eigenvectors=False)
        except sla.ArpackNoConvergence:
            return None
    return np.sqrt(np.clip(np.sort(vals)[::-1], 0.0, None))


def _start(M):
    """ARPACK's start vector: fixed. Without one ARPACK draws it from a seed that advances with every solve
    in the process, so a gap depended on what had been solved before (a directed 2,100-node graph's gap
    came out 0.5116 or 0.5092 by call history: a nearly tied second eigenvalue found or missed)."""
    return np.random.default_rng(0).standard_normal(M.shape[0])


def _arnoldi_restarts(M, k=2, ncv=20):
    """ARPACK restarts for a plain Arnoldi solve of sparse ``M`` within :data:`ARNOLDI_WORK` (at most the
    5,000 it had before, at least 20)."""
    n = M.shape[0]
    ncv = min(n, ncv)
    nnz = M.nnz if hasattr(M, "nnz") else M.size        # (a dense array given beyond DENSE_MAX_N)
    per_restart = max(ncv - k, 1) * (nnz + ncv * n)
    return int(min(5000, max(20, ARNOLDI_WORK // per_restart)))


def _top_real(P):
    """The two largest real parts of P's eigenvalues, largest first, or None (no convergence)."""
    import scipy.sparse.linalg as sla
    S = _symmetric_twin(P)
    try:
        if S is not None:
            vals = _top_two(S)
        else:
            vals = sla.eigs(P, k=2, which="LR", v0=_start(P), return_eigenvectors=False,
                            maxiter=_arnoldi_restarts(P))
        return np.sort(np.real(vals))[::-1]
    except (sla.ArpackNoConvergence, sla.ArpackError, RuntimeError):
        return None


def _top_two(S):
    """The two largest eigenvalues of symmetric sparse S (all <= 1, the largest 1), largest first.

    Shift-invert converges for any gap (a ring of 100,000: 1.3e-9) but factorises S - sigma I: cheap
    when the nodes can be ordered so that every edge joins near ones (rings, ladders, grids: the
    factors stay within that band), O(n^2) fill-in on expander-like graphs (a random 4-regular graph of
    10,000 nodes: 30 s per factorisation, and ``analyze`` needs three). Plain Lanczos needs only
    products S x, O(edges) each, and converges in a few restarts unless the gap is tiny, which such
    graphs do not have. So: shift-invert where the graph is narrow (:func:`_narrow`), else Lanczos for
    at most :data:`LANCZOS_RESTARTS` restarts from a fixed start vector, and shift-invert only where
    that did not converge. Both give the eigenvalues to about 1e-14.
    """
    import scipy.sparse.linalg as sla
    if _narrow(S):
        return np.sort(_shift_invert_top_two(S))[::-1]
    try:
        vals = sla.eigsh(S, k=2, which="LA", v0=_start(S), maxiter=LANCZOS_RESTARTS, return_eigenvectors=False)
    except sla.ArpackNoConvergence:
        vals = _shift_invert_top_two(S)
    return np.sort(vals)[::-1]


def _narrow(S):
    """Whether S's nodes can be ordered (reverse Cuthill-McKee, O(edges)) with every edge joining nodes at
    most b apart, b^2 <= :data:`NARROW` n: a banded factorisation then costs O(n b^2) <= O(NARROW n^2)
    at worst and far less in practice (ring b = 2, ring-based 5, double ring 10, torus 2 sqrt(n); a
    random regular graph of 10,000 nodes has b ~ 4,000)."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    n = S.shape[0]
    order = reverse_cuthill_mckee(S.tocsr(), symmetric_mode=True)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    coo = S.tocoo()
    b = int(np.abs(pos[coo.row] - pos[coo.col]).max(initial=0))
    return b * b <= NARROW * n


def _shift_invert_top_two(S):
    """The two eigenvalues of S nearest just above 1, by shift-invert (a sparse LU of S - sigma I)."""
    import scipy.sparse.linalg as sla
    return sla.eigsh(S, k=2, sigma=_SHIFT, which="LM", v0=_start(S), return_eigenvectors=False)
