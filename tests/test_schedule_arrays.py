"""A schedule's steps live in arrays (:mod:`hopdec.topology.schedule`): the same schedule, to the bit and in the
same order, as when every step was a networkx DiGraph built edge by edge (``tests/schedule_reference.py``, the
code before): the union graph (edges, weights, each node's successors and predecessors in order, attributes),
every step's graph, in-weights, receivers, activations and their gaps, degrees, mixing matrices and fingerprint,
the notes of the weight rule, the file ``save`` writes, and every error, with the same words -- on random
schedules, weighted and not, with zero, tiny, unnormalised and missing self weights, and on malformed ones.
"""

import json
import math
import random

import numpy as np
import pytest

import schedule_reference as ref
from hopdec.errors import TopologyError
from hopdec.topology import schedule as new


def _bits(x):
    """A weight as its exact bits (0.0 and -0.0 differ, as they do in a written file)."""
    return float(x).hex() if isinstance(x, float) else x


def _data(d):
    return {k: _bits(v) for k, v in d.items()}


def graph_facts(G):
    """Everything about a DiGraph that code can see: nodes, edges with data and their orders, attributes."""
    return dict(
        nodes=[(v, _data(d)) for v, d in G.nodes(data=True)],
        edges=[(u, v, _data(d)) for u, v, d in G.edges(data=True)],
        preds=[(v, list(G.predecessors(v))) for v in G.nodes],
        succs=[(v, list(G.successors(v))) for v in G.nodes],
        graph=[(k, v) for k, v in G.graph.items() if k != "schedule"],
    )


def schedule_facts(s):
    mats = s.matrices()
    return dict(
        period=s.period, n=s.n, name=s.name, describe=s.describe(),
        steps=[graph_facts(g) for g in s.steps],
        ins=[[[(u, _bits(w)) for u, w in s.in_weights_at(m, i).items()] for i in range(s.n)]
             for m in range(s.period)],
        outs=[[s.out_at(m, i) for i in range(s.n)] for m in range(s.period)],
        activations=list(s.activations.items()),
        gaps=list(s.gaps().items()),
        fingerprint=json.dumps(s.fingerprint()),
        matrices=[(W.shape, W.indptr.tolist(), W.indices.tolist(), [_bits(x) for x in W.data.tolist()],
                   str(W.dtype), str(W.indices.dtype)) for W in mats],
    )


def derived_facts(s):
    """What the analysis and the workers read of a schedule: through the bulk methods of the array schedule,
    through the per-node ones (as they always were) of the reference."""
    n, P = s.n, s.period
    if isinstance(s, new.Schedule):
        A = s.gap_matrix().tocoo()
        return dict(
            node_steps=[[(list(d.items()), o) for d, o in steps] for steps in s.node_steps()],
            pairs=[s.pairs(m) for m in range(P)],
            degrees=[tuple(x.tolist() for x in s.degrees(m)) for m in range(P)],
            messages=[s.messages(m) for m in range(P)],
            gaps=sorted((int(u), int(v), float(g)) for u, v, g in zip(A.row, A.col, A.data)))
    return dict(
        node_steps=[[(list(s.in_weights_at(m, i).items()), s.out_at(m, i)) for m in range(P)] for i in range(n)],
        pairs=[[(u, v) for u in range(n) for v in s.out_at(m, u) if v != u] for m in range(P)],
        degrees=[([len(s.in_weights_at(m, i)) - (i in s.in_weights_at(m, i)) for i in range(n)],
                  [len(s.out_at(m, i)) for i in range(n)]) for m in range(P)],
        messages=[len(g.edges) - g.number_of_nodes() for g in s.steps],
        gaps=sorted((u, v, float(g)) for (u, v), g in s.gaps().items()))


def outcome(module, call, tmp_path=None):
    """What ``call(module)`` gives: the facts of the union graph and its schedule (and the file ``save``
    writes), or the exception's type and words."""
    try:
        U = call(module)
    except Exception as err:                        # noqa: BLE001 -- any error must be the same one
        return ("error", type(err).__name__, str(err))
    facts = dict(union=graph_facts(U), notes=list(U.graph["notes"]), schedule=schedule_facts(U.graph["schedule"]),
                 derived=derived_facts(U.graph["schedule"]))
    if tmp_path is not None:
        path = tmp_path / f"{module.__name__}.json"
        module.save(U, path)
        facts["file"] = path.read_text()
    return facts


WEIGHTS = [0.5, 1.0, 1, 2, 3, 0.25, 1 / 3, 0.1, 0.7, 0, 0.0, -0.0, 1e-300, 1e-250, 5e-324, 1e300, 1e-200, 7,
           0.3333333333333333, 123456789]


def random_steps(rng, n, weighted, hostile=False):
    steps, flags = [], []
    for _ in range(rng.randint(1, 4)):
        pairs = [(u, v) for u in range(n) for v in range(n) if rng.random() < rng.choice((0.2, 0.5, 0.9))]
        rng.shuffle(pairs)
        w = weighted if weighted is not None else rng.random() < 0.5
        edges = [(u, v, rng.choice(WEIGHTS) if rng.random() < 0.7 else rng.random() * 3) if w else (u, v)
                 for u, v in pairs]
        if hostile and edges and rng.random() < 0.5:
            k = rng.randrange(len(edges))
            e = list(edges[k])
            bad = rng.choice(["dup", "range", "negative", "float-id", "bool-id", "np-id", "big-id", "short",
                              "bool-w", "nan", "inf", "neg-w", "str-w", "big-w", "np-w", "none", "zero-col"])
            if bad == "dup":
                edges.insert(rng.randrange(len(edges) + 1), tuple(e))
            elif bad == "range":
                e[rng.randrange(2)] = n + rng.randrange(3)
            elif bad == "negative":
                e[rng.randrange(2)] = -1
            elif bad == "float-id":
                e[0] = float(e[0]) + rng.choice((0.0, 0.5))
            elif bad == "bool-id":
                e[1] = bool(e[1] % 2)
            elif bad == "np-id":
                e[0] = np.int64(e[0])
            elif bad == "big-id":
                e[0] = 10 ** 30
            elif bad == "short":
                e = e[:rng.choice((1, 2))]
            elif bad == "zero-col":
                edges = [(u, v, 0.0) if v == e[1] else x for x, (u, v, *_) in zip(edges, edges)] if w else edges
                e = list(edges[k])
            elif w:
                e[2] = {"bool-w": True, "nan": math.nan, "inf": math.inf, "neg-w": -0.5, "str-w": "0.5",
                        "big-w": 10 ** 400, "np-w": np.float64(0.5), "none": None}[bad]
            if edges and bad != "dup":
                edges[k] = tuple(e)
        steps.append(edges)
        flags.append(w)
    return steps, flags


def test_the_same_schedules_as_the_digraphs_built_edge_by_edge(tmp_path):
    rng = random.Random(20261202)
    for case in range(400):
        n = rng.randint(1, 9)
        weighted = rng.choice((True, False, None))
        steps, flags = random_steps(rng, n, weighted)
        attrs = {v: {"machine": f"m{v % 2}"} for v in range(n)} if rng.random() < 0.3 else None
        passed = flags if rng.random() < 0.5 else None
        connected = rng.random() < 0.5
        name = rng.choice((None, "s"))

        def call(m):
            return m.from_steps(n, steps, name=name, node_attrs=attrs, source="f.json", connected=connected,
                                weighted=passed)
        a, b = outcome(ref, call, tmp_path), outcome(new, call, tmp_path)
        assert a == b, (case, n, steps)


def test_the_same_errors_and_results_on_malformed_steps():
    rng = random.Random(7)
    errors = 0
    for case in range(600):
        n = rng.randint(1, 7)
        steps, flags = random_steps(rng, n, rng.choice((True, False, None)), hostile=True)
        attrs = rng.choice((None, {0: {"backup_workers": -1}}, {0: {"machine": 3}}, {0: {"machine": "a"}}))

        def call(m):
            return m.from_steps(n, steps, node_attrs=attrs, source="f.json", connected=False)
        a, b = outcome(ref, call), outcome(new, call)
        assert a == b, (case, n, steps)
        errors += isinstance(a, tuple)
    assert 100 < errors < 550                       # (both kinds of outcome were exercised)


def _file(rng, n, hostile):
    steps, _ = random_steps(rng, n, rng.choice((True, False)), hostile=hostile)
    out = []
    for edges in steps:
        edges = [list(e) for e in edges]
        if rng.random() < 0.2:
            edges = [dict(zip(("source", "target", "weight"), e)) for e in edges]
        out.append({"edges": edges} if rng.random() < 0.2 else edges)
    data = {"steps": out}
    if rng.random() < 0.5:
        data["nodes"] = [{"id": v} for v in range(n)]
    if rng.random() < 0.3:
        data["directed"] = False
    if rng.random() < 0.2:
        data["schedule"] = "x"
    return json.loads(json.dumps(data, allow_nan=True, default=lambda x: x.item()))     # (numpy ids: plain)


@pytest.mark.parametrize("hostile", [False, True])
def test_parse_reads_files_as_before(hostile, tmp_path):
    rng = random.Random(11 + hostile)
    for case in range(300):
        data = _file(rng, rng.randint(1, 7), hostile)

        def call(m):
            return m.parse(json.loads(json.dumps(data, allow_nan=True)), "f.json", connected=False)
        a, b = outcome(ref, call, tmp_path), outcome(new, call, tmp_path)
        assert a == b, (case, data)


def test_parse_leaves_the_data_as_it_was():
    """An undirected file's reverse edges go into a copy of each step (the edge checks once built one)."""
    data = {"directed": False, "steps": [[[0, 1], [1, 2], [2, 0]]]}
    new.parse(data, "f.json")
    assert data["steps"] == [[[0, 1], [1, 2], [2, 0]]]


@pytest.mark.parametrize("n", [2, 3, 8, 33, 200])
def test_one_peer_exponential_as_before(n, tmp_path):
    from hopdec.topology.generators import one_peer_exponential
    steps = [[(i, (i + 2 ** m) % n) for i in range(n)] for m in range(max(1, math.ceil(math.log2(n))))]
    a = outcome(ref, lambda m: m.from_steps(n, steps, name=f"one_peer_exponential_{n}"), tmp_path)
    assert a == outcome(new, lambda m: one_peer_exponential(n), tmp_path)
    written = json.loads(a["file"])                 # ... and read back from its file, weights given
    assert outcome(ref, lambda m: m.parse(written, "s.json"), tmp_path) == \
        outcome(new, lambda m: m.parse(json.loads(a["file"]), "s.json"), tmp_path)


def test_an_error_names_the_step_and_the_edge():
    with pytest.raises(TopologyError, match=r"f.json: step 1: duplicate edge 0->1"):
        new.from_steps(3, [[(0, 1), (1, 2), (2, 0)], [(0, 1), (0, 1)]], source="f.json")
    with pytest.raises(TopologyError, match=r"step 0: edge 0->5 refers to a node outside 0..2"):
        new.from_steps(3, [[(0, 5)]])


def _old_table_one(U, max_ig, staleness):
    """Table 1 of a schedule as summarize computed it before: the dense gap_bounds matrices, once per row."""
    from hopdec.topology import schedule_analysis as SA
    s = new.schedule_of(U)
    b = {"standard": SA.gap_bounds(U).max(), "standard+tokens": SA.gap_bounds(U, max_ig=max_ig).max(),
         "backup": math.inf if s.n > 1 else 0.0,
         "backup+tokens": SA.gap_bounds(U, "backup", max_ig=max_ig).max(),
         "skip+tokens": SA.gap_bounds(U, max_ig=max_ig, skipping=True).max(), "notify-ack": None}
    if staleness is not None:
        b["staleness"] = SA.gap_bounds(U, "staleness", staleness=staleness).max()
        b["staleness+tokens"] = SA.gap_bounds(U, "staleness", max_ig=max_ig, staleness=staleness).max()
    from scipy.sparse.csgraph import shortest_path
    D = shortest_path(SA._lengths(U, s, s.activation_gap), method="D", directed=True)   # D[i, j] = dist_g(i -> j)
    from hopdec.topology.analysis import _num
    return dict(gap_bounds={k: _num(v) for k, v in b.items()},
                update_queue_capacity_no_tokens=_num(max(1 + sum(D[i, j] + 1 for j in U.predecessors(i) if j != i)
                                                         for i in range(s.n))),
                activation_gap_max=max(s.gaps().values(), default=1),
                ahead=_outcome(lambda: {i: int(max((D[i, j] for j in U.predecessors(i) if j != i), default=1.0))
                                        for i in U.nodes}))


def _outcome(f):
    try:
        return f()
    except OverflowError as err:            # (int(inf): a worker unreachable from an in-neighbour)
        return type(err).__name__


@pytest.mark.parametrize("block", [None, 3])
def test_table_one_from_the_union_searches_as_from_the_dense_matrices(block, monkeypatch):
    """``topo analyze`` takes a schedule's Table 1 from the union's breadth-first searches, block by block
    (g times the hop distance where every edge has the same activation gap g, Dijkstra on the gaps
    otherwise), where it solved all-pairs shortest paths into n x n arrays four to six times (100 s at
    10,000 nodes): the same figures, on schedules with equal and unequal gaps, split ones and staleness."""
    from hopdec.topology import bounds, schedule_analysis as SA
    from hopdec.topology.generators import one_peer_exponential
    if block:
        monkeypatch.setattr(bounds, "BLOCK_ENTRIES", block)     # a few rows per block: blocks of every size
    rng = random.Random(5)
    cases = [one_peer_exponential(n) for n in (2, 5, 8, 13)]
    for _ in range(25):
        n = rng.randint(1, 14)
        steps = [[(u, (u + rng.choice((1, 2, 3, 5))) % n) for u in range(n) if rng.random() < 0.7]
                 for _ in range(rng.randint(1, 5))]
        cases.append(new.from_steps(n, steps, connected=False))
    for U in cases:
        for max_ig, staleness in ((1, None), (2, 0), (3, 2)):
            want = _old_table_one(U, max_ig, staleness)
            got = SA.summarize(U, max_ig, staleness)
            for key in ("gap_bounds", "update_queue_capacity_no_tokens", "activation_gap_max"):
                assert got[key] == want[key], (key, got[key], want[key])
            assert list(got["gap_bounds"]) == list(want["gap_bounds"])
        assert _outcome(lambda: SA.ahead_bounds(U)) == want["ahead"]
