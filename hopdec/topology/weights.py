"""Mixing weights W of a communication graph (Hop sec. 3.1 and eq. (1)).

``W[i, j]`` is the weight of edge ``i -> j``: the share of worker i's parameters in worker j's
average (column j holds j's in-weights). Pure functions on ``nx.DiGraph`` / numpy arrays.

>>> from hopdec.topology.generators import ring
>>> is_doubly_stochastic(mixing_matrix(ring(8)))
True
"""

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError

TOL = 1e-9
"""Tolerance for the stochasticity checks."""


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
    return H


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


def is_column_stochastic(W):
    """Non-negative and every column sums to 1 (each worker's average is a proper average)."""
    W = _matrix(W)
    return bool((W >= -TOL).all() and np.allclose(W.sum(axis=0), 1.0, rtol=0, atol=TOL))


def is_doubly_stochastic(W):
    """Column- and row-stochastic: what Hop (after D-PSGD) wants for convergence to the mean."""
    W = _matrix(W)
    return is_column_stochastic(W) and bool(np.allclose(W.sum(axis=1), 1.0, rtol=0, atol=TOL))
