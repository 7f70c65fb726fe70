"""What ``hopdec topo analyze`` and ``compare`` report about a graph, as one JSON-ready dict.

Degrees, strong connectivity (with the components when it fails), stochasticity of W, spectral gaps
(also under Metropolis-Hastings weights), diameter, and Hop Table 1's bounds on the iteration gap with
the queue capacities they imply (sec. 4.1-4.2). Each quantity is computed once: all path lengths in
one pass (:func:`~hopdec.topology.bounds.pair_summary`), eigenvalues with sparse solvers on large
graphs. Above :data:`ALL_PAIRS_MAX_N` nodes the all-pairs figures are skipped and ``skipped`` says so.
"""

import math

import numpy as np
import scipy.sparse as sp

from hopdec.topology import bounds as B
from hopdec.topology import spectral as S
from hopdec.topology import weights as Wt

DEFAULT_MAX_IG = 2
"""max_ig used for the token-queue rows when ``--max-ig`` is not given."""

ALL_PAIRS_MAX_N = 20_000
"""Largest graph whose all-pairs figures (diameter, Table 1 bounds, queue sizes) are computed.

They need a breadth-first search from every node, O(n (n + m)): about 10 s at 10,000 nodes here,
hours at 100,000."""

ALL_PAIRS = ("diameter", "gap_bounds", "update_queue_capacity_no_tokens", "token_queue_capacity")


def _num(x):
    """JSON-friendly number: ints stay ints, inf becomes the string "inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isinf(x):
        return "inf"
    return int(x) if x == int(x) else x


def strong_components(G, W=None):
    """Strongly connected components over edges of positive weight, each sorted, by smallest node (``W``:
    :func:`~hopdec.topology.weights.sparse_mixing_matrix` of ``G``, where the caller has it)."""
    from scipy.sparse.csgraph import connected_components
    A = Wt.sparse_mixing_matrix(G) if W is None else W.copy()
    A.data[A.data <= 0] = 0
    A.eliminate_zeros()
    k, label = connected_components(A, directed=True, connection="strong")
    comps = [[] for _ in range(k)]
    for v, c in enumerate(label):
        comps[c].append(v)
    return sorted(comps, key=lambda c: c[0])


def metropolis_gap(G):
    """The spectral gap ``G`` would have with Metropolis-Hastings weights (None: not symmetric)."""
    try:
        M = Wt.metropolis_weights(G)
    except ValueError:
        return None
    gap = S.spectral_gap(M)
    return None if gap is None else round(gap, 12)


def summarize(G, max_ig=DEFAULT_MAX_IG, staleness=None, visit=None):
    """The figures ``analyze`` and ``compare`` report, as a JSON-ready dict (``visit``: handed to
    :func:`~hopdec.topology.bounds.pair_summary`, which shows it the all-pairs path lengths block by block)."""
    n = G.number_of_nodes()
    W = Wt.sparse_mixing_matrix(G)
    pattern = (W - sp.diags(W.diagonal())).tocsr()
    pattern.eliminate_zeros()
    indeg = np.diff(pattern.tocsc().indptr)
    outdeg = np.diff(pattern.tocsr().indptr)
    comps = strong_components(G, W)
    machines = {}
    for v in range(n):
        if "machine" in G.nodes[v]:
            machines.setdefault(G.nodes[v]["machine"], []).append(v)
    uq = B.update_queue_capacity(G, max_ig)
    uq_remote = B.update_queue_capacity(G, max_ig, count_self=False)
    gap, lap = S.spectral_gap(W), S.normalized_laplacian_gap(W)
    out = {
        "file": G.graph.get("source"),
        "nodes": n,
        "edges": int(pattern.nnz),
        "edges_note": "directed, self-loops not counted",
        "in_degree": {"min": int(indeg.min()), "max": int(indeg.max())},
        "out_degree": {"min": int(outdeg.min()), "max": int(outdeg.max())},
        "max_degree": int(max(indeg.max(), outdeg.max())),
        "machines": {k: len(v) for k, v in machines.items()} or None,
        "strongly_connected": len(comps) == 1,
        "components": None if len(comps) == 1 else comps,
        "weight_notes": list(G.graph.get("notes", [])),
        "column_stochastic": Wt.is_column_stochastic(W),
        "doubly_stochastic": Wt.is_doubly_stochastic(W),
        "spectral_gap": None if gap is None else round(gap, 12),
        "normalized_laplacian_gap": None if lap is None else round(lap, 12),
        "metropolis_spectral_gap": metropolis_gap(G),
        "max_ig": max_ig,
        "staleness": staleness,
        "update_queue_capacity": max(uq.values()),
        "update_queue_capacity_remote": max(uq_remote.values()),
        # notify-ack (sec. 3.3): one outstanding update per in-neighbour, what hopdec train allocates
        "update_queue_capacity_notify_ack": int(indeg.max()),
        "skipped": None,
    }
    if n <= ALL_PAIRS_MAX_N:
        p = B.pair_summary(G, max_ig, staleness, visit)
        out.update(diameter=_num(p["diameter"]),
                   gap_bounds={k: _num(v) for k, v in p["bounds"].items()},
                   update_queue_capacity_no_tokens=_num(p["update_queue_no_tokens"]),
                   token_queue_capacity=_num(p["token_queue"]))
    else:
        out.update(dict.fromkeys(ALL_PAIRS))
        out["skipped"] = (f"{', '.join(ALL_PAIRS)}: all-pairs path lengths are computed up to "
                          f"{ALL_PAIRS_MAX_N} nodes")
    unsolved = [k for k in ("spectral_gap", "normalized_laplacian_gap") if out[k] is None]
    if unsolved:
        note = f"{', '.join(unsolved)}: the sparse eigensolver did not converge"
        out["skipped"] = note if out["skipped"] is None else out["skipped"] + "; " + note
    return out
