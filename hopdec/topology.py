"""Communication graphs for decentralized training, after Hop (Luo et al., ASPLOS'19).

A topology is a plain :class:`networkx.DiGraph`: node ``i`` is MPI rank ``i`` (ids are exactly
``0..n-1``), an edge ``i -> j`` means worker ``i`` sends its parameters to worker ``j``, and the
edge attribute ``weight`` is ``W[i, j]``, the share of ``i``'s parameters in ``j``'s average.
Every node has a self-loop (Hop 3.1: the local update is always available). Optional node
attributes: ``machine`` (host name, e.g. ``"m0"``) and ``backup_workers`` (int).

Functions here are small and pure (no MPI, no torch): load/save/validate a graph, build the
mixing matrix, measure it (spectral gap, shortest paths, diameter) and evaluate Hop's Table 1
bounds on the iteration gap and the queue sizes they imply.

>>> G = ring(8)
>>> is_doubly_stochastic(mixing_matrix(G)), diameter(G)
(True, 4)
>>> round(spectral_gap(G), 4)
0.1953
"""

import json
import math

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError

TOL = 1e-9
"""Tolerance for the stochasticity checks."""

_SETTINGS = ("standard", "notify-ack", "staleness", "backup", "hybrid")


# ----------------------------------------------------------------------------------------------
# weights and validation
# ----------------------------------------------------------------------------------------------

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


def validate(G, source="<graph>"):
    """Check ``G`` is a usable topology and return it; else raise ``TopologyError("source: ...")``.

    Checks: node ids exactly ``0..n-1``, every edge weighted with a finite non-negative float,
    every node's in-weights sum to more than zero, and strong connectivity (Hop needs a
    connected graph: every worker must eventually hear from every other one).
    """
    def fail(problem):
        raise TopologyError(f"{source}: {problem}")

    if not G.is_directed() or G.is_multigraph():
        fail(f"expected a networkx DiGraph, got {type(G).__name__}")
    n = G.number_of_nodes()
    if n == 0:
        fail("the graph has no nodes")
    ids = list(G.nodes)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in ids):
        bad = next(v for v in ids if not isinstance(v, (int, np.integer)) or isinstance(v, bool))
        fail(f"node id {bad!r} is not an integer; node ids must be the ranks 0..{n - 1}")
    if sorted(int(v) for v in ids) != list(range(n)):
        missing = sorted(set(range(n)) - {int(v) for v in ids})
        extra = sorted(int(v) for v in ids if not 0 <= int(v) < n)
        fail(f"node ids must be exactly 0..{n - 1} (one per rank); "
             f"missing {missing[:5]}, out of range {extra[:5]}")
    insum = dict.fromkeys(range(n), 0.0)
    for u, v, w in G.edges(data="weight"):
        if w is None:
            fail(f"edge {u}->{v} has no weight (use with_default_weights for Hop eq. (1) weights)")
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            fail(f"edge {u}->{v} has a weight that is not a number: {w!r}")
        if not math.isfinite(w):
            fail(f"edge {u}->{v} has a non-finite weight {w}")
        if w < 0:
            fail(f"edge {u}->{v} has a negative weight {w}")
        insum[int(v)] += float(w)
    for v in range(n):
        if insum[v] <= 0:
            fail(f"node {v} has in-weights summing to zero (it would average nothing)")
    for v, attrs in G.nodes(data=True):
        if "machine" in attrs and not isinstance(attrs["machine"], str):
            fail(f"node {v}: attribute 'machine' must be a host name string, "
                 f"got {attrs['machine']!r}")
        if "backup_workers" in attrs:
            b = attrs["backup_workers"]
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
                fail(f"node {v}: attribute 'backup_workers' must be a non-negative integer, "
                     f"got {b!r}")
    if not nx.is_strongly_connected(G):
        root = min(G.nodes)
        down = nx.descendants(G, root) | {root}
        if len(down) < n:
            a, b = root, min(v for v in G.nodes if v not in down)
        else:
            a, b = min(v for v in G.nodes if root not in nx.descendants(G, v) and v != root), root
        fail(f"the graph is not strongly connected: no directed path from node {a} to node {b} "
             f"(every worker must eventually hear from every other)")
    return G


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------

def load(path):
    """Read a topology file and return a validated, weighted DiGraph.

    Two formats, chosen by content (a ``.json`` file or one starting with ``{`` is JSON):
    networkx node-link JSON as ``nx.node_link_data`` writes it (``"edges"`` or older ``"links"``
    key; undirected graphs become both directions), or an edge list with one ``src dst [weight]``
    per line, ``#`` comments and blank lines. Missing self-loops are added (weight 0 if the file
    gives weights, so the file's W is kept as written); a file without any weights gets Hop eq. (1)
    weights; a file with weights on some edges only is an error.
    """
    src = str(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise TopologyError(f"{src}: no such file") from None
    except IsADirectoryError:
        raise TopologyError(f"{src}: is a directory, not a topology file") from None
    except OSError as err:
        raise TopologyError(f"{src}: cannot read ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"{src}: not a text file (expected node-link JSON or an edge list)") \
            from None
    if src.lower().endswith(".json") or text.lstrip().startswith(("{", "[")):
        G, weighted = _parse_node_link(text, src)
    else:
        G, weighted = _parse_edge_list(text, src)
    if weighted == "some":
        missing = [(u, v) for u, v, w in G.edges(data="weight") if w is None and u != v]
        missing = missing or [(u, v) for u, v, w in G.edges(data="weight") if w is None]
        u, v = missing[0]
        raise TopologyError(f"{src}: some edges have weights and some do not (e.g. {u}->{v} has "
                            f"none); give all weights or none")
    if weighted == "none":
        _check_ids(G, src)
        G = with_default_weights(G)
    else:
        for v in list(G.nodes):
            if not G.has_edge(v, v):
                G.add_edge(v, v, weight=0.0)
    validate(G, src)
    G = nx.relabel_nodes(G, {v: int(v) for v in G.nodes})
    for _, _, d in G.edges(data=True):
        d["weight"] = float(d["weight"])
    G.graph["source"] = src
    return G


def _check_ids(G, src):
    """Run only the node-id part of :func:`validate` (before weights are filled in)."""
    H = nx.DiGraph()
    H.add_nodes_from(G.nodes)
    H.add_edges_from(((v, v) for v in G.nodes), weight=1.0)
    try:
        validate(H, src)
    except TopologyError as err:
        if "strongly connected" not in str(err):
            raise


def _weight_state(G):
    """'all', 'none' or 'some': how many of the graph's edges carry a weight."""
    has = [w is not None for _, _, w in G.edges(data="weight")]
    if not has or not any(has):
        return "none"
    return "all" if all(has) else "some"


def _parse_node_link(text, src):
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TopologyError(f"{src}: not valid JSON ({err.msg} at line {err.lineno} column "
                            f"{err.colno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise TopologyError(f"{src}: not networkx node-link JSON (expected an object with a "
                            f"'nodes' list and an 'edges' or 'links' list)")
    key = "edges" if "edges" in data else "links" if "links" in data else None
    if key is None or not isinstance(data[key], list):
        raise TopologyError(f"{src}: node-link JSON without an 'edges' (or 'links') list")
    ids = []
    for k, node in enumerate(data["nodes"]):
        if not isinstance(node, dict) or "id" not in node:
            raise TopologyError(f"{src}: node entry #{k} has no 'id'")
        ids.append(node["id"])
    idset = {i for i in ids if isinstance(i, (int, str, float))}
    for k, e in enumerate(data[key]):
        if not isinstance(e, dict) or "source" not in e or "target" not in e:
            raise TopologyError(f"{src}: edge entry #{k} needs 'source' and 'target'")
        for end in ("source", "target"):
            if not isinstance(e[end], (int, str, float)) or e[end] not in idset:
                raise TopologyError(f"{src}: edge {e['source']!r}->{e['target']!r} refers to node "
                                    f"{e[end]!r}, which is not one of the {len(ids)} nodes "
                                    f"(ids 0..{len(ids) - 1})")
    try:
        g = nx.node_link_graph(data, edges=key)
    except Exception as err:  # malformed entries: report, never a traceback
        raise TopologyError(f"{src}: cannot read node-link JSON ({type(err).__name__}: {err})") \
            from None
    if g.number_of_nodes() != len(ids):
        raise TopologyError(f"{src}: duplicate node ids")
    G = nx.DiGraph()
    G.add_nodes_from(g.nodes(data=True))
    for u, v, d in g.edges(data=True):  # undirected -> both directions; multi-edges collapse
        G.add_edge(u, v, **d)
        if not g.is_directed():
            G.add_edge(v, u, **d)
    _check_ids(G, src)
    return G, _weight_state(G)


def _parse_edge_list(text, src):
    G = nx.DiGraph()
    nweighted = nedges = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) not in (2, 3):
            raise TopologyError(f"{src}: line {lineno}: expected 'src dst [weight]', got "
                                f"{len(parts)} fields")
        try:
            u, v = int(parts[0]), int(parts[1])
        except ValueError:
            raise TopologyError(f"{src}: line {lineno}: node ids must be integers, got "
                                f"{parts[0]!r} {parts[1]!r}") from None
        if u < 0 or v < 0:
            raise TopologyError(f"{src}: line {lineno}: edge {u}->{v} refers to a negative "
                                f"node id; ids are ranks 0..n-1")
        if G.has_edge(u, v):
            raise TopologyError(f"{src}: line {lineno}: duplicate edge {u}->{v}")
        attrs = {}
        if len(parts) == 3:
            try:
                attrs["weight"] = float(parts[2])
            except ValueError:
                raise TopologyError(f"{src}: line {lineno}: weight {parts[2]!r} is not a number") \
                    from None
            nweighted += 1
        G.add_edge(u, v, **attrs)
        nedges += 1
    if nedges == 0:
        raise TopologyError(f"{src}: no edges found (expected node-link JSON or lines "
                            f"'src dst [weight]')")
    _check_ids(G, src)
    return G, _weight_state(G)


def save(G, path):
    """Write ``G`` as networkx node-link JSON (``edges`` key) with weights and node attributes.

    ``load(path)`` gives the same graph back.
    """
    H = nx.DiGraph()
    H.graph.update({k: v for k, v in G.graph.items() if k != "source"})
    H.add_nodes_from((int(v), dict(d)) for v, d in sorted(G.nodes(data=True)))
    H.add_edges_from(sorted((int(u), int(v), {**d, "weight": float(d["weight"])})
                            if "weight" in d else (int(u), int(v), dict(d))
                            for u, v, d in G.edges(data=True)))
    data = nx.node_link_data(H, edges="edges")
    # one node / edge per line: valid node-link JSON that is also easy to read and diff
    head = {k: v for k, v in data.items() if k not in ("nodes", "edges")}
    parts = ["{" + json.dumps(head)[1:-1] + ","]
    for key in ("nodes", "edges"):
        items = [f"  {json.dumps(x)}" for x in data[key]]
        tail = "," if key == "nodes" else ""
        parts.append(f' "{key}": [\n' + ",\n".join(items) + "\n ]" + tail)
    parts.append("}\n")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))


# ----------------------------------------------------------------------------------------------
# matrices and measures
# ----------------------------------------------------------------------------------------------

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


def in_neighbors(G, i):
    """Sorted ranks that send to ``i`` (``N_in(i)`` without ``i`` itself).

    >>> in_neighbors(ring(5), 0)
    [1, 4]
    """
    return sorted(int(j) for j in G.predecessors(i) if j != i)


def out_neighbors(G, i):
    """Sorted ranks ``i`` sends to (``N_out(i)`` without ``i`` itself).

    >>> out_neighbors(exponential(8), 0)
    [1, 2, 4]
    """
    return sorted(int(j) for j in G.successors(i) if j != i)


def is_column_stochastic(W):
    """Non-negative and every column sums to 1 (each worker's average is a proper average)."""
    W = _matrix(W)
    return bool((W >= -TOL).all() and np.allclose(W.sum(axis=0), 1.0, rtol=0, atol=TOL))


def is_doubly_stochastic(W):
    """Column- and row-stochastic: what Hop (after D-PSGD) wants for convergence to the mean."""
    W = _matrix(W)
    return is_column_stochastic(W) and bool(np.allclose(W.sum(axis=1), 1.0, rtol=0, atol=TOL))


def eigenvalue_moduli(G_or_W):
    """Moduli of the eigenvalues of W, largest first."""
    return np.sort(np.abs(np.linalg.eigvals(_matrix(G_or_W))))[::-1]


def spectral_gap(G_or_W):
    """``|lambda_1(W)| - |lambda_2(W)|``, eigenvalues sorted by modulus (Hop footnote 2).

    Bigger means information spreads faster. For a ring of n with self-loops and eq. (1) weights
    the eigenvalues are ``(1 + 2 cos(2 pi k / n)) / 3``:

    >>> round(spectral_gap(ring(5)), 4), round(spectral_gap(complete(6)), 4)
    (0.4607, 1.0)
    """
    m = eigenvalue_moduli(G_or_W)
    if len(m) == 1:
        return float(m[0])
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
    W = _matrix(G_or_W).copy()
    n = len(W)
    if n == 1:
        return 1.0
    np.fill_diagonal(W, 0.0)
    col = W.sum(axis=0, keepdims=True)
    W = np.divide(W, col, out=np.zeros_like(W), where=col > 0)
    re = np.sort(np.linalg.eigvals(W).real)[::-1]
    return float(re[0] - re[1])


def path_lengths(G):
    """``D[a, b]`` = length of the shortest directed path ``a -> b`` (hops; self-loops ignored).

    ``np.inf`` where ``b`` cannot be reached from ``a``; ``D[a, a] = 0``.

    >>> path_lengths(ring(4))[0].tolist()
    [0.0, 1.0, 2.0, 1.0]
    """
    n = G.number_of_nodes()
    D = np.full((n, n), np.inf)
    for a, dist in nx.all_pairs_shortest_path_length(G):
        for b, d in dist.items():
            D[int(a), int(b)] = d
    return D


def diameter(G):
    """Longest shortest directed path (``math.inf`` if not strongly connected).

    >>> diameter(ring(8)), diameter(ring_based(8)), diameter(complete(4))
    (4, 2, 1)
    """
    m = path_lengths(G).max()
    return int(m) if math.isfinite(m) else math.inf


# ----------------------------------------------------------------------------------------------
# Hop Table 1: iteration-gap bounds and queue sizes
# ----------------------------------------------------------------------------------------------

def gap_bounds(G, setting="standard", max_ig=None, staleness=None):
    """``B[i, j]`` = upper bound on ``Iter(i) - Iter(j)`` per Hop Table 1 (``np.inf``: unbounded).

    With ``L = path_lengths(G)`` (so ``L[j, i]`` = len Path j->i):

    - ``"standard"`` (update queues only, Theorem 1): ``L[j, i]``
    - ``"notify-ack"`` (3.3): ``min(L[j, i], 2 L[i, j])``
    - ``"staleness"`` (bounded staleness s, no tokens): ``(s+1) L[j, i]``
    - ``"backup"`` / ``"hybrid"`` without tokens: ``inf``

    With ``max_ig`` (token queues, Theorem 2) the bound becomes ``min(b0 L[j, i], max_ig L[i, j])``
    with ``b0`` = 1 (standard), ``s+1`` (staleness), ``inf`` (backup, hybrid). Iteration
    skipping takes and gives tokens, so it keeps the token bound. Tokens also tighten
    notify-ack the same way. The diagonal is 0.

    >>> gap_bounds(ring(4))[0].tolist()               # worker 0 ahead of j: len Path j->0
    [0.0, 1.0, 2.0, 1.0]
    >>> gap_bounds(ring(4), "backup", max_ig=3)[0].tolist()
    [0.0, 3.0, 6.0, 3.0]
    """
    if setting not in _SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; expected one of {', '.join(_SETTINGS)}")
    if max_ig is not None and (isinstance(max_ig, bool) or int(max_ig) != max_ig or max_ig < 1):
        raise ValueError(f"max_ig must be a positive integer, got {max_ig!r}")
    if setting == "staleness" and staleness is None:
        raise ValueError("setting 'staleness' needs staleness=s (s >= 0)")
    if staleness is not None and (int(staleness) != staleness or staleness < 0):
        raise ValueError(f"staleness must be a non-negative integer, got {staleness!r}")
    L = path_lengths(G)
    back = L.T  # back[i, j] = len Path j->i
    with np.errstate(invalid="ignore"):
        if setting == "standard":
            B = back.copy()
        elif setting == "notify-ack":
            B = np.minimum(back, 2 * L)
        elif setting == "staleness":
            B = (staleness + 1) * back
        else:  # backup, hybrid
            B = np.full_like(L, np.inf)
        if max_ig is not None:
            B = np.minimum(B, max_ig * L)
    np.fill_diagonal(B, 0.0)
    return B


def max_gap_bound(G, setting="standard", max_ig=None, staleness=None):
    """The largest ``Iter(i) - Iter(j)`` over all ordered pairs (``inf`` if unbounded).

    >>> G = exponential(8)
    >>> max_gap_bound(G), max_gap_bound(G, max_ig=2), max_gap_bound(G, "backup")
    (3.0, 2.0, inf)
    """
    return float(gap_bounds(G, setting, max_ig=max_ig, staleness=staleness).max())


def update_queue_capacity(G, max_ig, count_self=True):
    """``{i: (1 + max_ig) * |N_in(i)|}``: updates ``UpdateQ(i)`` must hold with token queues (4.2).

    Hop counts the self-loop in ``N_in(i)`` (in Fig. 4 a worker enqueues its own update too), and
    so does this by default; ``count_self=False`` gives ``(1 + max_ig) * (|N_in(i)| - 1)``, the
    updates received from other workers, for a runtime that keeps its own update locally.

    >>> update_queue_capacity(ring(4), 2), update_queue_capacity(ring(4), 2, count_self=False)[0]
    ({0: 9, 1: 9, 2: 9, 3: 9}, 6)
    """
    if isinstance(max_ig, bool) or int(max_ig) != max_ig or max_ig < 1:
        raise ValueError(f"max_ig must be a positive integer, got {max_ig!r}")
    extra = 1 if count_self else 0
    return {int(i): (1 + int(max_ig)) * (len(in_neighbors(G, i)) + extra) for i in G.nodes}


def token_queue_capacity(G, max_ig):
    """``C[i, j] = max_ig * (len Path i->j + 1)``: most tokens ``TokenQ(i->j)`` can hold (4.2).

    ``TokenQ(i->j)`` lives at worker ``i`` and holds tokens for its in-neighbour ``j`` (edge
    ``j -> i``); entries without such a queue (no edge ``j -> i``, or ``i == j``) are 0.

    >>> int(token_queue_capacity(ring(6), 2).max())      # len Path 0->1 = 1: 2 * (1 + 1)
    4
    >>> int(token_queue_capacity(exponential(8), 1)[1, 0])  # 0->1 is an edge; Path 1->0 has 3 hops
    4
    """
    if isinstance(max_ig, bool) or int(max_ig) != max_ig or max_ig < 1:
        raise ValueError(f"max_ig must be a positive integer, got {max_ig!r}")
    L = path_lengths(G)
    has_queue = (_pattern(G).T > 0)  # [i, j] true iff edge j -> i
    np.fill_diagonal(has_queue, False)
    return np.where(has_queue, int(max_ig) * (L + 1), 0).astype(int)


def update_queue_capacity_no_tokens(G, count_self=True):
    """``{i: sum_j (len Path i->j + 1)}`` over in-neighbours j: UpdateQ(i) without tokens (4.1).

    In-neighbour ``j`` can be ``len Path i->j`` iterations ahead of ``i``, so ``UpdateQ(i)`` must
    hold that many + 1 iterations of ``j``'s updates; this grows with the graph, tokens cap it.

    >>> update_queue_capacity_no_tokens(ring(8))[0]      # self 1 + two neighbours (1 + 1) each
    5
    """
    L = path_lengths(G)
    out = {}
    for i in G.nodes:
        senders = in_neighbors(G, i) + ([i] if count_self else [])
        out[int(i)] = int(sum(L[i, j] + 1 for j in senders))
    return out


def _pattern(G):
    """0/1 adjacency matrix of ``G`` (``A[i, j] = 1`` iff edge ``i -> j``), ignoring weights."""
    n = G.number_of_nodes()
    A = np.zeros((n, n), dtype=int)
    for u, v in G.edges():
        A[int(u), int(v)] = 1
    return A


# ----------------------------------------------------------------------------------------------
# generators
# ----------------------------------------------------------------------------------------------

def _need(cond, message):
    if not cond:
        raise ValueError(message)


def _int(n, what="n"):
    _need(not isinstance(n, bool) and int(n) == n, f"{what} must be an integer, got {n!r}")
    return int(n)


def _from_edges(n, edges, name, bidirectional=False):
    G = nx.DiGraph(name=name)
    G.add_nodes_from(range(n))
    for u, v in edges:
        u, v = u % n, v % n
        if u != v:
            G.add_edge(u, v)
            if bidirectional:
                G.add_edge(v, u)
    return with_default_weights(G)


def ring(n):
    """Bidirectional ring: ``i <-> i+1`` (Hop Fig. 11 (1)); the sparsest connected symmetric graph.

    >>> G = ring(8); in_neighbors(G, 0), G.number_of_edges()
    ([1, 7], 24)
    """
    n = _int(n)
    _need(n >= 1, f"ring needs n >= 1, got {n}")
    return _from_edges(n, [(i, i + 1) for i in range(n)], f"ring_{n}", bidirectional=True)


def ring_based(n):
    """Ring plus ``i <-> i + n/2``, the most distant node (Hop Fig. 11 (2), after D-PSGD); n even.

    >>> in_neighbors(ring_based(8), 0)
    [1, 4, 7]
    """
    n = _int(n)
    _need(n >= 2 and n % 2 == 0, f"ring-based needs an even n >= 2, got {n}")
    edges = [(i, i + 1) for i in range(n)] + [(i, i + n // 2) for i in range(n)]
    return _from_edges(n, edges, f"ring_based_{n}", bidirectional=True)


def double_ring(n):
    """Two ring-based graphs of n/2 nodes (0..n/2-1 and n/2..n-1) joined ``i <-> i + n/2``.

    Hop Fig. 11 (3); n must be a multiple of 4.

    >>> in_neighbors(double_ring(16), 0)
    [1, 4, 7, 8]
    """
    n = _int(n)
    _need(n >= 4 and n % 4 == 0, f"double-ring needs n a multiple of 4 (two ring-based graphs "
                                 f"of even size), got {n}")
    h = n // 2
    edges = []
    for base in (0, h):
        edges += [(base + i, base + (i + 1) % h) for i in range(h)]
        edges += [(base + i, base + (i + h // 2) % h) for i in range(h)]
    edges += [(i, i + h) for i in range(h)]
    return _from_edges(n, edges, f"double_ring_{n}", bidirectional=True)


def exponential(n):
    """Directed exponential graph: ``i -> i + 2^k (mod n)`` for every ``2^k < n``.

    log2(n) out-neighbours each, diameter ceil(log2 n): a classic sparse fast-mixing graph.

    >>> out_neighbors(exponential(8), 3), in_neighbors(exponential(8), 3)
    ([4, 5, 7], [1, 2, 7])
    """
    n = _int(n)
    _need(n >= 1, f"exponential needs n >= 1, got {n}")
    edges = [(i, i + 2 ** k) for i in range(n) for k in range(max(n - 1, 1).bit_length())
             if 2 ** k < n]
    return _from_edges(n, edges, f"exponential_{n}")


def torus(rows, cols=None):
    """2-D torus of ``rows x cols`` workers, each linked both ways to its 4 grid neighbours.

    ``torus(n)`` picks the most square factorisation (16 -> 4x4). Node ``r*cols + c`` is at (r, c).

    >>> in_neighbors(torus(4, 4), 0)
    [1, 3, 4, 12]
    """
    if cols is None:
        n = _int(rows)
        _need(n >= 4, f"torus needs n >= 4, got {n}")
        rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        cols = n // rows
        _need(rows >= 2, f"torus: n={n} has no factorisation rows x cols with both >= 2 "
                         f"(use torus(rows, cols) or a ring)")
    rows, cols = _int(rows, "rows"), _int(cols, "cols")
    _need(rows >= 2 and cols >= 2, f"torus needs rows, cols >= 2, got {rows}x{cols}")
    n = rows * cols
    edges = []
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            edges += [(i, r * cols + (c + 1) % cols), (i, ((r + 1) % rows) * cols + c)]
    G = _from_edges(n, edges, f"torus_{rows}x{cols}", bidirectional=True)
    return G


def complete(n):
    """Every worker sends to every other one (all-reduce-like; spectral gap 1).

    >>> mixing_matrix(complete(2)).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    n = _int(n)
    _need(n >= 1, f"complete needs n >= 1, got {n}")
    return _from_edges(n, [(i, j) for i in range(n) for j in range(n)], f"complete_{n}")


HIERARCHICAL_VARIANTS = {
    "a": "one gateway per machine (its first node); gateways linked both ways in a ring "
         "of machines (Hop Fig. 21 (b))",
    "b": "the ring of machines enters each machine at its first node and leaves at its last: "
         "last node of machine m <-> first node of machine m+1 (Hop Fig. 21 (c))",
}


def default_machine_sizes(n):
    """Hop Fig. 21's uneven split generalised: half the workers on m0, a quarter on m1 and m2.

    >>> default_machine_sizes(8), default_machine_sizes(10)
    ((4, 2, 2), (6, 2, 2))
    """
    n = _int(n)
    _need(n >= 4, f"hierarchical needs n >= 4 for the default 3-machine split, got {n}")
    return (n - 2 * (n // 4), n // 4, n // 4)


def hierarchical(sizes=(4, 2, 2), variant="a"):
    """Workers on machines of ``sizes``: all-to-all inside a machine, a ring between machines.

    Hop 7.3.6 / Fig. 21 (8 workers unevenly on 3 machines). Machine ``m`` holds consecutive ranks
    and node attribute ``machine="m<m>"``. Variants (see ``HIERARCHICAL_VARIANTS``): ``"a"`` links
    one gateway per machine, ``"b"`` enters at the first node and leaves at the last. With sizes
    (4, 2, 2) they reproduce Hop's quoted gaps 0.2682 (a) and 0.2688 (b) as computed by
    :func:`normalized_laplacian_gap`. W is column- but not doubly-stochastic (uneven degrees).

    >>> G = hierarchical((4, 2, 2), "a"); [G.nodes[i]["machine"] for i in (0, 4, 6)]
    ['m0', 'm1', 'm2']
    >>> H = hierarchical((4, 2, 2), "b")
    >>> round(normalized_laplacian_gap(G), 4), round(normalized_laplacian_gap(H), 4)
    (0.2682, 0.2688)
    """
    sizes = tuple(_int(s, "machine size") for s in sizes)
    _need(len(sizes) >= 1 and all(s >= 1 for s in sizes),
          f"machine sizes must be positive integers, got {sizes}")
    _need(variant in HIERARCHICAL_VARIANTS,
          f"unknown hierarchical variant {variant!r}; expected one of "
          f"{', '.join(HIERARCHICAL_VARIANTS)}")
    groups, start = [], 0
    for s in sizes:
        groups.append(list(range(start, start + s)))
        start += s
    n = start
    edges = [(a, b) for g in groups for a in g for b in g if a != b]
    M = len(groups)
    if M > 1:
        for m in range(M if M > 2 else 1 if variant == "a" else 2):
            cur, nxt = groups[m], groups[(m + 1) % M]
            edges.append((cur[0], nxt[0]) if variant == "a" else (cur[-1], nxt[0]))
    G = _from_edges(n, edges, f"hierarchical_{variant}_{'-'.join(map(str, sizes))}",
                    bidirectional=True)
    for m, g in enumerate(groups):
        for v in g:
            G.nodes[v]["machine"] = f"m{m}"
    return G


def _hier(variant):
    def build(n=None, machines=None):
        sizes = tuple(machines) if machines else default_machine_sizes(n)
        _need(n is None or sum(sizes) == n,
              f"machine sizes {','.join(map(str, sizes))} add up to {sum(sizes)}, not n={n}")
        return hierarchical(sizes, variant)
    build.__doc__ = f"hierarchical(sizes, {variant!r}): {HIERARCHICAL_VARIANTS[variant]}"
    return build


def _plain(fn):
    def build(n, machines=None):
        _need(not machines, f"--machines applies to the hierarchical kinds only")
        return fn(n)
    build.__doc__ = fn.__doc__
    return build


GENERATORS = {
    "ring": _plain(ring),
    "ring-based": _plain(ring_based),
    "double-ring": _plain(double_ring),
    "exponential": _plain(exponential),
    "torus": _plain(torus),
    "complete": _plain(complete),
    "hierarchical-a": _hier("a"),
    "hierarchical-b": _hier("b"),
}
"""Kind name -> ``build(n, machines=None) -> DiGraph`` (``machines``: sizes, hierarchical only).

``hierarchical-a`` / ``hierarchical-b`` are :func:`hierarchical` variants ``"a"`` / ``"b"``
(Hop Fig. 21 (b) / (c)); without ``machines`` they use :func:`default_machine_sizes`.
"""
