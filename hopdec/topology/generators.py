"""Graph generators: each returns a weighted ``nx.DiGraph`` with self-loops and Hop eq. (1) weights.

The graphs of Hop Fig. 11 (ring, ring-based, double-ring) and Fig. 21 (hierarchical), plus
exponential, torus and complete graphs. ``GENERATORS`` maps the names ``hopdec topo generate`` and
``--topology`` accept to builders.

>>> sorted(GENERATORS)[:3]
['complete', 'double-ring', 'exponential']
"""

import math

import networkx as nx



def _need(cond, message):
    if not cond:
        raise ValueError(message)


def _int(n, what="n"):
    _need(not isinstance(n, bool) and int(n) == n, f"{what} must be an integer, got {n!r}")
    return int(n)


def _from_edges(n, edges, name, bidirectional=False):
    """The graph of ``edges`` (mod n, self-loops dropped; ``bidirectional``: each both ways) with a self-loop at
    every node and Hop eq. (1) weights: what :func:`~hopdec.topology.weights.with_default_weights` makes of the
    DiGraph built edge by edge -- each node's successors in the order they came, its predecessors in node
    order, the self-loop last -- in one pass (a 100,000-node exponential graph: 1.7 million add_edge calls, a
    copy and 1.8 million weight assignments before)."""
    seq = []
    for u, v in edges:
        u, v = u % n, v % n
        if u != v:
            seq.append((u, v))
            if bidirectional:
                seq.append((v, u))
    seq = sorted(dict.fromkeys(seq), key=lambda e: e[0])      # (stable: each sender's receivers as they came)
    count = [1] * n                                            # 1/|N_in(j)|, the self-loop counted
    for _, v in seq:
        count[v] += 1
    G = nx.DiGraph(name=name)
    G.graph["weights"] = "eq1"          # how to recompute them after a failure (hopdec.topology.heal)
    G.add_nodes_from(range(n))
    G.add_edges_from((u, v, {"weight": 1.0 / count[v]}) for u, v in seq)
    G.add_edges_from((v, v, {"weight": 1.0 / count[v]}) for v in range(n))
    return G


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
    return place_on_machines(G, sizes)


BYTES_PER_EDGE = 600
"""What an edge (with its weight) costs a networkx DiGraph while it is built, measured (peak ~550 bytes)."""


def check_size(name, n, edges=None):
    """Before a graph is built: ``n`` within :data:`hopdec.limits.MAX_WORKERS` and its edges -- ``edges``,
    else a sparse family's ``n (2 log2 n + 4)`` -- within this host's memory; ConfigError naming the kind
    (``topo generate complete -n 100000`` asked for 6 TB and ended in a MemoryError traceback)."""
    from hopdec.limits import check_alloc, check_workers
    n = _int(n)
    check_workers(n, f"{name}({n})")
    if edges is None:
        edges = n * (2 * math.ceil(math.log2(max(n, 2))) + 4)
    check_alloc((edges + n) * BYTES_PER_EDGE, f"{name}({n}): {edges + n} edges")


def _hier(variant):
    def build(n=None, machines=None):
        sizes = tuple(machines) if machines else default_machine_sizes(n)
        _need(n is None or sum(sizes) == n,
              f"machine sizes {','.join(map(str, sizes))} add up to {sum(sizes)}, not n={n}")
        check_size(f"hierarchical-{variant}", sum(sizes), sum(s * s for s in sizes) + 2 * len(sizes))
        return hierarchical(sizes, variant)
    build.__doc__ = f"hierarchical(sizes, {variant!r}): {HIERARCHICAL_VARIANTS[variant]}"
    return build


def _plain(fn, edges=None, placed=True):
    """``build(n, machines=None)`` of a one-parameter family, its size checked first (``edges(n)``: how many
    it has, when more than a sparse family's); ``machines``: sizes of machines to place consecutive nodes
    on (:func:`place_on_machines`), where the family allows it (``placed``)."""
    def build(n, machines=None):
        _need(not machines or placed, "--machines does not apply to a schedule")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            check_size(fn.__name__.replace("_", "-"), n, edges(n) if edges else None)
        G = fn(n)
        return place_on_machines(G, machines) if machines else G
    build.__doc__ = fn.__doc__
    return build


def place_on_machines(G, sizes):
    """``G`` with consecutive nodes on machines ``m0, m1, ...`` of ``sizes`` (node attribute ``machine``, as
    :func:`hierarchical` sets it): the workers of a machine share its NIC (``hopdec sim``, ``hopdec topo
    analyze``).

    >>> G = place_on_machines(ring(8), (4, 2, 2)); [G.nodes[v]["machine"] for v in (0, 3, 4, 7)]
    ['m0', 'm0', 'm1', 'm2']
    """
    n = G.number_of_nodes()
    _need(sum(sizes) == n, f"machine sizes {','.join(map(str, sizes))} add up to {sum(sizes)}, not n={n}")
    names = [f"m{m}" for m, size in enumerate(sizes) for _ in range(size)]
    for v, name in zip(sorted(G.nodes), names):
        G.nodes[v]["machine"] = name
    return G


GENERATORS = {
    "ring": _plain(ring),
    "ring-based": _plain(ring_based),
    "double-ring": _plain(double_ring),
    "exponential": _plain(exponential),
    "torus": _plain(torus),
    "complete": _plain(complete, edges=lambda n: n * (n - 1)),
    "hierarchical-a": _hier("a"),
    "hierarchical-b": _hier("b"),
}
"""Kind name -> ``build(n, machines=None) -> DiGraph`` (``machines``: sizes of machines, consecutive nodes
on each: :func:`place_on_machines`).

``hierarchical-a`` / ``hierarchical-b`` are :func:`hierarchical` variants ``"a"`` / ``"b"``
(Hop Fig. 21 (b) / (c)); without ``machines`` they use :func:`default_machine_sizes`.
"""


def default_topology(n):
    """The graph used when no topology is given: ring-based (Hop Fig. 11) when it exists, else a ring
    (n >= 3) or the complete graph; ``graph["source"]`` says which.

    >>> default_topology(8).graph["source"], default_topology(5).graph["source"]
    ('ring-based(8) [default]', 'ring(5) [default]')
    """
    if n >= 4 and n % 2 == 0:
        g, name = ring_based(n), f"ring-based({n}) [default]"
    elif n >= 3:
        g, name = ring(n), f"ring({n}) [default]"
    else:
        g, name = complete(n), f"complete({n}) [default]"
    g.graph["source"] = name
    return g


# ---- time-varying topologies (schedules, hopdec.topology.schedule) ----------------------------------

def one_peer_exponential(n):
    """One-peer exponential graph (BlueFog, Decent-DP; Ying et al. 2021): at step m of a period of
    ``tau = ceil(log2 n)`` steps every worker i sends to ``(i + 2^m) mod n`` only. Returns the union graph
    (the exponential graph) carrying the schedule (:func:`hopdec.topology.schedule.schedule_of`); every
    step is a permutation, so its eq. (1) weights (1/2 self, 1/2 the one sender) are doubly stochastic,
    and for n a power of 2 the product over a period averages exactly.

    >>> from hopdec.topology.schedule import schedule_of
    >>> s = schedule_of(one_peer_exponential(8)); s.period, [s.out_at(k, 0) for k in range(4)]
    (3, [(1,), (2,), (4,), (1,)])
    """
    from hopdec.topology.schedule import from_steps
    n = _int(n)
    _need(n >= 2, f"one-peer-exponential needs n >= 2, got {n}")
    tau = max(1, math.ceil(math.log2(n)))
    steps = [[(i, (i + 2 ** m) % n) for i in range(n)] for m in range(tau)]
    return from_steps(n, steps, name=f"one_peer_exponential_{n}")


SCHEDULE_GENERATORS = {
    "one-peer-exponential": _plain(one_peer_exponential, placed=False),
}
"""Kinds whose graph changes every step (a schedule; ``hopdec topo generate`` writes a schedule file)."""
GENERATORS.update(SCHEDULE_GENERATORS)
