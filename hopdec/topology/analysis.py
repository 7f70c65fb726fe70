"""What ``hopdec topo analyze`` and ``compare`` report about a graph, as one JSON-ready dict.

Degrees, strong connectivity, stochasticity of W, spectral gaps, diameter, and Hop Table 1's bounds on
the iteration gap with the queue capacities they imply (sec. 4.1-4.2).
"""

import math

import networkx as nx

from hopdec.topology import bounds as B
from hopdec.topology import spectral as S
from hopdec.topology import weights as Wt
from hopdec.topology.graph_io import in_neighbors, out_neighbors

DEFAULT_MAX_IG = 2
"""max_ig used for the token-queue rows when ``--max-ig`` is not given."""


def _num(x):
    """JSON-friendly number: ints stay ints, inf becomes the string "inf"."""
    if x is None:
        return None
    x = float(x)
    if math.isinf(x):
        return "inf"
    return int(x) if x == int(x) else x


def summarize(G, max_ig=DEFAULT_MAX_IG, staleness=None):
    """The figures ``analyze`` and ``compare`` report, as a JSON-ready dict."""
    n = G.number_of_nodes()
    W = Wt.mixing_matrix(G)
    indeg = [len(in_neighbors(G, i)) for i in range(n)]
    outdeg = [len(out_neighbors(G, i)) for i in range(n)]
    bounds = {
        "standard": B.max_gap_bound(G, "standard"),
        "standard+tokens": B.max_gap_bound(G, "standard", max_ig=max_ig),
    }
    if staleness is not None:
        bounds["staleness"] = B.max_gap_bound(G, "staleness", staleness=staleness)
        bounds["staleness+tokens"] = B.max_gap_bound(G, "staleness", max_ig=max_ig,
                                                     staleness=staleness)
    bounds["backup"] = B.max_gap_bound(G, "backup")
    bounds["backup+tokens"] = B.max_gap_bound(G, "backup", max_ig=max_ig)
    bounds["hybrid"] = B.max_gap_bound(G, "hybrid")
    bounds["hybrid+tokens"] = B.max_gap_bound(G, "hybrid", max_ig=max_ig)
    bounds["notify-ack"] = B.max_gap_bound(G, "notify-ack")
    machines = {}
    for v in range(n):
        if "machine" in G.nodes[v]:
            machines.setdefault(G.nodes[v]["machine"], []).append(v)
    uq = B.update_queue_capacity(G, max_ig)
    uq_remote = B.update_queue_capacity(G, max_ig, count_self=False)
    return {
        "file": G.graph.get("source"),
        "nodes": n,
        "edges": sum(1 for u, v in G.edges if u != v),
        "edges_note": "directed edges, self-loops not counted",
        "in_degree": {"min": min(indeg), "max": max(indeg)},
        "out_degree": {"min": min(outdeg), "max": max(outdeg)},
        "max_degree": max(max(indeg), max(outdeg)),
        "machines": {k: len(v) for k, v in machines.items()} or None,
        "strongly_connected": bool(nx.is_strongly_connected(G)),
        "column_stochastic": Wt.is_column_stochastic(W),
        "doubly_stochastic": Wt.is_doubly_stochastic(W),
        "spectral_gap": round(S.spectral_gap(W), 12),
        "normalized_laplacian_gap": round(S.normalized_laplacian_gap(W), 12),
        "diameter": _num(B.diameter(G)),
        "max_ig": max_ig,
        "staleness": staleness,
        "gap_bounds": {k: _num(v) for k, v in bounds.items()},
        "update_queue_capacity": max(uq.values()),
        "update_queue_capacity_remote": max(uq_remote.values()),
        "update_queue_capacity_no_tokens": max(B.update_queue_capacity_no_tokens(G).values()),
        # notify-ack (sec. 3.3): one outstanding update per in-neighbour, what hopdec train allocates
        "update_queue_capacity_notify_ack": max(indeg),
        "token_queue_capacity": int(B.token_queue_capacity(G, max_ig).max()),
    }
