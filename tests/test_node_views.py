"""node_views' queue-only ahead bound (Theorem 1: len Path i->j for each in-neighbour j) against
networkx's all-pairs shortest paths, on every shipped topology and on directed graphs where the way
back is long."""

import glob
import os

import networkx as nx
import pytest

from hopdec import topology as T
from hopdec.hop.worker import node_views

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def all_pairs_bound(graph):
    dist = dict(nx.all_pairs_shortest_path_length(graph))
    return [max((dist[i][j] for j in graph.predecessors(i) if j != i), default=1) for i in sorted(graph.nodes)]


def directed(edges):
    return T.with_default_weights(nx.DiGraph(edges))


GRAPHS = [T.load(p) for p in sorted(glob.glob(os.path.join(ROOT, "topologies", "*.json")))] + [
    T.exponential(16), T.ring(9), T.ring_based(12),
    directed([(i, (i + 1) % 6) for i in range(6)]),                       # one-way cycle: 5 hops back
    directed([(0, 1), (1, 2), (2, 0), (0, 2), (2, 3), (3, 0)]),           # mixed path lengths
]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.graph.get("source") or g.graph.get("name") or "g")
def test_ahead_bound_equals_all_pairs_paths(graph):
    assert [v.ahead_bound for v in node_views(graph)] == all_pairs_bound(graph)


def test_one_way_cycle_needs_the_long_way_round():
    assert {v.ahead_bound for v in node_views(directed([(i, (i + 1) % 6) for i in range(6)]))} == {5}
