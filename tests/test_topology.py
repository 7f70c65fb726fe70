"""hopdec.topology: generators, weights, spectral gap, Hop Table 1 bounds, load/save/validate."""

import json
import math
import random
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from bad_topologies import BAD_FILES, UNTRAINABLE

from hopdec import topology as T
from hopdec.errors import TopologyError

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# helpers written independently of the library
# ----------------------------------------------------------------------------------------------

def floyd_warshall(n, edges):
    """D[a][b] = shortest directed path a->b (hops), self-loops ignored."""
    D = [[0 if a == b else math.inf for b in range(n)] for a in range(n)]
    for u, v in edges:
        if u != v:
            D[u][v] = 1
    for k in range(n):
        for a in range(n):
            for b in range(n):
                if D[a][k] + D[k][b] < D[a][b]:
                    D[a][b] = D[a][k] + D[k][b]
    return D


def random_strong_digraph(n, p, rng):
    """A random directed graph on 0..n-1 that is strongly connected (retry until it is)."""
    while True:
        G = nx.DiGraph()
        G.add_nodes_from(range(n))
        G.add_edges_from((a, b) for a in range(n) for b in range(n) if a != b and rng.random() < p)
        if nx.is_strongly_connected(G):
            return G


def fixpoint_with_frozen(G, frozen, s=0, max_ig=None):
    """Let every worker but ``frozen`` advance as far as the rules allow; return iterations.

    Rules (Hop 3.3, 4.2, 4.4): worker i may go from k to k+1 when every in-neighbour u has
    Iter(u) >= k - s (its update of iteration k - s is there), and, with token queues, when every
    out-neighbour o still has a token for it: Iter(i) - Iter(o) < max_ig.
    """
    it = dict.fromkeys(G.nodes, 0)
    changed = True
    while changed:
        changed = False
        for i in G.nodes:
            if i == frozen:
                continue
            k = it[i]
            ok = all(it[u] >= k - s for u in G.predecessors(i) if u != i)
            if max_ig is not None:
                ok = ok and all(k - it[o] < max_ig for o in G.successors(i) if o != i)
            if ok:
                it[i] += 1
                changed = True
    return it


# ----------------------------------------------------------------------------------------------
# generators
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,n,degree", [
    ("ring", 8, 2), ("ring", 16, 2), ("ring-based", 8, 3), ("ring-based", 16, 3),
    ("double-ring", 8, 4), ("double-ring", 16, 4), ("exponential", 8, 3),
    ("exponential", 16, 4), ("exponential", 12, 4), ("torus", 16, 4), ("torus", 12, 4),
    ("complete", 4, 3), ("complete", 8, 7),
])
def test_regular_generators(kind, n, degree):
    G = T.GENERATORS[kind](n)
    assert sorted(G.nodes) == list(range(n))
    assert all(G.has_edge(i, i) for i in range(n))
    assert nx.is_strongly_connected(G)
    for i in range(n):
        assert len(T.in_neighbors(G, i)) == degree
        assert len(T.out_neighbors(G, i)) == degree
        assert i not in T.in_neighbors(G, i)
    W = T.mixing_matrix(G)
    # eq. (1): every in-edge of j (self-loop included) weighs 1/(degree+1)
    for u, v, w in G.edges(data="weight"):
        assert w == pytest.approx(1 / (degree + 1))
    assert T.is_column_stochastic(W) and T.is_doubly_stochastic(W)
    assert T.validate(G) is G


def test_generator_structure():
    assert T.in_neighbors(T.ring(8), 0) == [1, 7]
    assert T.in_neighbors(T.ring_based(8), 0) == [1, 4, 7]         # most distant node: 0+4
    assert T.in_neighbors(T.ring_based(16), 3) == [2, 4, 11]
    dr = T.double_ring(16)                                             # two ring-based of 8
    assert T.in_neighbors(dr, 0) == [1, 4, 7, 8] and T.in_neighbors(dr, 9) == [1, 8, 10, 13]
    assert T.out_neighbors(T.exponential(16), 0) == [1, 2, 4, 8]
    assert T.in_neighbors(T.exponential(16), 0) == [8, 12, 14, 15]
    assert not T.exponential(8).has_edge(1, 0)                         # directed
    assert T.in_neighbors(T.torus(4, 4), 5) == [1, 4, 6, 9]
    assert T.torus(16).number_of_nodes() == 16 and T.diameter(T.torus(16)) == 4
    assert T.torus(3, 5).number_of_nodes() == 15
    assert T.complete(5).number_of_edges() == 25
    assert T.diameter(T.ring(9)) == 4 and T.diameter(T.exponential(16)) == 4


@pytest.mark.parametrize("call", [
    lambda: T.ring(0), lambda: T.ring_based(7), lambda: T.double_ring(10),
    lambda: T.torus(7), lambda: T.torus(1, 5), lambda: T.complete(0),
    lambda: T.hierarchical((4, 0, 2)), lambda: T.hierarchical((4, 2, 2), "z"),
    lambda: T.GENERATORS["hierarchical-a"](9, machines=(4, 2, 2)),
    lambda: T.GENERATORS["ring"](8, machines=(4, 2)),               # sizes that do not add up to n
    lambda: T.GENERATORS["one-peer-exponential"](8, machines=(4, 4)),   # a schedule has no machines
])
def test_generator_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("variant", ["a", "b"])
def test_hierarchical_structure(variant):
    G = T.hierarchical((4, 2, 2), variant)
    machines = [G.nodes[i]["machine"] for i in range(8)]
    assert machines == ["m0"] * 4 + ["m1"] * 2 + ["m2"] * 2
    for a in range(8):                       # all-to-all inside a machine
        for b in range(8):
            if machines[a] == machines[b]:
                assert G.has_edge(a, b)
    cross = sorted((u, v) for u, v in G.edges if machines[u] != machines[v])
    if variant == "a":   # one gateway (first node) per machine, gateways in a ring
        assert cross == [(0, 4), (0, 6), (4, 0), (4, 6), (6, 0), (6, 4)]
    else:                # last node of machine m <-> first node of machine m+1
        assert cross == [(0, 7), (3, 4), (4, 3), (5, 6), (6, 5), (7, 0)]
    W = T.mixing_matrix(G)
    assert T.is_column_stochastic(W) and not T.is_doubly_stochastic(W)
    assert T.GENERATORS[f"hierarchical-{variant}"](8).edges == G.edges
    assert T.GENERATORS[f"hierarchical-{variant}"](None, machines=(3, 3, 2)).number_of_nodes() == 8


def test_paper_figure_21_gaps():
    # Hop Fig. 21 quotes 0.6667 (ring-based 8), 0.2682 and 0.2688 (hierarchical graphs). They are
    # reproduced by 1 - lambda_2 of the self-loop-free random-walk matrix; footnote 2's own
    # definition on W with eq. (1) weights gives 0.5 for ring-based 8 (closed form below).
    assert round(T.normalized_laplacian_gap(T.ring_based(8)), 4) == 0.6667
    assert round(T.normalized_laplacian_gap(T.hierarchical((4, 2, 2), "a")), 4) == 0.2682
    assert round(T.normalized_laplacian_gap(T.hierarchical((4, 2, 2), "b")), 4) == 0.2688
    assert T.spectral_gap(T.ring_based(8)) == pytest.approx(0.5)
    # the normalized-Laplacian gap is networkx's algebraic connectivity for undirected graphs
    und = nx.Graph(T.hierarchical((4, 2, 2), "a"))
    und.remove_edges_from(list(nx.selfloop_edges(und)))
    assert T.normalized_laplacian_gap(T.hierarchical((4, 2, 2), "a")) == pytest.approx(
        nx.algebraic_connectivity(und, weight=None, normalized=True, tol=1e-12), abs=1e-6)


# ----------------------------------------------------------------------------------------------
# spectral gap against closed forms
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [3, 4, 5, 8, 11, 16, 31])
def test_ring_spectral_gap_closed_form(n):
    lam = [(1 + 2 * math.cos(2 * math.pi * k / n)) / 3 for k in range(1, n)]
    expected = 1 - max(abs(x) for x in lam)
    assert T.spectral_gap(T.ring(n)) == pytest.approx(expected, abs=1e-10)
    assert T.spectral_gap(T.mixing_matrix(T.ring(n))) == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("n", [4, 6, 8, 16])
def test_ring_based_spectral_gap_closed_form(n):
    lam = [(1 + 2 * math.cos(2 * math.pi * k / n) + (-1) ** k) / 4 for k in range(1, n)]
    assert T.spectral_gap(T.ring_based(n)) == pytest.approx(1 - max(map(abs, lam)), abs=1e-10)


@pytest.mark.parametrize("n", [5, 8, 13])
def test_exponential_spectral_gap_closed_form(n):
    # circulant, not symmetric: complex eigenvalues sum_s w^(ks) / |S| over S = {0} u {2^k}
    offsets = [0] + [2 ** k for k in range(n) if 2 ** k < n]
    lam = [abs(sum(np.exp(2j * np.pi * k * s / n) for s in offsets)) / len(offsets)
           for k in range(1, n)]
    assert T.spectral_gap(T.exponential(n)) == pytest.approx(1 - max(lam), abs=1e-10)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_complete_graph_gap_is_one(n):
    assert T.spectral_gap(T.complete(n)) == pytest.approx(1.0, abs=1e-10)


def test_spectral_gap_orders_by_modulus():
    # eigenvalues 1, -0.9, 0.5: sorting by value would give 0.5, by modulus gives 0.1
    W = np.diag([1.0, -0.9, 0.5])
    assert T.spectral_gap(W) == pytest.approx(0.1)
    assert list(T.eigenvalue_moduli(W)) == pytest.approx([1.0, 0.9, 0.5])


# ----------------------------------------------------------------------------------------------
# matrices
# ----------------------------------------------------------------------------------------------

def test_mixing_matrix_orientation_and_neighbours():
    G = T.with_default_weights(nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 2)]))
    W = T.mixing_matrix(G)
    # node 2 hears from 1, 0 and itself: column 2 = 1/3 each; node 0 from 2 and itself
    assert W[:, 2].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert W[:, 0].tolist() == pytest.approx([0.5, 0, 0.5])
    assert W[0, 1] == pytest.approx(0.5) and W[1, 0] == 0
    assert T.in_neighbors(G, 2) == [0, 1] and T.out_neighbors(G, 2) == [0]
    assert T.out_neighbors(G, 0) == [1, 2] and T.in_neighbors(G, 0) == [2]
    assert T.is_column_stochastic(W) and not T.is_doubly_stochastic(W)


def test_stochastic_checks():
    assert T.is_doubly_stochastic(np.full((3, 3), 1 / 3))
    assert not T.is_column_stochastic(np.array([[0.5, 0.5], [0.5, 0.6]]))
    assert not T.is_column_stochastic(np.array([[1.5, 0.5], [-0.5, 0.5]]))    # negative entry
    assert T.is_column_stochastic(np.array([[1.0, 0.3], [0.0, 0.7]]))
    assert not T.is_doubly_stochastic(np.array([[1.0, 0.3], [0.0, 0.7]]))
    assert T.is_doubly_stochastic(np.eye(2) + 1e-12)
    assert not T.is_doubly_stochastic(np.eye(2) + 1e-6)


# ----------------------------------------------------------------------------------------------
# Table 1 bounds against brute force
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_path_lengths_and_bounds_match_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    G = T.with_default_weights(random_strong_digraph(n, rng.choice([0.2, 0.35, 0.6]), rng))
    L = floyd_warshall(n, list(G.edges))
    assert T.path_lengths(G).tolist() == L
    assert T.diameter(G) == max(max(r) for r in L)
    ig, s = rng.randint(1, 4), rng.randint(0, 3)
    B = {k: T.gap_bounds(G, k) for k in ("standard", "notify-ack", "backup", "hybrid")}
    B["staleness"] = T.gap_bounds(G, "staleness", staleness=s)
    Bt = {k: T.gap_bounds(G, k, max_ig=ig) for k in ("standard", "backup", "hybrid")}
    Bt["staleness"] = T.gap_bounds(G, "staleness", max_ig=ig, staleness=s)
    C = T.token_queue_capacity(G, ig)
    for i in range(n):
        for j in range(n):
            if i == j:
                assert all(b[i, j] == 0 for b in list(B.values()) + list(Bt.values()))
                continue
            back, fwd = L[j][i], L[i][j]     # len Path j->i, len Path i->j
            assert B["standard"][i, j] == back
            assert B["notify-ack"][i, j] == min(back, 2 * fwd)
            assert B["staleness"][i, j] == (s + 1) * back
            assert B["backup"][i, j] == math.inf and B["hybrid"][i, j] == math.inf
            assert Bt["standard"][i, j] == min(back, ig * fwd)
            assert Bt["staleness"][i, j] == min((s + 1) * back, ig * fwd)
            assert Bt["backup"][i, j] == ig * fwd and Bt["hybrid"][i, j] == ig * fwd
            assert C[i, j] == (ig * (fwd + 1) if G.has_edge(j, i) else 0)
    assert T.max_gap_bound(G) == max(max(r) for r in L)
    assert T.max_gap_bound(G, "backup") == math.inf
    assert T.max_gap_bound(G, "backup", max_ig=ig) == ig * max(max(r) for r in L)


@pytest.mark.parametrize("seed", range(8))
def test_bounds_hold_and_are_reached_in_simulation(seed):
    """Freeze one worker and let the others run ahead as far as Hop's rules allow."""
    rng = random.Random(100 + seed)
    n = rng.randint(3, 7)
    G = T.with_default_weights(random_strong_digraph(n, 0.3, rng))
    std = T.gap_bounds(G)
    s = rng.randint(0, 2)
    stale = T.gap_bounds(G, "staleness", staleness=s)
    ig = rng.randint(1, 3)
    tok = T.gap_bounds(G, max_ig=ig)
    for j in range(n):
        it = fixpoint_with_frozen(G, j)
        assert [it[i] for i in range(n)] == std[:, j].tolist()      # Theorem 1 is tight
        it = fixpoint_with_frozen(G, j, s=s)
        assert [it[i] for i in range(n)] == stale[:, j].tolist()    # (s+1)*len is tight
        it = fixpoint_with_frozen(G, j, max_ig=ig)
        assert all(it[i] <= tok[i, j] for i in range(n))              # Theorem 2 holds
        assert all(it[i] <= std[i, j] for i in range(n))


@pytest.mark.parametrize("seed", range(4))
def test_random_schedule_never_exceeds_token_bounds(seed):
    rng = random.Random(200 + seed)
    n = rng.randint(3, 6)
    G = random_strong_digraph(n, 0.35, rng)
    ig = rng.randint(1, 3)
    B = T.gap_bounds(G, max_ig=ig)
    it = [0] * n
    speed = [rng.choice([0.05, 0.3, 1.0]) for _ in range(n)]   # heterogeneous workers
    for _ in range(3000):
        i = rng.randrange(n)
        if rng.random() > speed[i]:
            continue
        k = it[i]
        if all(it[u] >= k for u in G.predecessors(i)) and \
                all(k - it[o] < ig for o in G.successors(i)):
            it[i] += 1
        for a in range(n):
            for b in range(n):
                assert it[a] - it[b] <= B[a, b]
    assert max(it) > 10      # the simulation did run


def test_notify_ack_equals_two_token_bound():
    # notify-ack's per-edge constraint (-2 <= Iter(u) - Iter(v) <= 1) is a token queue of 2
    for G in (T.ring(7), T.exponential(9), T.hierarchical((3, 3, 2), "b")):
        assert (T.gap_bounds(G, "notify-ack") == T.gap_bounds(G, max_ig=2)).all()


def test_gap_bounds_arguments():
    G = T.ring(4)
    with pytest.raises(ValueError):
        T.gap_bounds(G, "staleness")               # needs staleness=
    with pytest.raises(ValueError):
        T.gap_bounds(G, "bogus")
    with pytest.raises(ValueError):
        T.gap_bounds(G, max_ig=0)
    with pytest.raises(ValueError):
        T.update_queue_capacity(G, 0)


def test_queue_capacities():
    G = T.hierarchical((4, 2, 2), "a")
    cap = T.update_queue_capacity(G, 2)
    # node 0: 3 machine mates + gateways 4 and 6 + itself = 6 -> (1+2)*6
    assert cap[0] == 18 and cap[5] == 6 and set(cap) == set(range(8))
    remote = T.update_queue_capacity(G, 2, count_self=False)
    assert remote[0] == 15 and remote[5] == 3
    # directed ring 0->1->2->3->0: in-neighbour i-1 can be len Path i->i-1 = 3 ahead
    D = T.with_default_weights(nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0)]))
    assert T.update_queue_capacity_no_tokens(D) == {i: 1 + 4 for i in range(4)}
    C = T.token_queue_capacity(D, 3)
    assert C[1, 0] == 3 * (3 + 1) and C[0, 1] == 0 and C[0, 0] == 0


# ----------------------------------------------------------------------------------------------
# load / save
# ----------------------------------------------------------------------------------------------

def _user_graph():
    G = nx.DiGraph()
    G.add_node(0, machine="hostA", backup_workers=1)
    G.add_node(1, machine="hostA")
    G.add_node(2, machine="hostB")
    G.add_edges_from([(0, 1), (1, 2), (2, 0), (1, 0)])
    return G


@pytest.mark.parametrize("edges_key", ["edges", "links"])
def test_load_user_node_link_json(tmp_path, edges_key):
    data = nx.node_link_data(_user_graph(), edges=edges_key)
    assert edges_key in data
    path = tmp_path / "user.json"
    path.write_text(json.dumps(data))
    G = T.load(path)
    assert G.graph["source"] == str(path)
    assert all(G.has_edge(i, i) for i in range(3))
    assert G.nodes[0]["machine"] == "hostA" and G.nodes[0]["backup_workers"] == 1
    W = T.mixing_matrix(G)
    # eq. (1): node 0 hears from 1, 2, itself -> 1/3; node 2 from 1 and itself -> 1/2
    assert W[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert W[:, 2].tolist() == pytest.approx([0, 0.5, 0.5])
    assert T.is_column_stochastic(W)


def test_load_undirected_and_weighted_json(tmp_path):
    U = nx.path_graph(3)                       # undirected: both directions
    path = tmp_path / "und.json"
    path.write_text(json.dumps(nx.node_link_data(U)))
    G = T.load(path)
    assert G.has_edge(0, 1) and G.has_edge(1, 0) and not G.has_edge(0, 2)
    D = nx.DiGraph()
    D.add_weighted_edges_from([(0, 1, 1.0), (1, 0, 0.25), (0, 0, 0.75)])
    path = tmp_path / "w.json"
    path.write_text(json.dumps(nx.node_link_data(D)))
    G = T.load(path)
    # column-stochastic weights are kept as written; the missing self-loop at 1 is added with weight 0
    assert T.mixing_matrix(G).tolist() == [[0.75, 1.0], [0.25, 0.0]]
    assert G.has_edge(1, 1) and G.graph["notes"] == []


def test_load_edge_list(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("# a triangle with weights\n\n0 1 1.0   # first\n1 2 0.5\n2 0 0.5\n"
                    "0 0 0.5\n  # indented comment\n2 2 0.5\n")
    G = T.load(path)
    W = T.mixing_matrix(G)
    assert W.tolist() == [[0.5, 1.0, 0.0], [0.0, 0.0, 0.5], [0.5, 0.0, 0.5]]
    assert G.edges[1, 1]["weight"] == 0.0        # added self-loop, file weights kept
    assert T.is_column_stochastic(W)
    path = tmp_path / "plain.edges"
    path.write_text("0 1\n1 0\n1 2\n2 1\n")
    G = T.load(path)
    assert T.mixing_matrix(G)[:, 1].tolist() == pytest.approx([1 / 3] * 3)
    assert G.graph["source"] == str(path)


def test_save_load_round_trip(tmp_path):
    for G in (T.hierarchical((3, 3, 2), "b"), T.exponential(8), T.torus(3, 4)):
        G.nodes[1]["backup_workers"] = 1
        path = tmp_path / "g.json"
        T.save(G, path)
        H = T.load(path)
        assert sorted(H.edges) == sorted(G.edges)
        assert np.array_equal(T.mixing_matrix(H), T.mixing_matrix(G))
        assert dict(H.nodes(data=True)) == dict(G.nodes(data=True))
        data = json.loads(path.read_text())
        assert "edges" in data and data["directed"] is True
        assert nx.is_isomorphic(nx.node_link_graph(data, edges="edges"), G)


def test_shipped_topologies_match_generators():
    expected = {
        "ring_8": T.ring(8), "ring_16": T.ring(16), "ring_based_8": T.ring_based(8),
        "ring_based_16": T.ring_based(16), "double_ring_8": T.double_ring(8),
        "double_ring_16": T.double_ring(16), "hierarchical_a_8": T.hierarchical((4, 2, 2), "a"),
        "hierarchical_b_8": T.hierarchical((4, 2, 2), "b"), "exponential_8": T.exponential(8),
        "exponential_16": T.exponential(16), "torus_16": T.torus(4, 4),
        "complete_4": T.complete(4), "complete_8": T.complete(8),
    }
    readme = (REPO / "topologies" / "README.md").read_text()
    assert {p.stem for p in (REPO / "topologies").glob("*.json")} == set(expected)
    for name, G in expected.items():
        H = T.load(REPO / "topologies" / f"{name}.json")
        assert np.allclose(T.mixing_matrix(H), T.mixing_matrix(G)), name
        assert dict(H.nodes(data=True)) == dict(G.nodes(data=True)), name
        assert f"{name}.json" in readme


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(BAD_FILES) + sorted(UNTRAINABLE))
def test_bad_files_raise_topology_error(tmp_path, name):
    text, problem = BAD_FILES[name] if name in BAD_FILES else UNTRAINABLE[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TopologyError) as err:
        T.load(path)
    msg = str(err.value)
    assert msg.startswith(str(path)) and problem in msg and "\n" not in msg
    assert len(msg) < len(str(path)) + 250          # a hostile id or weight cannot flood the line


@pytest.mark.parametrize("name", sorted(UNTRAINABLE))
def test_untrainable_files_load_for_analysis(tmp_path, name):
    path = tmp_path / name
    path.write_text(UNTRAINABLE[name][0])
    G = T.load(path, connected=False)
    assert not nx.is_strongly_connected(G)
    with pytest.raises(TopologyError, match=UNTRAINABLE[name][1]):
        T.validate(G, str(path))


def test_missing_binary_and_directory(tmp_path):
    with pytest.raises(TopologyError, match="nope.json: no such file"):
        T.load(tmp_path / "nope.json")
    with pytest.raises(TopologyError, match="is a directory"):
        T.load(tmp_path)
    (tmp_path / "bin.dat").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(TopologyError, match="bin.dat: not a text file"):
        T.load(tmp_path / "bin.dat")


def test_validate_in_memory_graphs():
    good = T.ring(4)
    assert T.validate(good, "x") is good
    cases = [
        (nx.relabel_nodes(T.ring(3), {0: 5}), "0..2"),
        (T.with_default_weights(nx.DiGraph([(0, 1)])), "not strongly connected"),
        (nx.DiGraph([(0, 1), (1, 0)]), "has no weight"),
        (nx.Graph(T.ring(3)), "expected a networkx DiGraph"),
    ]
    neg = T.ring(3)
    neg[0][1]["weight"] = -1.0
    cases.append((neg, "negative weight"))
    zero = T.ring(3)
    for u in list(zero.predecessors(2)):
        zero[u][2]["weight"] = 0.0
    cases.append((zero, "node 2 has in-weights summing to zero"))
    bad_attr = T.ring(3)
    bad_attr.nodes[1]["backup_workers"] = -1
    cases.append((bad_attr, "backup_workers"))
    for G, problem in cases:
        with pytest.raises(TopologyError) as err:
            T.validate(G)
        assert str(err.value).startswith("<graph>: ") and problem in str(err.value)
    with pytest.raises(TopologyError, match="^mine: "):
        T.validate(nx.DiGraph(), "mine")


# ----------------------------------------------------------------------------------------------
# one weight rule for analyze and train
# ----------------------------------------------------------------------------------------------

def _load_text(tmp_path, text, name="g.txt", **kw):
    path = tmp_path / name
    path.write_text(text)
    return T.load(path, **kw)


def test_zero_weight_edges_are_not_edges(tmp_path):
    # 1 -> 0 has weight 0: node 0 hears from nobody, so the graph cannot mix (it used to load)
    text = "0 1 1\n1 0 0\n1 2 1\n2 1 1\n0 0 1\n1 1 1\n2 2 1\n"
    G = _load_text(tmp_path, text, connected=False)
    assert not G.has_edge(1, 0) and G.has_edge(0, 0)
    assert T.in_neighbors(G, 0) == [] and T.out_neighbors(G, 1) == [2]
    assert "1 edge(s) of weight 0 are not edges (e.g. 1->0)" in G.graph["notes"][0]
    with pytest.raises(TopologyError, match="node 0 hears from no other worker"):
        _load_text(tmp_path, text)


def test_a_graph_object_gets_the_weights_a_file_of_its_edges_gets(tmp_path):
    """An nx.DiGraph without weights (what HopOptimizer(topology=G) takes) was refused ("edge 0->1 has no
    weight") where a file of the same edges gets Hop eq. (1) weights; some weights only: the file's error."""
    edges = [(0, 1), (1, 2), (2, 0), (0, 2)]
    G = T.from_graph(nx.DiGraph(edges), "G")
    F = _load_text(tmp_path, "".join(f"{u} {v}\n" for u, v in edges))
    assert np.array_equal(T.mixing_matrix(G), T.mixing_matrix(F))
    partial = nx.DiGraph(edges)
    partial.edges[0, 1]["weight"] = 0.5
    with pytest.raises(TopologyError, match=r"^G: some edges have weights and some do not \(e.g. 0->2 has none\)"):
        T.from_graph(partial, "G")
    weighted = T.from_graph(F, "F")            # weighted already: as effective_graph
    assert np.array_equal(T.mixing_matrix(weighted), T.mixing_matrix(F))


def test_given_weights_are_renormalised_with_a_note(tmp_path):
    G = _load_text(tmp_path, "0 1 2\n1 0 2\n0 0 2\n1 1 6\n")
    W = T.mixing_matrix(G)
    assert W.tolist() == [[0.5, 0.25], [0.5, 0.75]] and T.is_column_stochastic(W)
    notes = G.graph["notes"]
    assert len(notes) == 1 and "in-weights of 2 node(s) do not sum to 1 (node 0: 4)" in notes[0]
    assert notes[0].startswith(str(tmp_path / "g.txt"))


def test_huge_weights_renormalise_without_overflow(tmp_path):
    # column 1 would sum to inf; dividing by the column's largest weight first keeps it finite
    G = _load_text(tmp_path, "0 1 1e308\n2 1 1e308\n1 1 1e308\n1 0 1\n1 2 1\n0 0 1\n2 2 1\n")
    assert T.mixing_matrix(G)[:, 1] == pytest.approx([1 / 3] * 3)


def test_train_uses_the_weights_analyze_reports(tmp_path):
    """node_views (what Reduce weighs) holds exactly the columns of the W that analyze analyses."""
    from hopdec.hop.receive import _normalise, Term
    from hopdec.hop.worker import node_views
    G = _load_text(tmp_path, "0 1 3\n1 0 1\n1 2 1\n2 1 0\n2 0 2\n0 2 0.5\n0 0 1\n1 1 1\n")
    W = T.mixing_matrix(G)
    for v in node_views(G):
        column = {i: W[i, v.rank] for i in range(3) if W[i, v.rank] > 0 or i == v.rank}
        assert v.in_weights == pytest.approx(column)
        assert all(w > 0 for i, w in v.in_weights.items() if i != v.rank)   # no zero edges
        terms = [Term(i, 0, None, w) for i, w in v.in_weights.items()]
        assert [t.weight for t in _normalise(terms)] == pytest.approx([column[i] for i in sorted(column)])


def test_byte_order_mark_is_accepted(tmp_path):
    for name, text in (("bom.json", json.dumps(nx.node_link_data(T.ring(3), edges="edges"))),
                       ("bom.txt", "0 1\n1 0\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert T.load(path).number_of_nodes() in (2, 3)


def test_metropolis_weights_are_doubly_stochastic():
    for G in (T.hierarchical((4, 2, 2), "a"), T.hierarchical((3, 3, 2), "b"), T.torus(3, 4)):
        M = T.metropolis_weights(G)
        W = T.mixing_matrix(M)
        assert sorted(M.edges) == sorted(G.edges)
        assert T.is_doubly_stochastic(W) and np.allclose(W, W.T)
        deg = {v: len(T.in_neighbors(G, v)) for v in G}
        for u, v in G.edges:
            if u != v:
                assert W[u, v] == pytest.approx(1 / (1 + max(deg[u], deg[v])))
        assert dict(M.nodes(data=True)) == dict(G.nodes(data=True))
    with pytest.raises(ValueError, match="symmetric"):
        T.metropolis_weights(T.exponential(8))


# ----------------------------------------------------------------------------------------------
# analyze at scale: one pass of breadth-first searches gives what the dense functions give
# ----------------------------------------------------------------------------------------------

def _random_digraph(n, p, rng):
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    G.add_edges_from((a, b) for a in range(n) for b in range(n) if a != b and rng.random() < p)
    return T.with_default_weights(G)


@pytest.mark.parametrize("seed", range(10))
def test_pair_summary_matches_dense_bounds(seed, monkeypatch):
    from hopdec.topology.bounds import pair_summary
    rng = random.Random(300 + seed)
    n = rng.randint(1, 12)
    G = _random_digraph(n, rng.choice([0.15, 0.3, 0.6]), rng)     # strongly connected or not
    if seed % 3 == 0:
        G = T.with_default_weights(nx.DiGraph(nx.Graph(G)))          # symmetric: one BFS sweep
    monkeypatch.setattr("hopdec.topology.bounds.BLOCK_ENTRIES", rng.choice([1, 7, 10 ** 6]))
    ig, s = rng.randint(1, 3), rng.randint(0, 2)
    got = pair_summary(G, ig, staleness=s)
    assert got["diameter"] == T.diameter(G)
    for setting in ("standard", "notify-ack", "backup", "hybrid", "staleness"):
        st = s if setting == "staleness" else None
        assert got["bounds"][setting] == T.max_gap_bound(G, setting, staleness=st), setting
        if setting != "notify-ack":
            assert got["bounds"][setting + "+tokens"] == T.max_gap_bound(G, setting, max_ig=ig,
                                                                         staleness=st), setting
    assert got["update_queue_no_tokens"] == max(T.update_queue_capacity_no_tokens(G).values())
    assert got["token_queue"] == T.token_queue_capacity(G, ig).max() or \
        math.isinf(got["token_queue"])


@pytest.mark.parametrize("make", [lambda: T.ring(16), lambda: T.ring_based(12), lambda: T.torus(4, 5),
                                  lambda: T.hierarchical((4, 2, 2), "a"), lambda: T.exponential(16),
                                  lambda: T.metropolis_weights(T.hierarchical((5, 3, 3), "b")),
                                  lambda: T.metropolis_weights(nx.DiGraph(nx.complete_bipartite_graph(3, 3)))],
                         ids=["ring", "ring-based", "torus", "hier-a", "exponential", "metropolis",
                              "bipartite"])   # bipartite: the second modulus is the smallest eigenvalue
def test_sparse_eigensolvers_agree_with_dense(make, monkeypatch):
    G = make()
    dense = (T.spectral_gap(G), T.normalized_laplacian_gap(G))
    monkeypatch.setattr("hopdec.topology.spectral.DENSE_MAX_N", 4)
    sparse = (T.spectral_gap(G), T.normalized_laplacian_gap(G))
    assert sparse == pytest.approx(dense, abs=1e-9)


def test_sparse_spectral_gap_of_a_large_ring():
    # 2000 nodes: the gap is 1.6e-6, where plain Arnoldi iteration does not converge
    n = 2000
    expected = 1 - (1 + 2 * math.cos(2 * math.pi / n)) / 3
    assert T.spectral_gap(T.ring(n)) == pytest.approx(expected, rel=1e-4)
    assert T.normalized_laplacian_gap(T.ring(n)) == pytest.approx(1 - math.cos(2 * math.pi / n), rel=1e-4)


@pytest.mark.parametrize("n", [5, 600])             # dense, and sparse (beyond DENSE_MAX_N)
def test_a_graph_with_a_worker_nobody_sends_to_has_no_laplacian_gap(n):
    """A ring plus one worker with no in-neighbour but itself (isolated, or a source) printed a normalized
    Laplacian gap of 1.0 -- the best possible -- for a graph where that worker never hears of the others:
    its column of the self-loop-free matrix was zero (eigenvalue 0), not the 1 of a worker keeping its value.
    The isolated worker never mixes (gap 0); a source's value spreads to everyone (gap above 0, below 1)."""
    G = T.ring(n - 1)
    G.add_edge(n - 1, n - 1, weight=1.0)                             # isolated: only its self-loop
    assert T.normalized_laplacian_gap(G) == pytest.approx(0.0, abs=1e-9)
    G.add_edge(n - 1, 0, weight=1.0)                                  # now a source: it sends to 0
    G = nx.DiGraph(G)
    gap = T.normalized_laplacian_gap(G)
    assert gap is None or 0 < gap < 1
