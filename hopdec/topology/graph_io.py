"""Topology files: read, validate and write communication graphs (node-link JSON or edge lists).

A topology is a plain :class:`networkx.DiGraph`: node ``i`` is MPI rank ``i`` (ids are exactly
``0..n-1``), an edge ``i -> j`` means worker ``i`` sends its parameters to worker ``j``, and the
edge attribute ``weight`` is ``W[i, j]``, the share of ``i``'s parameters in ``j``'s average.
Every node has a self-loop (Hop sec. 3.1: the local update is always available). Optional node
attributes: ``machine`` (host name, e.g. ``"m0"``) and ``backup_workers`` (int).

Files are read defensively: only regular files up to :data:`MAX_FILE_BYTES` (a FIFO or ``/dev/zero``
would block or never end), a UTF-8 byte-order mark is accepted, and JSON nested too deeply or holding
numbers too long for Python is an error like any other.
"""

import json
import math
import os

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError
from hopdec.files import atomic_write
from hopdec.topology.schedule import is_schedule_data, schedule_of
from hopdec.topology.schedule import parse as parse_schedule
from hopdec.topology.schedule import save as save_schedule
from hopdec.topology.weights import effective_weights, weights_rule, with_default_weights

MAX_FILE_BYTES = 128 * 2 ** 20
"""Largest topology file read (128 MiB: node-link JSON of a million edges is about 50 MiB)."""


def _short(x, width=24):
    """``repr(x)`` cut to ``width`` characters, so a hostile id or weight cannot flood the error line."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool) and abs(int(x)) >= 10 ** width:
        return f"<an integer of {int(abs(int(x)).bit_length() * 0.30103) + 1} digits>"
    r = repr(x)
    return r if len(r) <= width else r[:width - 3] + "..."


def validate(G, source="<graph>", connected=True):
    """Check ``G`` is a usable topology and return it; else raise ``TopologyError("source: ...")``.

    Checks: node ids exactly ``0..n-1``, every edge weighted with a finite non-negative float,
    every node's in-weights sum to more than zero, and, with ``connected``, strong connectivity
    over the edges of positive weight (Hop needs it: every worker must eventually hear from every
    other one). ``hopdec topo analyze`` passes ``connected=False`` to report on any graph.
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
        fail(f"node id {_short(bad)} is not an integer; node ids must be the ranks 0..{n - 1}")
    if sorted(int(v) for v in ids) != list(range(n)):
        missing = sorted(set(range(n)) - {int(v) for v in ids})
        extra = sorted(int(v) for v in ids if not 0 <= int(v) < n)
        fail(f"node ids must be exactly 0..{n - 1} (one per rank); "
             f"missing {missing[:5]}, out of range [{', '.join(_short(x) for x in extra[:5])}]")
    insum = dict.fromkeys(range(n), 0.0)
    for u, v, w in G.edges(data="weight"):
        if w is None:
            fail(f"edge {u}->{v} has no weight (use with_default_weights for Hop eq. (1) weights)")
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            fail(f"edge {u}->{v} has a weight that is not a number: {_short(w)}")
        try:
            wf = float(w)
        except OverflowError:
            fail(f"edge {u}->{v} has a weight too large for a float: {_short(w)}")
        if not math.isfinite(wf):
            fail(f"edge {u}->{v} has a non-finite weight {w}")
        if wf < 0:
            fail(f"edge {u}->{v} has a negative weight {w}")
        insum[int(v)] += wf
    for v in range(n):
        if insum[v] <= 0:
            fail(f"node {v} has in-weights summing to zero (it would average nothing)")
    for v, attrs in G.nodes(data=True):
        if "machine" in attrs and not (isinstance(attrs["machine"], str) and attrs["machine"].isprintable()):
            fail(f"node {v}: attribute 'machine' must be a host name string of printable characters, "
                 f"got {_short(attrs['machine'])}")     # (a control character, an escape, a lone surrogate)
        if "backup_workers" in attrs:
            b = attrs["backup_workers"]
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
                fail(f"node {v}: attribute 'backup_workers' must be a non-negative integer, "
                     f"got {_short(b)}")
    if connected:
        check_strongly_connected(G, source)
    return G


def check_strongly_connected(G, source="<graph>", pattern=None):
    """TopologyError unless every node reaches every other over edges of positive weight.

    The message names a node that hears from (or sends to) no other worker, else a missing path.
    ``pattern``: :func:`_positive_matrix` of ``G`` where the caller has it.
    """
    if G.number_of_nodes() <= 1 or _strong_components(
            _positive_matrix(G) if pattern is None else pattern) == 1:
        return G                            # (scipy: seconds where networkx took 20 s at 2 million edges)
    P = _positive(G, loops=False)           # not strongly connected: networkx names where
    for v in sorted(P.nodes):
        if P.in_degree(v) == 0:
            raise TopologyError(f"{source}: the graph is not strongly connected: node {v} hears from no "
                                f"other worker (no in-edge of positive weight), so it would only "
                                f"average itself")
        if P.out_degree(v) == 0:
            raise TopologyError(f"{source}: the graph is not strongly connected: node {v} sends to no "
                                f"other worker (no out-edge of positive weight)")
    root = min(P.nodes)
    down = nx.descendants(P, root) | {root}
    if len(down) < len(P):
        a, b = root, min(v for v in P.nodes if v not in down)
    else:
        a, b = min(v for v in P.nodes if root not in nx.descendants(P, v) and v != root), root
    raise TopologyError(f"{source}: the graph is not strongly connected: no directed path from node "
                        f"{a} to node {b} (every worker must eventually hear from every other)")


def is_aperiodic(G, pattern=None):
    """Whether the matrix W of a strongly connected ``G`` (edges of positive weight, self-loops included)
    is aperiodic: the gcd of its cycle lengths is 1, so W^t converges to the consensus (Perron-Frobenius);
    a periodic W keeps permuting the models instead. One breadth-first search from a node gives each node
    its depth; the period is the gcd over the edges u->v of depth(u) + 1 - depth(v) (as networkx's
    ``is_aperiodic``, on arrays: seconds at 2 million edges). ``pattern``: as for
    :func:`check_strongly_connected`."""
    if G.number_of_nodes() <= 1:
        return True
    from scipy.sparse.csgraph import breadth_first_order
    A = _positive_matrix(G) if pattern is None else pattern
    order, pred = breadth_first_order(A, 0, directed=True, return_predecessors=True)
    if len(order) < A.shape[0]:             # not strongly connected: no single period to speak of
        return nx.is_aperiodic(_positive(G, loops=True))
    depth = np.zeros(A.shape[0], dtype=np.int64)
    for v in order[1:]:                     # breadth-first: a node's predecessor comes before it
        depth[v] = depth[pred[v]] + 1
    coo = A.tocoo()
    return int(np.gcd.reduce(np.abs(depth[coo.row] + 1 - depth[coo.col]))) == 1


def _positive_matrix(G):
    """:func:`_positive` with self-loops as a sparse 0/1 matrix over the nodes in ``G``'s order (``A[u, v]``:
    edge u->v): what both load-time checks read (self-loops change no strong component)."""
    import scipy.sparse as sp
    index = {v: i for i, v in enumerate(G.nodes)}
    pairs = [(index[u], index[v]) for u, v, w in G.edges(data="weight") if w is None or w > 0]
    n = len(index)
    rows, cols = (np.array(x, dtype=np.int64) for x in zip(*pairs)) if pairs else (np.zeros(0, np.int64),) * 2
    return sp.csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))


def _strong_components(A):
    from scipy.sparse.csgraph import connected_components
    return connected_components(A, directed=True, connection="strong")[0]


def _positive(G, loops):
    """The pattern of ``G``'s edges of positive weight (unweighted edges count), self-loops only with
    ``loops``: what mixing actually uses."""
    P = nx.DiGraph()
    P.add_nodes_from(G.nodes)
    P.add_edges_from((u, v) for u, v, w in G.edges(data="weight") if (loops or u != v) and (w is None or w > 0))
    return P


def load(path, connected=True):
    """Read a topology file and return a validated, weighted DiGraph: the graph training uses.

    Two formats, chosen by content (a ``.json`` file or one starting with ``{`` is JSON):
    networkx node-link JSON as ``nx.node_link_data`` writes it (``"edges"`` or older ``"links"``
    key; undirected graphs become both directions), or an edge list with one ``src dst [weight]``
    per line, ``#`` comments and blank lines. A file without any weights gets Hop eq. (1)
    weights; a file with weights on some edges only is an error. Given weights follow
    :func:`~hopdec.topology.weights.effective_weights` (weight 0 is no edge; columns are
    renormalised); what that changed is in ``G.graph["notes"]``, one line each, for the commands
    to print. ``connected=False`` accepts graphs that are not strongly connected.
    """
    src = str(path)
    text = _read_text(path, src)
    if src.lower().endswith(".json") or text.lstrip().startswith(("{", "[")):
        data = _load_json(text, src)
        if is_schedule_data(data):              # a time-varying topology (hopdec.topology.schedule)
            return parse_schedule(data, src, connected)
        G, weighted = _parse_node_link(data, src)
    else:
        if text.lstrip().startswith("<"):       # GraphML, GEXF, any XML: read as an edge list, its first
            raise TopologyError(                # line was "node ids must be integers, got '<?xml'"
                f"{src}: looks like XML (GraphML?); hopdec reads node-link JSON or an edge list (convert with "
                f"networkx: json.dump(nx.node_link_data(nx.read_graphml(path, node_type=int)), f))")
        G, weighted = _parse_edge_list(text, src)
    return _weighted(G, src, weighted, connected)


def from_graph(G, source="<graph>", connected=True):
    """The graph training uses from an ``nx.DiGraph`` (``HopOptimizer(topology=G)``), by :func:`load`'s
    rules: no weights at all gets Hop eq. (1) weights, some only is an error, given ones are used as in a
    file (``G`` is not changed)."""
    given = [w is not None for _, _, w in G.edges(data="weight")]
    weighted = "none" if not any(given) else "all" if all(given) else "some"
    return _weighted(nx.DiGraph(G), source, weighted, connected)


def _weighted(G, src, weighted, connected):
    """:func:`load`'s end: weights filled in as ``weighted`` ("all", "some", "none") says, then
    :func:`effective_graph`."""
    if weighted == "some":
        missing = [(u, v) for u, v, w in G.edges(data="weight") if w is None and u != v]
        missing = missing or [(u, v) for u, v, w in G.edges(data="weight") if w is None]
        u, v = missing[0]
        raise TopologyError(f"{src}: some edges have weights and some do not (e.g. {u}->{v} has "
                            f"none); give all weights or none")
    rule = None
    if weighted == "none":
        _check_ids(G, src)
        G = with_default_weights(G)
        rule = "eq1"                            # by construction (weights_rule would rebuild the graph twice)
    else:
        for v in list(G.nodes):
            if not G.has_edge(v, v):
                G.add_edge(v, v, weight=0.0)
    return effective_graph(G, src, connected, rule)


NODE_ATTRIBUTES = ("machine", "backup_workers", "bandwidth")
EDGE_ATTRIBUTES = ("weight", "bandwidth", "latency")
"""The attributes hopdec reads from a topology file's nodes and edges; others are the file's own."""


def misspelt_attributes(source, node_keys, edge_keys):
    """One note per attribute that is not hopdec's but is spelt like one (``wieght``, ``machin``): it would be
    ignored, and the run would go unweighted or machine-less without a word. Other attributes (a label, a
    position) are the file's own and pass silently."""
    from hopdec.errors import closest
    notes = []
    for what, keys, known in (("node", node_keys, NODE_ATTRIBUTES), ("edge", edge_keys, EDGE_ATTRIBUTES)):
        for k in sorted(str(k) for k in keys if k not in known):
            near = closest(k, known)
            if near:
                notes.append(f"{source}: {what} attribute {k!r} is not one hopdec reads, so it is ignored; "
                             f"did you mean {near}?")
    return notes


def effective_graph(G, source="<graph>", connected=True, rule=None):
    """Validate ``G`` and apply the weight rule: the graph training uses (a copy, ids as ints).

    :func:`~hopdec.topology.weights.effective_weights` drops zero-weight edges and renormalises
    columns; its notes go to ``graph["notes"]``. With ``connected``, the result must be strongly
    connected over its (positive-weight) edges. ``rule``: the weight rule when the caller knows it (``load``
    gave a file without weights Hop eq. (1)'s), else found by :func:`weights_rule`. ``load`` ends here; so
    does ``HopSGD`` given a graph.
    """
    validate(G, source, connected=False)
    if all(type(v) is int for v in G.nodes):
        G = G.copy()
    else:
        G = nx.relabel_nodes(G, {v: int(v) for v in G.nodes})
    edge_keys = set()
    for _, _, d in G.edges(data=True):
        d["weight"] = float(d["weight"])
        if len(d) > 1:
            edge_keys.update(d)
    G, notes = effective_weights(G, source, copy=False)
    notes += misspelt_attributes(source, {k for _, d in G.nodes(data=True) for k in d}, edge_keys)
    if connected:
        pattern = _positive_matrix(G)           # (one pass over the edges for both checks)
        try:
            check_strongly_connected(G, source, pattern)
        except TopologyError as err:            # the file's edges may be there, with weights that count as 0
            dropped = [n for n in notes if "count as 0 (no edge)" in n]
            if not dropped:
                raise
            raise TopologyError(f"{err}; {dropped[0].removeprefix(f'{source}: ')}") from None
        if not is_aperiodic(G, pattern):
            notes.append(f"{source}: W is periodic (no worker on some cycle keeps a positive self-weight, so "
                         f"models are passed round it): the workers' models never approach their average; "
                         f"give every worker a positive self-loop weight")
    G.graph["source"] = source
    G.graph["notes"] = notes
    G.graph["weights"] = rule or weights_rule(G)    # the rule a heal recomputes them by
    return G


SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "topologies")
"""The checkout's ``topologies/`` folder (the shipped files), where a missing file's name is also looked for."""


def close_files(spec):
    """``"; did you mean topologies/ring_8.json?"`` for a topology path that is no file, naming the file of
    that name, or else the closest, beside it, in ``./topologies`` or in the shipped folder; ``""`` when
    none is close. A newcomer types ``ring_8.json`` from the README's list of shipped files."""
    import difflib
    folder, base = os.path.split(str(spec))
    exact, near = [], []
    for where in dict.fromkeys([folder or ".", os.path.join(folder, "topologies"), SHIPPED]):
        try:
            names = sorted(n for n in os.listdir(where) if n.endswith((".json", ".txt", ".edges")))
        except OSError:
            continue
        found = [base] if base in names else difflib.get_close_matches(base, names, n=1, cutoff=0.8)
        for name in found:
            rel = os.path.relpath(os.path.join(where, name))
            (exact if name == base else near).append(os.path.join(where, name) if rel.startswith("..") else rel)
    close = list(dict.fromkeys(exact or near))[:2]
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _read_text(path, src):
    """The file's text; TopologyError for anything but a readable regular UTF-8 file of sane size
    (:func:`hopdec.files.read_bytes`)."""
    from hopdec.files import read_bytes
    if str(src) == "":
        raise TopologyError("an empty topology path: give a topology file (node-link JSON or an edge list) "
                            "or a generator kind (ring, ring-based, complete, ...)")
    if not os.path.lexists(path):
        from hopdec.files import shown
        raise TopologyError(f"{shown(path)}: no such file (expected a topology file){close_files(path)}")
    raw = read_bytes(path, MAX_FILE_BYTES, "a topology file", TopologyError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"{src}: not a text file (expected node-link JSON or an edge list)") \
            from None
    return text[1:] if text.startswith("\ufeff") else text       # a byte-order mark is fine


def _check_ids(G, src):
    """Run only the node-id part of :func:`validate` (before weights are filled in), and refuse more workers
    than :data:`hopdec.limits.MAX_WORKERS` before anything else is built on them."""
    from hopdec.limits import MAX_WORKERS
    if G.number_of_nodes() > MAX_WORKERS:
        raise TopologyError(f"{src}: {G.number_of_nodes()} workers, more than hopdec handles ({MAX_WORKERS}: the "
                            f"simulator and topo analyze are built for thousands)")
    H = nx.DiGraph()
    H.add_nodes_from(G.nodes)
    H.add_edges_from(((v, v) for v in G.nodes), weight=1.0)
    validate(H, src, connected=False)


def _weight_state(G):
    """'all', 'none' or 'some': how many of the graph's edges carry a weight."""
    has = [w is not None for _, _, w in G.edges(data="weight")]
    if not has or not any(has):
        return "none"
    return "all" if all(has) else "some"


def _load_json(text, src):
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TopologyError(f"{src}: not valid JSON ({err.msg} at line {err.lineno} column "
                            f"{err.colno})") from None
    except RecursionError:
        raise TopologyError(f"{src}: JSON nested too deeply to read") from None
    except ValueError as err:     # e.g. an integer of more than 4300 digits
        raise TopologyError(f"{src}: JSON with a number Python will not read "
                            f"({str(err).split(':')[0]})") from None
    return data


def _parse_node_link(data, src):
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
    for k, i in enumerate(ids):     # before the edges: True or 1.5 would match an edge's 1 or be hidden by it
        if not isinstance(i, int) or isinstance(i, bool):
            raise TopologyError(f"{src}: node id {_short(i)} (node entry #{k}) is not an integer; node ids "
                                f"must be the ranks 0..{len(ids) - 1}")
    idset = set(ids)
    directed = data.get("directed", False)
    if not isinstance(directed, bool):       # "false" (a string) would read as true: a directed graph
        raise TopologyError(f"{src}: 'directed' must be true or false, got {_short(directed)}")
    seen = {}
    for k, e in enumerate(data[key]):
        if not isinstance(e, dict) or "source" not in e or "target" not in e:
            raise TopologyError(f"{src}: edge entry #{k} needs 'source' and 'target'")
        for end in ("source", "target"):
            if not isinstance(e[end], int) or isinstance(e[end], bool) or e[end] not in idset:
                raise TopologyError(f"{src}: edge {_short(e['source'])}->{_short(e['target'])} "
                                    f"refers to node {_short(e[end])}, which is not one of the "
                                    f"{len(ids)} nodes (ids 0..{len(ids) - 1})")
        pair = (e["source"], e["target"]) if directed else frozenset((e["source"], e["target"]))
        if pair in seen:         # networkx would keep the last weight silently
            raise TopologyError(f"{src}: duplicate edge {_short(e['source'])}->"
                                f"{_short(e['target'])} (entries #{seen[pair]} and #{k}"
                                + ("" if directed else ", an undirected graph") + ")")
        seen[pair] = k
    if len(idset) != len(ids):
        raise TopologyError(f"{src}: duplicate node ids")
    # straight into a DiGraph (what nx.node_link_graph and a copy did: half the time at 2 million edges);
    # an undirected file gives both directions
    G = nx.DiGraph()
    G.add_nodes_from((node["id"], {k: v for k, v in node.items() if k != "id"}) for node in data["nodes"])
    attrs = [{k: v for k, v in e.items() if k not in ("source", "target", "key")} for e in data[key]]
    G.add_edges_from((e["source"], e["target"], d) for e, d in zip(data[key], attrs))
    if not directed:
        G.add_edges_from((e["target"], e["source"], d) for e, d in zip(data[key], attrs))
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
                                f"{_short(parts[0])} {_short(parts[1])}") from None
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
                raise TopologyError(f"{src}: line {lineno}: weight {_short(parts[2])} is not a "
                                    f"number") from None
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

    ``load(path)`` gives the same graph back. A time-varying topology is written as a schedule file.
    """
    if schedule_of(G) is not None:
        return save_schedule(G, path)
    # what nx.node_link_data writes of a copy with the nodes and the edges sorted ({**attributes, "id": v},
    # {**data, "source": u, "target": v}), each written as json.dumps writes it -- an edge that carries its
    # weight alone straight from the numbers (2 million json.dumps calls at 100,000 nodes before)
    head = {"directed": True, "multigraph": False, "graph": {k: v for k, v in G.graph.items() if k != "source"}}
    nodes = [f'{{"id": {int(v)}}}' if not d else json.dumps({**d, "id": int(v)})
             for v, d in sorted(G.nodes(data=True))]
    shown = {}

    def edge(u, v, d):
        if len(d) == 1 and "weight" in d:
            w = float(d["weight"])
            if w not in shown or not w:     # (0.0 and -0.0 are one key: not cached)
                shown[w] = json.dumps(w)
            return f'{{"weight": {shown[w] if w else json.dumps(w)}, "source": {u}, "target": {v}}}'
        d = {**d, "weight": float(d["weight"])} if "weight" in d else dict(d)
        return json.dumps({**d, "source": u, "target": v})
    edges = [edge(u, v, d) for u, v, d in sorted((int(u), int(v), d) for u, v, d in G.edges(data=True))]
    # one node / edge per line: valid node-link JSON that is also easy to read and diff
    parts = ["{" + json.dumps(head)[1:-1] + ","]
    for key, items in (("nodes", nodes), ("edges", edges)):
        tail = "," if key == "nodes" else ""
        parts.append(f' "{key}": [\n' + ",\n".join(f"  {x}" for x in items) + "\n ]" + tail)
    parts.append("}\n")
    text = "\n".join(parts).encode("utf-8")
    atomic_write(path, lambda f: f.write(text))     # (whole or not at all: Ctrl-C, a full disk)


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
