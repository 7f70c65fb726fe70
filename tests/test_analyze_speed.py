"""``hopdec topo analyze`` on large graphs: the sparse eigen-solvers agree with dense ones, whatever the shape.

Beyond :data:`hopdec.topology.spectral.DENSE_MAX_N` nodes the spectral gaps come from ARPACK:
shift-invert (a sparse LU factorisation) on narrow graphs (rings, ladders, grids), Lanczos on the others
and shift-invert where Lanczos does not converge. Here graphs just above that size -- the shipped
generators and random ones (regular, small-world, Erdos-Renyi, two expanders joined by an edge or by a
long path) -- get the same three gaps as the dense eigenvalues of the same matrices, and expander-like
graphs are analysed without any factorisation (which fills in to O(n^2) there: a random 4-regular graph
of 10,000 nodes took 30 s per gap, ``experiments/bench_analyze.py``).
"""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from hopdec import topology as T
from hopdec.topology import analysis
from hopdec.topology import spectral as S
from hopdec.topology import weights as Wt
from hopdec.topology.generators import _from_edges

N = 600          # just above DENSE_MAX_N: the sparse solvers run


def _undirected(n, edges, name):
    return _from_edges(n, list(edges), name, bidirectional=True)


def random_regular(n, d, seed):
    return _undirected(n, nx.random_regular_graph(d, n, seed=seed).edges(), f"rr{d}")


def bridged_expanders(n, seed):
    h = n // 2
    a = nx.random_regular_graph(4, h, seed=seed)
    b = nx.random_regular_graph(4, h, seed=seed + 1)
    edges = list(a.edges()) + [(u + h, v + h) for u, v in b.edges()] + [(0, h)]
    return _undirected(n, edges, "bridge")


def expanders_and_a_path(e, length, seed):
    """Two random 4-regular graphs of e nodes joined by a path: no narrow ordering, and a tiny gap."""
    a = nx.random_regular_graph(4, e, seed=seed)
    b = nx.random_regular_graph(4, e, seed=seed + 1)
    path = list(range(2 * e, 2 * e + length))
    edges = (list(a.edges()) + [(u + e, v + e) for u, v in b.edges()] + [(0, path[0]), (path[-1], e)]
             + list(zip(path, path[1:])))
    return _undirected(2 * e + length, edges, "barbell")


GRAPHS = {
    "random 3-regular": lambda: random_regular(N, 3, 1),
    "random 4-regular": lambda: random_regular(N + 40, 4, 2),
    "random 8-regular": lambda: random_regular(N, 8, 3),
    "small world": lambda: _undirected(N, nx.connected_watts_strogatz_graph(N, 4, 0.1, seed=4).edges(), "ws"),
    "erdos-renyi": lambda: _undirected(N, nx.gnp_random_graph(N, 0.02, seed=5).edges(), "er"),
    "two expanders, one bridge": lambda: bridged_expanders(N, 6),
    "two expanders, a long path": lambda: expanders_and_a_path(300, 100, 8),
    "ring": lambda: T.GENERATORS["ring"](N),
    "ring-based": lambda: T.GENERATORS["ring-based"](N),
    "double-ring": lambda: T.GENERATORS["double-ring"](N),
    "torus": lambda: T.GENERATORS["torus"](N),
    "hierarchical-a": lambda: T.GENERATORS["hierarchical-a"](N),
}


@pytest.fixture(autouse=True)
def one_blas_thread():
    """Dense eigen-solves of 600 x 600 take 10x longer with BLAS threads fighting on a loaded machine."""
    with threadpool_limits(1):
        yield


def dense_gaps(G):
    """The three gaps ``summarize`` reports, from every eigenvalue of the dense matrices."""
    W = Wt.mixing_matrix(G)
    moduli = np.sort(np.abs(np.linalg.eigvals(W)))[::-1]
    P = W.copy()
    np.fill_diagonal(P, 0.0)
    P = P / P.sum(axis=0, keepdims=True)
    re = np.sort(np.linalg.eigvals(P).real)[::-1]
    M = Wt.mixing_matrix(Wt.metropolis_weights(G))
    mh = np.sort(np.abs(np.linalg.eigvalsh(M)))[::-1]
    return dict(spectral_gap=moduli[0] - moduli[1], normalized_laplacian_gap=re[0] - re[1],
                metropolis_spectral_gap=mh[0] - mh[1])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_sparse_gaps_equal_the_dense_ones(name):
    G = GRAPHS[name]()
    assert G.number_of_nodes() > S.DENSE_MAX_N and nx.is_strongly_connected(G)
    got = analysis.summarize(G)
    for key, want in dense_gaps(G).items():
        assert got[key] == pytest.approx(want, abs=2e-12), (key, got[key], want)


@pytest.mark.parametrize("name", ["random 4-regular", "small world", "two expanders, one bridge"])
def test_expander_like_graphs_need_no_factorisation(name, monkeypatch):
    def refuse(S_):
        raise AssertionError("shift-invert (a sparse LU) was used")
    monkeypatch.setattr(S, "_shift_invert_top_two", refuse)
    s = analysis.summarize(GRAPHS[name]())
    assert s["spectral_gap"] > 0 and s["normalized_laplacian_gap"] > 0 and s["skipped"] is None


def test_where_lanczos_does_not_converge_shift_invert_does(monkeypatch):
    calls = []
    real = S._shift_invert_top_two

    def counted(M):
        calls.append(M.shape)
        return real(M)
    monkeypatch.setattr(S, "_shift_invert_top_two", counted)
    G = expanders_and_a_path(400, 200, 9)
    W = Wt.sparse_mixing_matrix(G)
    assert not S._narrow(S._symmetric_twin(W))                 # Lanczos is tried first ...
    gap = S.spectral_gap(W)
    assert calls                                                # ... and gives up: the gap is 5e-6
    assert gap == pytest.approx(dense_gaps(G)["spectral_gap"], abs=2e-12)


def test_rings_ladders_and_grids_are_narrow_random_graphs_are_not():
    def narrow(G):
        return S._narrow(S._symmetric_twin(Wt.sparse_mixing_matrix(G)))
    assert all(narrow(T.GENERATORS[k](2000)) for k in ("ring", "ring-based", "double-ring", "torus"))
    assert not any(narrow(GRAPHS[k]()) for k in ("random 3-regular", "small world", "erdos-renyi"))


def test_the_same_figures_on_every_call():
    W = sp.csr_matrix(Wt.mixing_matrix(random_regular(N, 4, 7)))
    assert len({S.spectral_gap(W) for _ in range(3)}) == 1


def _random_digraph(n, out, seed):
    rng = np.random.default_rng(seed)
    G = nx.DiGraph()
    G.add_edges_from((i, (i + 1) % n) for i in range(n))           # a ring: strongly connected
    G.add_edges_from((i, int(j)) for i in range(n) for j in rng.integers(0, n, out) if j != i)
    return Wt.with_default_weights(G)


def test_arnoldi_is_bounded_and_an_unconverged_gap_is_reported(monkeypatch):
    """A directed W (no symmetric twin) goes to plain Arnoldi, whose restarts follow from a work budget
    (a 100,000-node random digraph with 20 edges each did not converge in 5,000 restarts: half an hour).
    Out of budget, the gaps are None and the summary says why; inside it, they equal the dense ones."""
    G = _random_digraph(S.DENSE_MAX_N + 100, 6, seed=3)
    W = Wt.sparse_mixing_matrix(G)
    assert S._symmetric_twin(W) is None
    m = S.eigenvalue_moduli(W.toarray())
    dense = m[0] - m[1]
    assert S.spectral_gap(G) == pytest.approx(dense, abs=1e-9)
    assert 20 <= S._arnoldi_restarts(W) <= 5000
    calls = []
    import scipy.sparse.linalg as sla                 # (spectral imports it inside its functions)
    eigs = sla.eigs

    def counted(*a, **kw):
        calls.append(kw["maxiter"])
        return eigs(*a, **kw)
    monkeypatch.setattr(sla, "eigs", counted)
    monkeypatch.setattr(S, "ARNOLDI_WORK", 1.0)       # the floor: 20 restarts, not enough here
    assert S.spectral_gap(G) is None
    assert calls == [20]
    out = analysis.summarize(G)
    assert out["spectral_gap"] is None and "did not converge" in out["skipped"]


@pytest.mark.parametrize("seed", range(12))
def test_aperiodicity_and_strong_connectivity_on_arrays_agree_with_networkx(seed):
    """The scipy versions of the two load-time checks (seconds at 2 million edges, where networkx took
    20 s each) give networkx's answers on random directed graphs, periodic ones included."""
    from hopdec.topology import graph_io
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    if seed % 3 == 0:                                  # layered cycles: period = number of layers
        layers = int(rng.integers(2, 5))
        G = nx.DiGraph((i, j) for i in range(n) for j in range(n)
                       if (j % layers) == (i + 1) % layers and rng.random() < 0.5)
        G.add_edges_from((i, (i + 1) % n) for i in range(n))
    else:
        G = nx.gnp_random_graph(n, float(rng.uniform(0.02, 0.3)), seed=seed, directed=True)
    if seed % 2:
        G.add_edges_from((v, v) for v in list(G.nodes)[:1])
    nx.set_edge_attributes(G, 1.0, "weight")
    G.add_nodes_from(range(n))
    strong = nx.is_strongly_connected(G)
    assert (graph_io._strong_components(graph_io._positive_matrix(G)) == 1) == strong
    if strong:
        assert graph_io.is_aperiodic(G) == nx.is_aperiodic(G)


@pytest.mark.parametrize("directed", [True, False])
def test_node_link_files_are_read_as_networkx_reads_them(directed):
    """The node-link reader builds the DiGraph straight from the entries (half the time at 2 million
    edges): the same nodes, edges and attributes as ``nx.node_link_graph`` and a DiGraph of it, an
    undirected file giving both directions."""
    from hopdec.topology import graph_io
    G = nx.gnp_random_graph(30, 0.2, seed=4, directed=directed)
    rng = np.random.default_rng(4)
    for u, v, d in G.edges(data=True):
        d["weight"] = float(rng.uniform(0.1, 1.0))
        d["bandwidth"] = "1Gbit"
    for v, d in G.nodes(data=True):
        d["machine"] = int(v) % 3
    data = nx.node_link_data(G, edges="edges")
    ours, _ = graph_io._parse_node_link(data, "f")
    theirs = nx.DiGraph(nx.node_link_graph(data, edges="edges"))
    assert dict(ours.nodes(data=True)) == dict(theirs.nodes(data=True))
    assert sorted(ours.edges(data=True)) == sorted(theirs.edges(data=True))


def test_a_gap_does_not_depend_on_what_was_solved_before():
    """ARPACK draws its start vector from a seed that every solve in the process advances; a directed
    graph's gap came out 0.5116 or 0.5092 by call history. The start vector is now fixed."""
    import scipy.sparse.linalg as sla
    G = _random_digraph(S.DENSE_MAX_N + 100, 6, seed=3)
    first = S.spectral_gap(G)
    for seed in range(5):                             # other solves, as another command or test would make
        M = sp.random(300, 300, density=0.05, random_state=seed, format="csr") + sp.eye(300)
        sla.eigs(M, k=2, return_eigenvectors=False)
        assert S.spectral_gap(G) == first


def _one_peer_step(n, shift):
    """W = (I + P)/2, P the shift i -> i + shift (mod n): a one-peer step, gcd(n, shift) separate cycles."""
    P = sp.csr_matrix((np.ones(n), (np.arange(n), (np.arange(n) + shift) % n)), shape=(n, n))
    return sp.csr_matrix((sp.eye(n) + P) / 2)


@pytest.mark.parametrize("n,shift", [(600, 1), (640, 1), (1000, 3), (20_000, 1)])
def test_a_one_peer_step_of_one_cycle_has_its_closed_form_gap(n, shift, monkeypatch):
    """The step's moduli are |cos(pi k / n)|: the gap is 1 - cos(pi/n) (5e-10 at 100,000 workers), where
    Arnoldi on the non-symmetric W ran out of its budget (a minute per step at 10,000) for no answer. W is
    normal, so its moduli are the singular values, found by the symmetric solvers on W^T W."""
    import scipy.sparse.linalg as sla                 # (spectral imports it inside its functions)

    def refuse(*a, **kw):
        raise AssertionError("Arnoldi was used")
    monkeypatch.setattr(sla, "eigs", refuse)
    W = _one_peer_step(n, shift)
    assert S._symmetric_twin(W) is None
    want = 1 - np.cos(np.pi / n)
    assert S.spectral_gap(W) == pytest.approx(want, rel=1e-6, abs=1e-14)
    if n <= 1000:
        m = S.eigenvalue_moduli(W.toarray())
        assert S.spectral_gap(W) == pytest.approx(m[0] - m[1], abs=2e-12)


@pytest.mark.parametrize("n,shift", [(600, 2), (1000, 8), (100_000, 32)])
def test_a_step_of_several_cycles_has_gap_zero(n, shift):
    """gcd(n, shift) > 1 cycles that never hear from each other: eigenvalue 1 once per cycle, gap exactly 0
    (dense eigenvalues agree to rounding), read off the pattern without an eigen-solve."""
    W = _one_peer_step(n, shift)
    assert S._second_of_modulus_one(W)
    assert S.spectral_gap(W) == 0.0
    if n <= 1000:
        m = S.eigenvalue_moduli(W.toarray())
        assert m[0] - m[1] < 1e-12


def test_a_second_modulus_of_one_is_read_off_the_pattern():
    n = S.DENSE_MAX_N + 100

    def cycle(nodes, self_weight):
        k = len(nodes)
        rows = list(nodes) + ([] if not self_weight else list(nodes))
        cols = [nodes[(i + 1) % k] for i in range(k)] + ([] if not self_weight else list(nodes))
        vals = [1.0 - self_weight] * k + ([] if not self_weight else [self_weight] * k)
        return rows, cols, vals

    def matrix(*parts):
        r, c, v = (sum((p[i] for p in parts), []) for i in range(3))
        return sp.csr_matrix((v, (r, c)), shape=(n, n))
    nodes = list(range(n))
    assert S._second_of_modulus_one(matrix(cycle(nodes, 0.0)))          # one cycle, no self weights: periodic
    assert not S._second_of_modulus_one(matrix(cycle(nodes, 0.5)))      # ... with them: aperiodic
    # two closed cycles joined by nothing: two averages; a transient tail feeding one of them changes nothing
    half = n // 2
    assert S._second_of_modulus_one(matrix(cycle(nodes[:half], 0.5), cycle(nodes[half:], 0.5)))
    listener = ([0, n - 2], [n - 1, n - 1], [0.5, 0.5])       # node n-1 listens to both cycles: transient
    assert S._second_of_modulus_one(matrix(cycle(nodes[:half], 0.5), cycle(nodes[half:-1], 0.5), listener))
    joined = ([0, half], [half, 0], [0.1, 0.1])               # the cycles listen to each other: one class
    parts = [cycle(nodes[:half], 0.5), cycle(nodes[half:], 0.5)]
    W = matrix(*parts, joined)
    W = sp.csr_matrix(W / np.asarray(W.sum(axis=0)).ravel())   # (columns summing to 1 again)
    assert not S._second_of_modulus_one(W)
    W = Wt.sparse_mixing_matrix(_random_digraph(n, 4, seed=1))
    assert not S._second_of_modulus_one(W)


def test_a_circulant_graph_takes_the_symmetric_solvers_and_agrees_with_the_dense_moduli():
    """Any circulant W is normal (the directed exponential graph, a one-peer schedule's union)."""
    G = T.GENERATORS["exponential"](700)
    W = Wt.sparse_mixing_matrix(G)
    assert S._symmetric_twin(W) is None and S._normal_top_two(W) is not None
    m = S.eigenvalue_moduli(W.toarray())
    assert S.spectral_gap(W) == pytest.approx(m[0] - m[1], abs=2e-12)
    assert S._normal_top_two(Wt.sparse_mixing_matrix(_random_digraph(700, 4, seed=2))) is None   # not normal
