"""The schedule code before it was made fast (hopdec commit 30dcbac): a networkx DiGraph per step, built edge by
edge, eq. (1) and the weight rule applied by :func:`hopdec.topology.weights.with_default_weights` and
:func:`~hopdec.topology.weights.effective_weights`. ``tests/test_schedule_arrays.py`` checks that the arrays
:mod:`hopdec.topology.schedule` uses now give the same union graph, steps, weights (bit for bit, in the same
order), notes and errors as this on random and hostile schedules. What did not change (an edge entry's
checks, eq. (1) on a DiGraph) is imported, not copied."""

import json

import networkx as nx
import numpy as np

from hopdec.errors import TopologyError
from hopdec.topology.schedule import MAX_STEPS, _edge, schedule_of     # (unchanged since)
from hopdec.topology.weights import with_default_weights                # (unchanged since)


class Schedule:
    """P weighted ``nx.DiGraph`` steps over nodes 0..n-1 (self-loops and effective weights present)."""

    def __init__(self, steps, name=None):
        self.steps = tuple(steps)
        if not self.steps:
            raise ValueError("a schedule needs at least one step")
        self.period = len(self.steps)
        self.n = self.steps[0].number_of_nodes()
        self.name = name
        self._ins = [{v: {int(u): float(w) for u, _, w in g.in_edges(v, data="weight")} for v in g.nodes}
                     for g in self.steps]
        self._outs = [{v: tuple(sorted(int(u) for u in g.successors(v) if u != v)) for v in g.nodes}
                      for g in self.steps]
        act = {}
        for m, g in enumerate(self.steps):
            for u, v in g.edges:
                if u != v:
                    act.setdefault((int(u), int(v)), []).append(m)
        self.activations = act
        """``{(u, v): [steps where edge u -> v is used]}`` (self-loops left out)."""

    def in_weights_at(self, k, i):
        """``{sender: weight}`` of node i at iteration k (self included), as Reduce(k) mixes them."""
        return self._ins[k % self.period][i]

    def out_at(self, k, i):
        """Node i's receivers at iteration k (self excluded)."""
        return self._outs[k % self.period][i]

    def activation_gap(self, u, v):
        """The most iterations between two consecutive uses of edge u -> v, cyclically (P for an edge used
        once a period, 1 for an edge used at every step): how far v may run ahead of u (Theorem 1 with
        time-varying edges, :mod:`hopdec.hop.time_varying`)."""
        used = self.activations[(u, v)]
        return max(b - a for a, b in zip(used, used[1:] + [used[0] + self.period]))

    def gaps(self):
        """``{(u, v): activation_gap(u, v)}`` for every union edge."""
        return {e: self.activation_gap(*e) for e in self.activations}

    def matrices(self):
        """The steps' mixing matrices W_m (scipy CSR, ``W[i, j]`` = weight of i in j's average)."""
        from hopdec.topology.weights import sparse_mixing_matrix
        return [sparse_mixing_matrix(g) for g in self.steps]

    def fingerprint(self):
        """Plain data that identifies the schedule (every step's edges and weights, in order)."""
        return [sorted((int(u), int(v), round(float(w), 12)) for u, v, w in g.edges(data="weight"))
                for g in self.steps]

    def describe(self):
        return f"{self.name or 'schedule'}: period {self.period}"


def union_graph(schedule, node_attrs=None, source=None):
    """The union U of a schedule's steps with eq. (1) weights, ``node_attrs`` ({node: {...}}) on its nodes,
    and the schedule in ``U.graph["schedule"]``."""
    U = nx.DiGraph(name=schedule.name or "schedule")
    U.add_nodes_from(range(schedule.n))
    U.add_edges_from(schedule.activations)
    U = with_default_weights(U)
    for v, attrs in (node_attrs or {}).items():
        U.nodes[v].update(attrs)
    U.graph["schedule"] = schedule
    U.graph["weights"] = "schedule"
    if source is not None:
        U.graph["source"] = source
    U.graph.setdefault("notes", [])
    return U


def from_steps(n, steps, name=None, node_attrs=None, source=None, connected=True, weighted=None):
    """Build a validated union graph (with its schedule) from per-step edge lists.

    ``steps``: one list per step of ``(src, dst)`` or ``(src, dst, weight)``; ``weighted``: per step,
    whether weights were given (default: the tuples' length decides). Each step gets eq. (1) weights
    when unweighted, else the weight rule of :func:`~hopdec.topology.weights.effective_weights`.
    TopologyError (naming ``source``) when a step is malformed or the union is not strongly connected."""
    from hopdec.topology.graph_io import check_strongly_connected, validate
    from hopdec.topology.weights import effective_weights
    src = source or name or "<schedule>"
    if not 1 <= len(steps) <= MAX_STEPS:
        raise TopologyError(f"{src}: a schedule needs 1..{MAX_STEPS} steps, got {len(steps)}")
    graphs, notes = [], []
    for m, edges in enumerate(steps):
        where = f"{src}: step {m}"
        G = nx.DiGraph()
        G.add_nodes_from(range(n))
        has_w = weighted[m] if weighted is not None else any(len(e) == 3 for e in edges)
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
        if has_w:
            for v in range(n):              # a missing self weight is 0, as in static files -- but a node
                if not G.has_edge(v, v):      # nobody sends to at this step keeps its own parameters
                    G.add_edge(v, v, weight=0.0 if G.in_degree(v) else 1.0)
            validate(G, where, connected=False)
            for _, _, d in G.edges(data=True):
                d["weight"] = float(d["weight"])
            G, step_notes = effective_weights(G, where, copy=False)
            notes += step_notes
        else:
            G = with_default_weights(G)
        graphs.append(G)
    U = union_graph(Schedule(graphs, name=name), node_attrs, source=src)
    validate(U, src, connected=False)
    if connected:
        try:
            check_strongly_connected(U, src)
        except TopologyError as err:
            raise TopologyError(f"{err} (over the union of the schedule's {len(graphs)} steps)") from None
    U.graph["notes"] = notes
    return U


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
        edges = [_edge(e, where, k) for k, e in enumerate(step)]
        kinds = {len(e) for e in edges}
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
    nodes = [dict({"id": int(v)}, **{k: _plain(x) for k, x in d.items()}) for v, d in sorted(U.nodes(data=True))]
    head = {"schedule": s.name or "schedule", "directed": True, "period": s.period}
    lines = ["{" + json.dumps(head)[1:-1] + ",", ' "nodes": [' + ", ".join(json.dumps(x) for x in nodes) + "],",
             ' "steps": [']
    steps = []
    for g in s.steps:
        edges = sorted((int(u), int(v), float(w)) for u, v, w in g.edges(data="weight"))
        steps.append("  [" + ", ".join(json.dumps(list(e)) for e in edges) + "]")
    lines.append(",\n".join(steps))
    lines.append(" ]\n}\n")
    with open(path, "w") as fh:
        fh.write("\n".join(lines))


def _plain(x):
    return x.item() if isinstance(x, np.generic) else x
