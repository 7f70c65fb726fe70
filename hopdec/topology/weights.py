"""Mixing weights W of a communication graph (Hop sec. 3.1 and eq. (1)).

``W[i, j]`` is the weight of edge ``i -> j``: the share of worker i's parameters in worker j's
average (column j holds j's in-weights). Pure functions on ``nx.DiGraph`` / numpy arrays.

The one rule for weights a file gives (:func:`effective_weights`, applied by ``load`` for
``hopdec topo analyze`` and ``hopdec train`` alike): an edge of weight 0 is no edge (no messages, no
part in connectivity), and each worker divides its in-weights by their sum, as its Reduce does, so
W is column-stochastic. Defaults are Hop eq. (1) (:func:`with_default_weights`); Metropolis-Hastings
weights (:func:`metropolis_weights`) are doubly stochastic on symmetric graphs.

>>> from hopdec.topology.generators import ring
>>> is_doubly_stochastic(mixing_matrix(ring(8)))
True
"""

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError

TOL = 1e-9
"""Tolerance for the stochasticity checks."""
NEGLIGIBLE = 1e-200
"""A weight this many times smaller than its column's largest is 0: normalising it would give subnormal
numbers whose reciprocals overflow (a file of subnormal weights made ``topo analyze`` fail in numpy)."""


def with_default_weights(G):
    """Return a copy of ``G`` with a self-loop at every node and Hop eq. (1) weights.

    ``W[i, j] = 1/|N_in(j)|`` with the self-loop counted, so every column of W sums to 1.

    >>> G = with_default_weights(nx.DiGraph([(0, 1), (1, 0)]))
    >>> mixing_matrix(G).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    H = nx.DiGraph(G)
    H.add_edges_from((v, v) for v in list(H.nodes))
    for j in H.nodes:
        preds = list(H.predecessors(j))
        for i in preds:
            H[i][j]["weight"] = 1.0 / len(preds)
    H.graph["weights"] = "eq1"          # how to recompute them after a failure (hopdec.topology.heal)
    return H


def effective_weights(G, source="<graph>", copy=True):
    """``(H, notes)``: the weights training uses, and one line per change for the commands to print.

    Edges of weight 0 other than self-loops are removed (a self-loop of weight 0 stays: the worker
    keeps its own parameters but gives them no weight), and so are weights :data:`NEGLIGIBLE` against
    their column's largest. Every column whose in-weights do not sum to
    1 (beyond :data:`TOL`) is divided by its sum, scaled by its largest weight first so that huge
    weights cannot overflow. ``G`` must already have non-negative finite weights with positive
    column sums (``validate`` checks that). ``copy=False`` changes ``G`` itself.

    >>> H, notes = effective_weights(nx.DiGraph([(0, 1, {"weight": 2.0}), (1, 0, {"weight": 0.0}),
    ...                                          (0, 0, {"weight": 1.0}), (1, 1, {"weight": 2.0})]))
    >>> H.has_edge(1, 0), H[0][1]["weight"], len(notes)
    (False, 0.5, 2)
    """
    H = G.copy() if copy else G
    zero = sorted((u, v) for u, v, w in H.edges(data="weight") if u != v and w == 0)
    H.remove_edges_from(zero)
    notes = []
    if zero:
        u, v = zero[0]
        notes.append(f"{source}: {len(zero)} edge(s) of weight 0 are not edges (e.g. {u}->{v}): "
                     f"no messages go along them and they do not count for connectivity")
    tiny = []
    for j in sorted(H.nodes):
        ins = [(i, float(d["weight"])) for i, _, d in H.in_edges(j, data=True)]
        top = max(w for _, w in ins)
        for i, w in ins:
            if 0 < w < top * NEGLIGIBLE:
                if i == j:
                    H[i][j]["weight"] = 0.0
                else:
                    H.remove_edge(i, j)
                tiny.append((i, j))
    if tiny:
        u, v = tiny[0]
        notes.append(f"{source}: {len(tiny)} weight(s) are more than {1 / NEGLIGIBLE:.0e} times smaller than "
                     f"their worker's largest in-weight (e.g. {u}->{v}): they count as 0 (no edge), as they "
                     f"would underflow in the average")
    off = []
    for j in sorted(H.nodes):
        ins = [(i, float(d["weight"])) for i, _, d in H.in_edges(j, data=True)]
        top = max(w for _, w in ins)
        total = sum(w / top for _, w in ins)
        if abs(total * top - 1.0) > TOL:
            off.append((j, total * top))
            for i, w in ins:
                H[i][j]["weight"] = (w / top) / total
    if off:
        j, total = off[0]
        notes.append(f"{source}: the in-weights of {len(off)} node(s) do not sum to 1 (node {j}: "
                     f"{total:.6g}); each worker divides them by their sum, as training does")
    return H, notes


def metropolis_weights(G):
    """A copy of ``G`` with Metropolis-Hastings weights, doubly stochastic and symmetric.

    ``W[i, j] = 1 / (1 + max(deg i, deg j))`` for each edge ``i -> j`` (degrees without the
    self-loop), and the self-loop takes the rest, ``W[j, j] = 1 - sum_i W[i, j]``. The graph must be
    symmetric (every edge in both directions); ValueError otherwise.

    >>> G = metropolis_weights(nx.DiGraph([(0, 1), (1, 0), (1, 2), (2, 1)]))
    >>> mixing_matrix(G).round(4).tolist()
    [[0.6667, 0.3333, 0.0], [0.3333, 0.3333, 0.3333], [0.0, 0.3333, 0.6667]]
    """
    one_way = next(((u, v) for u, v in G.edges if u != v and not G.has_edge(v, u)), None)
    if one_way is not None:             # (before the copy: a directed graph of 2 million edges cost 12 s here)
        raise ValueError(f"Metropolis-Hastings weights need a symmetric graph (every edge both ways); "
                         f"edge {one_way[0]}->{one_way[1]} has no reverse")
    H = nx.DiGraph(G)
    H.remove_edges_from(list(nx.selfloop_edges(H)))
    deg = dict(H.in_degree())
    for u, v in H.edges:
        H[u][v]["weight"] = 1.0 / (1 + max(deg[u], deg[v]))
    for v in list(H.nodes):
        H.add_edge(v, v, weight=1.0 - sum(H[u][v]["weight"] for u in H.predecessors(v)))
    H.graph["weights"] = "metropolis"
    return H


def weights_rule(G):
    """Which rule ``G``'s weights follow: ``"eq1"`` (Hop eq. (1)), ``"metropolis"`` or ``"file"`` (any other
    weights a file gave) -- what a healed graph's weights are recomputed by (:mod:`hopdec.topology.heal`).

    >>> path = nx.DiGraph([(0, 1), (1, 0), (1, 2), (2, 1)])      # degrees differ: the rules differ
    >>> weights_rule(with_default_weights(path)), weights_rule(metropolis_weights(path))
    ('eq1', 'metropolis')
    """
    def same(H):
        return all(H.has_edge(u, v) and abs(H[u][v]["weight"] - w) <= TOL
                   for u, v, w in G.edges(data="weight")) and H.number_of_edges() == G.number_of_edges()
    plain = nx.DiGraph()
    plain.add_nodes_from(G.nodes)
    plain.add_edges_from((u, v) for u, v in G.edges if u != v)
    if same(with_default_weights(plain)):
        return "eq1"
    try:
        if same(metropolis_weights(plain)):
            return "metropolis"
    except ValueError:
        pass
    return "file"


def sparse_mixing_matrix(G):
    """W as a scipy CSR matrix (what large-graph analysis uses instead of the dense n x n array)."""
    import scipy.sparse as sp
    n = G.number_of_nodes()
    rows, cols, vals = [], [], []
    for u, nbrs in G.adjacency():       # (a list per sender: half the time of a loop over G.edges(data=...))
        rows += [u] * len(nbrs)
        cols += nbrs
        vals += [d.get("weight") for d in nbrs.values()]
    return sp.csr_matrix((np.array(vals, dtype=float), (np.array(rows, dtype=np.int64),
                                                         np.array(cols, dtype=np.int64))), shape=(n, n))


def mixing_matrix(G):
    """The weighted adjacency matrix W, ``W[i, j]`` = weight of edge ``i -> j``.

    Column ``j`` holds ``j``'s in-weights (Hop: worker j averages ``sum_i W[i, j] u_i``).

    >>> mixing_matrix(ring(3)).round(3).tolist()
    [[0.333, 0.333, 0.333], [0.333, 0.333, 0.333], [0.333, 0.333, 0.333]]
    """
    n = G.number_of_nodes()
    W = np.zeros((n, n))
    for u, v, w in G.edges(data="weight"):
        if w is None:
            raise TopologyError(f"{G.graph.get('source', '<graph>')}: edge {u}->{v} has no weight")
        W[int(u), int(v)] = float(w)
    return W


def _matrix(G_or_W):
    return mixing_matrix(G_or_W) if isinstance(G_or_W, nx.Graph) else np.asarray(G_or_W, float)


def _sums(W, axis):
    return np.asarray(W.sum(axis=axis)).ravel()


def is_column_stochastic(W):
    """Non-negative and every column sums to 1 (each worker's average is a proper average)."""
    W = W if _is_sparse(W) else _matrix(W)
    low = W.min() if W.shape[0] else 0.0
    return bool(low >= -TOL and np.allclose(_sums(W, 0), 1.0, rtol=0, atol=TOL))


def is_doubly_stochastic(W):
    """Column- and row-stochastic: what Hop (after D-PSGD) wants for convergence to the mean."""
    W = W if _is_sparse(W) else _matrix(W)
    return is_column_stochastic(W) and bool(np.allclose(_sums(W, 1), 1.0, rtol=0, atol=TOL))


def _is_sparse(W):
    import scipy.sparse as sp
    return sp.issparse(W)
