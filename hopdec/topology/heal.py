"""Healing a communication graph after workers fail: the survivors stay strongly connected.

Each failed worker is removed and bypassed: every in-neighbour of it now sends to every out-neighbour of
it (a path u -> d -> v becomes the edge u -> v), so strong connectivity survives any set of failures
that leaves at least two workers. The mixing weights are then recomputed by the rule the graph came with
(``graph.graph["weights"]``): Hop eq. (1) for generated graphs and files without weights, Metropolis-
Hastings for Metropolis graphs; for weights a file gave, the surviving edges keep theirs, a bypass edge
u -> v gets the weight that flowed through the failed worker, W[u, d] * W[d, v], and every column is
renormalised by the file rule (:func:`hopdec.topology.weights.effective_weights`). Node ids stay the
workers' original ranks (they are no longer 0..n-1). Per-node ``backup_workers`` are lowered to what the
new in-degree allows.

>>> from hopdec.topology.generators import ring
>>> H, notes = heal_graph(ring(5), [2])
>>> sorted((u, v) for u, v in H.edges if u != v)
[(0, 1), (0, 4), (1, 0), (1, 3), (3, 1), (3, 4), (4, 0), (4, 3)]
"""

import networkx as nx

from hopdec.errors import HopdecError
from hopdec.topology.weights import effective_weights, metropolis_weights, with_default_weights


class CannotHeal(HopdecError):
    """Too few workers are left to go on (decentralized training needs at least two)."""


def heal_graph(G, failed):
    """``(H, notes)``: ``G`` without the ``failed`` workers, bypassed and reweighted (see the module)."""
    failed = [int(d) for d in failed]
    H = G.copy()
    for d in failed:
        if d not in H:
            continue
        ins = [u for u in H.predecessors(d) if u != d]
        outs = [v for v in H.successors(d) if v != d]
        for u in ins:
            for v in outs:
                if u != v and not H.has_edge(u, v):
                    H.add_edge(u, v, weight=float(H[u][d]["weight"]) * float(H[d][v]["weight"]))
        H.remove_node(d)
    left = H.number_of_nodes()
    if left < 2:
        raise CannotHeal(f"only {left} worker(s) left after the failure of rank(s) "
                         f"{', '.join(map(str, failed))}: decentralized training needs at least 2")
    rule = G.graph.get("weights", "file")
    if rule == "eq1":
        S = nx.DiGraph()
        S.add_nodes_from(H.nodes(data=True))
        S.add_edges_from((u, v) for u, v in H.edges if u != v)
        H2, notes = with_default_weights(S), []
    elif rule == "metropolis":
        H2, notes = metropolis_weights(H), []
    else:
        H2, notes = effective_weights(H, G.graph.get("source", "<graph>"))
    H2.graph.update(G.graph)
    H2.graph["failed"] = sorted(set(G.graph.get("failed", [])) | set(failed))
    for v in H2.nodes:
        b = H2.nodes[v].get("backup_workers")
        n_in = sum(1 for u in H2.predecessors(v) if u != v)
        if b and b >= n_in:
            H2.nodes[v]["backup_workers"] = max(0, n_in - 1)
            notes.append(f"node {v}: backup_workers lowered from {b} to {n_in - 1} (its in-degree is now {n_in})")
    if not nx.is_strongly_connected(H2):  # pragma: no cover - bypassing keeps every path
        raise CannotHeal("the healed graph is not strongly connected")
    return H2, notes


def relabelled(G):
    """A copy with ids 0..n-1 in the order of the original ids (for the matrix-based measures)."""
    return nx.relabel_nodes(G, {v: i for i, v in enumerate(sorted(G.nodes))})
