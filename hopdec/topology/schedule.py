"""Time-varying topologies: a *schedule* of communication graphs, one per step of a period.

A schedule is P weighted digraphs G_0 .. G_{P-1} over the ranks 0..n-1. Iteration k of training uses
G_{k mod P}: worker i sends its parameters to its out-neighbours in G_{k mod P}, its Recv(k) waits for its
in-neighbours there, and its Reduce(k) mixes with that step's weights (Hop eq. (1) per step unless the
file gives weights). The one-peer exponential graph of BlueFog and Decent-DP (at step k every worker
sends to ``(i + 2^(k mod log2 n)) mod n``) is :func:`hopdec.topology.generators.one_peer_exponential`.

The *union* graph U (every edge of any step) is what the rest of hopdec takes as "the topology": the
token queues live on it (Hop Theorem 2 holds on every union edge, see :mod:`hopdec.hop.time_varying`),
and the schedule rides along as ``U.graph["schedule"]`` (:func:`schedule_of`). U's own weights are eq. (1)
on its pattern: what a static run on U would use, for comparison only.

File format (JSON, ``hopdec topo generate one-peer-exponential -n 8 -o s.json`` writes one)::

    {"schedule": "my-schedule",                      # optional name
     "directed": true,                                # default true; false: each edge both ways
     "nodes": [{"id": 0}, {"id": 1, "backup_workers": 1}, ...],   # optional (else ids from the edges)
     "steps": [[[0, 1], [1, 2], [2, 0]],              # step 0: edges [src, dst] or [src, dst, weight]
               {"edges": [{"source": 0, "target": 2, "weight": 0.5}, ...]},   # or node-link style
               ...]}

A step gives weights for all its edges or for none (then eq. (1)); ``[i, i, w]`` sets a self weight (missing:
0, or 1 for a node nobody sends to at that step). Each step follows the weight rule of static files (a
weight-0 edge is no edge; each node's in-weights are divided by their sum). A step need not be connected;
the union must be strongly connected.
"""

import json
import math

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError
from hopdec.files import atomic_write

MAX_STEPS = 4096
"""Longest period a schedule may have (a longer one would be a trace, not a schedule)."""


class _Step:
    """One step's edges as arrays: ``src``, ``dst``, ``w`` in the order a DiGraph of the step, built edge by
    edge, holds them (each node's successors and predecessors in that order), so that the ``nx.DiGraph``
    :attr:`Schedule.steps` gives on demand, each node's in-weights and every figure are what they were when
    every step was a DiGraph from the start -- without building 2 n P edge dictionaries nobody reads (a
    one-peer graph of 100,000 workers: 3.4 million)."""

    def __init__(self, n, src, dst, w, attrs, graph=None, ins=None):
        self.n, self.src, self.dst, self.w, self.attrs = n, src, dst, w, attrs
        self._graph = graph
        self._ins = ins                 # (ptr, senders, weights): each node's in-edges in predecessor order
        self._outs = None               # (ptr, receivers): each node's receivers, sorted, self left out

    @classmethod
    def from_graph(cls, g):
        """The step of a DiGraph over nodes 0..n-1 (its own orders kept: ``g`` itself is the step's graph)."""
        n = g.number_of_nodes()
        e = list(g.edges(data="weight"))
        src, dst = (np.array([x[i] for x in e], dtype=np.int64) for i in (0, 1))
        ins = [(u, w) for v in range(n) for u, _, w in g.in_edges(v, data="weight")]
        ptr = np.concatenate([[0], np.cumsum([g.in_degree(v) for v in range(n)])]).astype(np.int64)
        return cls(n, src, dst, np.array([x[2] for x in e], dtype=float), dict(g.graph), g,
                   (ptr, np.array([u for u, _ in ins], dtype=np.int64), np.array([w for _, w in ins], dtype=float)))

    def ins(self):
        if self._ins is None:
            order = np.argsort(self.dst, kind="stable")
            ptr = np.concatenate([[0], np.cumsum(np.bincount(self.dst, minlength=self.n))])
            self._ins = (ptr, self.src[order], self.w[order])
        return self._ins

    def outs(self):
        if self._outs is None:
            other = self.src != self.dst
            src, dst = self.src[other], self.dst[other]
            order = np.lexsort((dst, src))
            ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=self.n))])
            self._outs = (ptr, dst[order])
        return self._outs

    def graph(self):
        if self._graph is None:
            g = nx.DiGraph()
            g.graph.update(self.attrs)
            g.add_nodes_from(range(self.n))
            g.add_edges_from(zip(self.src.tolist(), self.dst.tolist(), ({"weight": w} for w in self.w.tolist())))
            self._graph = g
        return self._graph

    def by_sender(self):
        """The edges ``(src, dst)`` as ``g.edges`` lists them: senders in node order, each one's receivers in
        its successor order."""
        order = np.argsort(self.src, kind="stable")
        return self.src[order], self.dst[order]


class Schedule:
    """P weighted steps over nodes 0..n-1 (self-loops and effective weights present); ``steps`` gives them as
    ``nx.DiGraph``.

    >>> from hopdec.topology.generators import one_peer_exponential
    >>> s = schedule_of(one_peer_exponential(8))
    >>> s.period, s.out_at(1, 3), sorted(s.in_weights_at(2, 0).items())
    (3, (5,), [(0, 0.5), (4, 0.5)])
    >>> s.activation_gap(0, 2)          # edge 0 -> 2 is used at step 1 only: once every 3 iterations
    3
    """

    def __init__(self, steps, name=None):
        self._steps = tuple(g if isinstance(g, _Step) else _Step.from_graph(g) for g in steps)
        if not self._steps:
            raise ValueError("a schedule needs at least one step")
        self.period = len(self._steps)
        self.n = self._steps[0].n
        self.name = name
        self._activations = None

    @property
    def steps(self):
        """The steps as weighted ``nx.DiGraph`` (built on first use)."""
        return tuple(st.graph() for st in self._steps)

    @property
    def activations(self):
        """``{(u, v): [steps where edge u -> v is used]}`` (self-loops left out)."""
        if self._activations is None:
            act = {}
            for m, st in enumerate(self._steps):
                src, dst = st.by_sender()
                for u, v in zip(src.tolist(), dst.tolist()):
                    if u != v:
                        act.setdefault((u, v), []).append(m)
            self._activations = act
        return self._activations

    def in_weights_at(self, k, i):
        """``{sender: weight}`` of node i at iteration k (self included), as Reduce(k) mixes them."""
        ptr, src, w = self._steps[k % self.period].ins()
        a, b = ptr[i], ptr[i + 1]
        return dict(zip(src[a:b].tolist(), w[a:b].tolist()))

    def out_at(self, k, i):
        """Node i's receivers at iteration k (self excluded)."""
        ptr, dst = self._steps[k % self.period].outs()
        return tuple(dst[ptr[i]:ptr[i + 1]].tolist())

    def node_steps(self):
        """Every node's steps at once: for node i, ``(in_weights_at(m, i), out_at(m, i))`` for each step m,
        as :class:`hopdec.hop.worker.NodeView` holds them (fresh dicts; built on lists, not per call)."""
        per_step = []
        for st in self._steps:
            ptr, src, w = (x.tolist() for x in st.ins())
            optr, dst = (x.tolist() for x in st.outs())
            per_step.append(([dict(zip(src[a:b], w[a:b])) for a, b in zip(ptr, ptr[1:])],
                             [tuple(dst[a:b]) for a, b in zip(optr, optr[1:])]))
        return [tuple((ins[i], outs[i]) for ins, outs in per_step) for i in range(self.n)]

    def degrees(self, m):
        """``(in, out)``: every node's number of senders and of receivers at step m (self left out), arrays."""
        st = self._steps[m]
        other = st.src != st.dst
        return (np.bincount(st.dst[other], minlength=self.n), np.bincount(st.src[other], minlength=self.n))

    def messages(self, m):
        """The messages step m sends (its edges that are not self-loops)."""
        st = self._steps[m]
        return int(np.count_nonzero(st.src != st.dst))

    def arcs(self, m):
        """Step m's edges, self-loops left out, as arrays ``(senders, receivers)``, by sender then receiver."""
        ptr, dst = self._steps[m].outs()
        return np.repeat(np.arange(self.n), np.diff(ptr)), dst

    def pairs(self, m):
        """Step m's edges ``(u, v)``, self-loops left out, by sender then receiver."""
        src, dst = self.arcs(m)
        return list(zip(src.tolist(), dst.tolist()))

    def activation_gap(self, u, v):
        """The most iterations between two consecutive uses of edge u -> v, cyclically (P for an edge used
        once a period, 1 for an edge used at every step): how far v may run ahead of u (Theorem 1 with
        time-varying edges, :mod:`hopdec.hop.time_varying`)."""
        used = self.activations[(u, v)]
        return max(b - a for a, b in zip(used, used[1:] + [used[0] + self.period]))

    def gaps(self):
        """``{(u, v): activation_gap(u, v)}`` for every union edge."""
        return {e: self.activation_gap(*e) for e in self.activations}

    def gap_matrix(self):
        """Every union edge's :meth:`activation_gap` as a scipy CSR matrix (``A[u, v]``; self-loops left out),
        computed on the steps' arrays at once."""
        import scipy.sparse as sp
        n, P = self.n, self.period
        keys, steps = [], []
        for m, st in enumerate(self._steps):
            other = st.src != st.dst
            keys.append(st.src[other] * n + st.dst[other])
            steps.append(np.full(int(other.sum()), m, dtype=np.int64))
        keys, steps = np.concatenate(keys), np.concatenate(steps)
        order = np.lexsort((steps, keys))
        keys, steps = keys[order], steps[order]
        if not len(keys):
            return sp.csr_matrix((n, n))
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        ends = np.concatenate([starts[1:], [len(keys)]]) - 1
        gap = steps[starts] + P - steps[ends]                   # from the last use round to the first
        inner = np.flatnonzero(keys[1:] == keys[:-1])           # consecutive uses of one edge
        group = np.searchsorted(starts, inner, side="right") - 1
        np.maximum.at(gap, group, steps[inner + 1] - steps[inner])
        edge = keys[starts]
        return sp.csr_matrix((gap.astype(float), (edge // n, edge % n)), shape=(n, n))

    def matrices(self):
        """The steps' mixing matrices W_m (scipy CSR, ``W[i, j]`` = weight of i in j's average)."""
        import scipy.sparse as sp
        return [sp.csr_matrix((st.w, (st.src, st.dst)), shape=(self.n, self.n)) for st in self._steps]

    def fingerprint(self):
        """Plain data that identifies the schedule (every step's edges and weights, in order)."""
        out = []
        for st in self._steps:
            order = np.lexsort((st.dst, st.src))
            out.append(list(zip(st.src[order].tolist(), st.dst[order].tolist(),
                                (round(w, 12) for w in st.w[order].tolist()))))
        return out

    def describe(self):
        return f"{self.name or 'schedule'}: period {self.period}"


def schedule_of(G):
    """The :class:`Schedule` a union graph carries, or None for a static topology."""
    return G.graph.get("schedule") if G is not None else None


def _union_edges(schedule):
    """The union's edges ``(u, v)`` (self-loops left out), arrays in the order a DiGraph built from
    :attr:`Schedule.activations` and then copied holds them: senders ascending, each one's receivers in the
    order they first appear (step by step)."""
    n = schedule.n
    keys = []
    for st in schedule._steps:
        src, dst = st.by_sender()
        keep = src != dst
        keys.append(src[keep] * n + dst[keep])
    keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    uniq, first = np.unique(keys, return_index=True)
    ordered = uniq[np.argsort(first, kind="stable")]           # as the activations dict lists them
    ordered = ordered[np.argsort(ordered // n, kind="stable")]   # ... sender by sender
    return ordered // n, ordered % n


def union_graph(schedule, node_attrs=None, source=None, edges=None):
    """The union U of a schedule's steps with eq. (1) weights, ``node_attrs`` ({node: {...}}) on its nodes,
    and the schedule in ``U.graph["schedule"]`` (``edges``: :func:`_union_edges`, where the caller has them)."""
    n = schedule.n
    src, dst = _union_edges(schedule) if edges is None else edges
    count = np.bincount(dst, minlength=n) + 1                   # eq. (1): 1/|N_in(j)|, the self-loop counted
    U = nx.DiGraph(name=schedule.name or "schedule")
    U.graph["weights"] = "eq1"
    U.add_nodes_from(range(n))
    U.add_edges_from(zip(src.tolist(), dst.tolist(), ({"weight": w} for w in (1.0 / count[dst]).tolist())))
    U.add_edges_from((v, v, {"weight": w}) for v, w in enumerate((1.0 / count).tolist()))
    for v, attrs in (node_attrs or {}).items():
        U.nodes[v].update(attrs)
    U.graph["schedule"] = schedule
    U.graph["weights"] = "schedule"
    if source is not None:
        U.graph["source"] = source
    U.graph.setdefault("notes", [])
    return U


def _ints(xs):
    """``xs`` (node ids) as an int64 array, or None unless every one is a Python int (anything else -- a float,
    a bool, a numpy integer -- takes the per-edge path, whose checks and errors are the reference)."""
    if not set(map(type, xs)) <= {int}:
        return None
    try:
        return np.array(xs, dtype=np.int64)
    except OverflowError:
        return None


def _fast_step(n, edges, has_w, where):
    """``(step, notes)`` of one step's edge list, on arrays; None when anything in it is malformed (the
    per-edge path, :func:`_checked_step`, then says what, as it always did)."""
    try:
        u, v = _ints([e[0] for e in edges]), _ints([e[1] for e in edges])
        if has_w:
            if set(map(len, edges)) - {3}:
                return None
            ws = [e[2] for e in edges]
            if not set(map(type, ws)) <= {int, float}:
                return None
            w = np.array(ws, dtype=float)
    except (IndexError, TypeError, KeyError, OverflowError):
        return None
    if u is None or v is None:
        return None
    if len(u) and (u.min() < 0 or v.min() < 0 or u.max() >= n or v.max() >= n):
        return None
    keys = np.sort(u * n + v)
    if (keys[1:] == keys[:-1]).any():                           # a duplicate edge
        return None
    loops = np.zeros(n, bool)
    loops[u[u == v]] = True
    missing = np.flatnonzero(~loops)                            # nodes without a self-loop: one is added
    if not has_w:                                               # Hop eq. (1) (with_default_weights)
        order = np.argsort(u, kind="stable")                    # (the DiGraph copy lists senders in order)
        src, dst = np.concatenate([u[order], missing]), np.concatenate([v[order], missing])
        w = 1.0 / np.bincount(dst, minlength=n)[dst]
        return _Step(n, src, dst, w, {"weights": "eq1"}), []
    if not np.isfinite(w).all() or (w < 0).any():
        return None
    indeg = np.bincount(v, minlength=n)                         # a missing self weight: 0, or 1 for a node
    src, dst = np.concatenate([u, missing]), np.concatenate([v, missing])     # nobody sends to
    w = np.concatenate([w, np.where(indeg[missing] > 0, 0.0, 1.0)])
    if (np.bincount(dst, weights=(w > 0), minlength=n) == 0).any():    # in-weights summing to zero
        return None
    src, dst, w, notes = _effective(n, src, dst, w, where)
    return _Step(n, src, dst, w, {}), notes


def _effective(n, src, dst, w, where):
    """:func:`hopdec.topology.weights.effective_weights` on a step's arrays (insertion order): the same edges
    dropped, the same weights to the last bit (each column summed in predecessor order, as Python's ``sum``
    does), the same notes."""
    from hopdec.topology.weights import NEGLIGIBLE, TOL
    notes = []
    zero = (src != dst) & (w == 0)
    if zero.any():
        zu, zv = src[zero], dst[zero]
        first = np.lexsort((zv, zu))[0]
        notes.append(f"{where}: {int(zero.sum())} edge(s) of weight 0 are not edges (e.g. {zu[first]}->"
                     f"{zv[first]}): no messages go along them and they do not count for connectivity")
        src, dst, w = src[~zero], dst[~zero], w[~zero]

    def columns():
        order = np.argsort(dst, kind="stable")                   # each column in predecessor order
        ptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
        return order, ptr, np.maximum.reduceat(w[order], ptr[:-1])   # (every column has its self-loop)

    order, ptr, top = columns()
    wo = w[order]
    tiny = (0 < wo) & (wo < top[dst[order]] * NEGLIGIBLE)
    if tiny.any():
        t = order[tiny]
        notes.append(f"{where}: {len(t)} weight(s) are more than {1 / NEGLIGIBLE:.0e} times smaller than their "
                     f"worker's largest in-weight (e.g. {src[t[0]]}->{dst[t[0]]}): they count as 0 (no edge), as "
                     f"they would underflow in the average")
        w = w.copy()
        loop = src[t] == dst[t]
        w[t[loop]] = 0.0
        keep = np.ones(len(src), bool)
        keep[t[~loop]] = False
        src, dst, w = src[keep], dst[keep], w[keep]
        order, ptr, top = columns()
    col = dst[order]
    q = w[order] / top[col]
    total = np.zeros(n)
    cols, k = np.arange(n), 0
    while len(cols):                                          # left to right, as sum() adds
        cols = cols[ptr[cols] + k < ptr[cols + 1]]
        total[cols] += q[ptr[cols] + k]
        k += 1
    off = np.abs(total * top - 1.0) > TOL
    if off.any():
        j = int(np.flatnonzero(off)[0])
        notes.append(f"{where}: the in-weights of {int(off.sum())} node(s) do not sum to 1 (node {j}: "
                     f"{float(total[j] * top[j]):.6g}); each worker divides them by their sum, as training does")
        sel = off[col]
        w = w.copy()
        w[order[sel]] = (w[order[sel]] / top[col[sel]]) / total[col[sel]]
    return src, dst, w, notes


def _checked_step(n, edges, has_w, where):
    """``(graph, notes)``: one step built edge by edge as a DiGraph, every check in the order it was always
    made (the reference :func:`_fast_step` answers for, and what says what is wrong with a step)."""
    from hopdec.topology.graph_io import validate
    from hopdec.topology.weights import effective_weights, with_default_weights
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    for e in edges:
        u, v = int(e[0]), int(e[1])
        if not (0 <= u < n and 0 <= v < n):
            raise TopologyError(f"{where}: edge {u}->{v} refers to a node outside 0..{n - 1}")
        if G.has_edge(u, v):
            raise TopologyError(f"{where}: duplicate edge {u}->{v}")
        if has_w:
            if len(e) != 3:
                raise TopologyError(f"{where}: some edges have weights and some do not (e.g. {u}->{v} "
                                    f"has none); give all weights of a step or none")
            G.add_edge(u, v, weight=e[2])
        else:
            G.add_edge(u, v)
    if not has_w:
        return with_default_weights(G), []
    for v in range(n):              # a missing self weight is 0, as in static files -- but a node
        if not G.has_edge(v, v):      # nobody sends to at this step keeps its own parameters
            G.add_edge(v, v, weight=0.0 if G.in_degree(v) else 1.0)
    validate(G, where, connected=False)
    for _, _, d in G.edges(data=True):
        d["weight"] = float(d["weight"])
    return effective_weights(G, where, copy=False)


def _weighted(edges):
    """Whether a step's edges carry weights: any of them has three entries."""
    try:
        return 3 in set(map(len, edges))
    except TypeError:                   # (something without a length: let the edges' checks say what)
        return any(len(e) == 3 for e in edges)


def from_steps(n, steps, name=None, node_attrs=None, source=None, connected=True, weighted=None):
    """Build a validated union graph (with its schedule) from per-step edge lists.

    ``steps``: one list per step of ``(src, dst)`` or ``(src, dst, weight)``; ``weighted``: per step,
    whether weights were given (default: the tuples' length decides). Each step gets eq. (1) weights
    when unweighted, else the weight rule of :func:`~hopdec.topology.weights.effective_weights`.
    TopologyError (naming ``source``) when a step is malformed or the union is not strongly connected.

    >>> U = from_steps(3, [[(0, 1), (1, 2), (2, 0)], [(0, 2), (2, 1), (1, 0)]], name="two rings")
    >>> schedule_of(U).period, sorted(U.successors(0))
    (2, [0, 1, 2])
    """
    import scipy.sparse as sp

    from hopdec.topology.graph_io import check_strongly_connected, validate
    src = source or name or "<schedule>"
    if not 1 <= len(steps) <= MAX_STEPS:
        raise TopologyError(f"{src}: a schedule needs 1..{MAX_STEPS} steps, got {len(steps)}")
    built, notes = [], []
    for m, edges in enumerate(steps):
        where = f"{src}: step {m}"
        has_w = weighted[m] if weighted is not None else _weighted(edges)
        fast = _fast_step(n, edges, has_w, where)
        if fast is None:
            G, step_notes = _checked_step(n, edges, has_w, where)
            fast = _Step.from_graph(G), step_notes
        built.append(fast[0])
        notes += fast[1]
    schedule = Schedule(built, name=name)
    edges = _union_edges(schedule)
    U = union_graph(schedule, node_attrs, source=src, edges=edges)
    H = nx.DiGraph()                    # the union's own weights are right by construction: check its nodes'
    H.add_nodes_from(U.nodes(data=True))    # attributes (machine, backup_workers) as validate does
    H.add_edges_from(((v, v) for v in range(n)), weight=1.0)
    validate(H, src, connected=False)
    if connected:
        every = np.arange(n)
        pattern = sp.csr_matrix((np.ones(len(edges[0]) + n, dtype=np.int8),
                                 (np.concatenate([edges[0], every]), np.concatenate([edges[1], every]))),
                                shape=(n, n))
        try:
            check_strongly_connected(U, src, pattern)
        except TopologyError as err:
            raise TopologyError(f"{err} (over the union of the schedule's {len(built)} steps)") from None
    U.graph["notes"] = notes
    return U


def _edge(e, where, k):
    """One edge entry of a schedule file: ``[u, v]``, ``[u, v, w]`` or ``{"source", "target"[, "weight"]}``."""
    if isinstance(e, dict):
        extra = set(e) - {"source", "target", "weight"}
        if extra:
            raise TopologyError(f"{where}: edge #{k} has key {sorted(extra)[0]!r}; a schedule's edges take "
                                f"source, target and weight only")
        if "source" not in e or "target" not in e:
            raise TopologyError(f"{where}: edge #{k} needs 'source' and 'target'")
        e = [e["source"], e["target"]] + ([e["weight"]] if "weight" in e else [])
    if not isinstance(e, list) or len(e) not in (2, 3):
        raise TopologyError(f"{where}: edge #{k} must be [src, dst], [src, dst, weight] or an object with "
                            f"source and target")
    for end in e[:2]:
        if isinstance(end, bool) or not isinstance(end, int) or end < 0:
            raise TopologyError(f"{where}: edge #{k}: node ids must be the ranks 0..n-1 (integers), got "
                                f"{str(end)[:24]!r}")
    if len(e) == 3:
        w = e[2]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not _finite(w) or w < 0:
            raise TopologyError(f"{where}: edge {e[0]}->{e[1]} has weight {str(w)[:24]!r}; weights are "
                                f"finite numbers >= 0")
    return e


def _finite(w):
    """Whether the number ``w`` is finite as a float (an integer of 4,000 digits is not: float() overflows)."""
    try:
        return math.isfinite(float(w))
    except OverflowError:
        return False


def _plain_edges(step):
    """A copy of the list ``step`` when every edge in it is a list ``[src, dst]`` (all of them) or
    ``[src, dst, weight]`` (all of them) that :func:`_edge` accepts as it is -- what a written file holds --,
    checked a field at a time over the whole step; None otherwise (then :func:`_edge` looks at each edge and
    says what is wrong)."""
    if not step:
        return []
    if set(map(type, step)) != {list}:
        return None
    lens = set(map(len, step))
    if lens != {2} and lens != {3}:
        return None
    for i in (0, 1):
        ends = [e[i] for e in step]
        if not set(map(type, ends)) <= {int} or min(ends) < 0:
            return None
    if lens == {3}:
        ws = [e[2] for e in step]
        if not set(map(type, ws)) <= {int, float}:
            return None
        try:
            w = np.array(ws, dtype=float)
        except OverflowError:
            return None
        if not np.isfinite(w).all() or (w < 0).any():
            return None
    return list(step)


def is_schedule_data(data):
    """Whether parsed JSON is a schedule file (it has a ``steps`` list) rather than node-link JSON."""
    return isinstance(data, dict) and "steps" in data


def parse(data, src, connected=True):
    """The union graph (with its schedule) of parsed schedule-file JSON ``data``; TopologyError naming
    ``src`` for anything malformed."""
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TopologyError(f"{src}: 'steps' must be a non-empty list of steps (each a list of edges)")
    if len(steps) > MAX_STEPS:
        raise TopologyError(f"{src}: {len(steps)} steps; a schedule has at most {MAX_STEPS}")
    extra = set(data) - {"schedule", "directed", "nodes", "steps", "period"}
    if extra:
        raise TopologyError(f"{src}: unknown key {sorted(extra)[0]!r} in a schedule file (it takes schedule, "
                            f"directed, nodes, steps, period)")
    if "period" in data and data["period"] != len(steps):
        raise TopologyError(f"{src}: 'period' is {str(data['period'])[:24]} but there are {len(steps)} steps")
    directed = data.get("directed", True)
    if not isinstance(directed, bool):
        raise TopologyError(f"{src}: 'directed' must be true or false")
    name = data.get("schedule")
    if name is not None and not isinstance(name, str):
        raise TopologyError(f"{src}: 'schedule' (its name) must be a string")
    lists, weighted = [], []
    for m, step in enumerate(steps):
        where = f"{src}: step {m}"
        if isinstance(step, dict):
            if set(step) - {"edges"} or not isinstance(step.get("edges"), list):
                raise TopologyError(f"{where}: a step is a list of edges or an object with an 'edges' list")
            step = step["edges"]
        if not isinstance(step, list):
            raise TopologyError(f"{where}: a step is a list of edges or an object with an 'edges' list")
        edges = _plain_edges(step)
        if edges is None:
            edges = [_edge(e, where, k) for k, e in enumerate(step)]
        kinds = set(map(len, edges))
        if len(kinds) > 1:
            u, v = next(e[:2] for e in edges if len(e) == 2)
            raise TopologyError(f"{where}: some edges have weights and some do not (e.g. {u}->{v} has none); "
                                f"give all weights of a step or none")
        if not directed:
            seen = {(e[0], e[1]) for e in edges}
            edges += [[e[1], e[0]] + e[2:] for e in edges if e[0] != e[1] and (e[1], e[0]) not in seen]
        lists.append(edges)
        weighted.append(kinds == {3})
    node_attrs, n = {}, None
    nodes = data.get("nodes")
    if nodes is not None:
        if not isinstance(nodes, list) or not nodes:
            raise TopologyError(f"{src}: 'nodes' must be a non-empty list of {{\"id\": rank, ...}} objects")
        ids = []
        for k, node in enumerate(nodes):
            if not isinstance(node, dict) or "id" not in node:
                raise TopologyError(f"{src}: node entry #{k} has no 'id'")
            if isinstance(node["id"], bool) or not isinstance(node["id"], int):
                raise TopologyError(f"{src}: node entry #{k} has id {str(node['id'])[:24]!r}; node ids are the "
                                    f"ranks 0..n-1 (integers)")
            ids.append(node["id"])
            node_attrs[node["id"]] = {a: b for a, b in node.items() if a != "id"}
        if sorted(i for i in ids if isinstance(i, int) and not isinstance(i, bool)) != list(range(len(ids))):
            raise TopologyError(f"{src}: node ids must be exactly 0..{len(ids) - 1} (one per rank)")
        n = len(ids)
    else:
        n = 1 + max((max(e[0], e[1]) for edges in lists for e in edges), default=-1)
        if n < 1:
            raise TopologyError(f"{src}: the schedule has no edges and no 'nodes'")
    from hopdec.limits import MAX_WORKERS
    if n > MAX_WORKERS:                  # before n nodes are built: an edge [0, 99999999] alone makes n 10^8
        raise TopologyError(f"{src}: {n} workers, more than hopdec handles ({MAX_WORKERS})")
    return from_steps(n, lists, name=name, node_attrs=node_attrs, source=src, connected=connected,
                      weighted=weighted)


def save(U, path):
    """Write a union graph's schedule as a schedule file (every step's edges with their weights, self
    weights included, so :func:`hopdec.topology.load` gives the same schedule back)."""
    s = schedule_of(U)
    nodes = [f'{{"id": {int(v)}}}' if not d else
             json.dumps(dict({"id": int(v)}, **{k: _plain(x) for k, x in d.items()}))
             for v, d in sorted(U.nodes(data=True))]
    head = {"schedule": s.name or "schedule", "directed": True, "period": s.period}
    lines = ["{" + json.dumps(head)[1:-1] + ",", ' "nodes": [' + ", ".join(nodes) + "],", ' "steps": [']
    steps = []
    for st in s._steps:                 # each edge [src, dst, weight] as json.dumps writes it, sorted
        order = np.lexsort((st.dst, st.src))
        weights = st.w[order].tolist()
        shown = {w: json.dumps(w) for w in set(weights) if w != 0}    # (0.0 and -0.0 are one key: not cached)
        steps.append("  [" + ", ".join(f"[{u}, {v}, {shown[w] if w else json.dumps(w)}]" for u, v, w in
                                       zip(st.src[order].tolist(), st.dst[order].tolist(), weights)) + "]")
    lines.append(",\n".join(steps))
    lines.append(" ]\n}\n")
    text = "\n".join(lines).encode("utf-8")
    atomic_write(path, lambda f: f.write(text))     # (whole or not at all: Ctrl-C, a full disk)


def _plain(x):
    return x.item() if isinstance(x, np.generic) else x
