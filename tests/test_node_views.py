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


def random_directed(n, out, seed):
    """A ring (strongly connected) plus ``out`` random edges per node."""
    import random
    rng = random.Random(seed)
    edges = [(i, (i + 1) % n) for i in range(n)] + [(i, rng.randrange(n)) for i in range(n) for _ in range(out)]
    return directed([(u, v) for u, v in edges if u != v])


@pytest.mark.parametrize("visits", [0, 1, 3])
@pytest.mark.parametrize("graph", GRAPHS + [directed([(10, 30), (30, 20), (20, 10), (10, 20)])]
                         + [random_directed(n, 2, seed) for n, seed in ((40, 1), (300, 2), (1000, 3))],
                         ids=lambda g: g.graph.get("source") or g.graph.get("name") or "g")
def test_searches_handed_to_scipy_find_the_same_bound(graph, visits, monkeypatch):
    """Past a budget of Python search visits the remaining nodes' bounds come from scipy's searches (an
    exponential graph of 10,000 nodes took 106 s in Python): the same values, whatever the budget, node
    names that are not 0..n-1 included."""
    import hopdec.hop.worker as W
    monkeypatch.setattr(W, "BFS_VISITS_PER_NODE", visits)
    monkeypatch.setattr(W, "_circulant", lambda g: False)      # (else rings take one search for all)
    assert [v.ahead_bound for v in node_views(graph)] == all_pairs_bound(graph)


def circulant(n, offsets):
    return directed([(i, (i + k) % n) for i in range(n) for k in offsets])


@pytest.mark.parametrize("seed", range(12))
def test_graphs_alike_at_every_node_take_one_search_and_find_the_same_bound(seed):
    """A circulant graph (the same offsets j - i mod n at every node: rings, ring-based, exponential) has
    one bound for all; near misses -- one edge more, the nodes renamed 1..n -- are searched per node."""
    import random

    import hopdec.hop.worker as W
    rng = random.Random(seed)
    n = rng.randrange(3, 40)
    offsets = {1} | {rng.randrange(1, n) for _ in range(rng.randrange(0, 4))}
    if rng.random() < 0.5:
        offsets = {n - k for k in offsets}                          # the other way round
    g = circulant(n, offsets)
    assert W._circulant(g) and [v.ahead_bound for v in node_views(g)] == all_pairs_bound(g)
    extra = directed(list(g.edges) + [(0, (max(offsets) + 1) % n or 2 % n)])
    renamed = nx.relabel_nodes(g, {i: i + 1 for i in g.nodes})
    for other in (extra, renamed):
        assert [v.ahead_bound for v in node_views(other)] == all_pairs_bound(other)
    assert not W._circulant(renamed)


def test_a_large_exponential_graph_needs_one_search_not_one_per_node(monkeypatch):
    """--protocol queue-only on a 10,000-node exponential graph spent 14 s in one search per node."""
    import hopdec.hop.worker as W

    def refuse(*a):
        raise AssertionError("searched per node")
    monkeypatch.setattr(W, "_farthest_scipy", refuse)
    monkeypatch.setattr(W, "BFS_VISITS_PER_NODE", 0)
    assert {v.ahead_bound for v in node_views(T.exponential(10_000))} == {8}   # (scipy: 8 at nodes 0, 1234, 9999)


def test_the_path_bound_is_computed_only_for_the_protocol_that_sizes_queues_by_it():
    """Only queue-only sizes its update queues by Theorem 1's bound; its all-pairs searches were most of
    the start of a decentralized run on a large graph (14 s on a 10,000-node exponential graph), so a run
    with token queues or notify-ack does not make them, and queue-only's queues still get the bound."""
    from hopdec.cli.sim import parse
    from hopdec.hop.worker import Worker
    from hopdec.modes.decentralized import HopRun
    graph = directed([(i, (i + 1) % 6) for i in range(6)])
    runs = {p: HopRun(parse(["--protocol", p, "-n", "6"]), graph) for p in ("tokens", "notify-ack", "queue-only")}
    assert {v.ahead_bound for v in runs["tokens"].views} == {None} == {v.ahead_bound for v in runs["notify-ack"].views}
    assert {v.ahead_bound for v in runs["queue-only"].views} == {5}
    assert Worker(runs["queue-only"].views[0], runs["queue-only"].cfg).slots == 6
