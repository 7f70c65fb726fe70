"""Random directed graphs and hostile topology files through the tools, beyond the shipped examples.

Each test here reproduces something the fuzzing of ``hopdec topo analyze``, ``hopdec sim``, ``hopdec train``
and ``HopOptimizer`` with seeded random strongly connected directed graphs (both file formats, with and
without weights, some workers keeping self-weight 0) found broken.
"""

import io

import pytest

from hopdec.hop.receive import SELF, Stale, Standard
from hopdec.hop.update_queue import Entry


def test_a_stale_reduce_with_nothing_fresh_keeps_the_own_parameters_of_a_zero_self_weight_worker():
    """Worker 0 gives its own parameters weight 0 (the file's self-loop) and hears from worker 1 only. With
    staleness 0, worker 1's update of iteration 1 is used in Reduce(0) (it is fresh enough); Recv(1) is then
    satisfied (the newest seen is 1) but nothing fresh is left: Reduce(1) had only the zero-weight own term
    and divided by zero (ZeroDivisionError out of ``hopdec sim --staleness 0``). The local update is always
    available (Hop sec. 3.1): a Reduce with nothing of positive weight keeps the own parameters."""
    p = Stale(0, {0: 0.0, 1: 1.0}, staleness=0)
    p.on_update(Entry(1, 1, "u1"))
    first = p.plan(0)
    assert [(t.sender, t.handle, t.weight) for t in first] == [(0, SELF, 0.0), (1, "u1", 1.0)]
    again = p.plan(1)
    assert again is not None and [(t.sender, t.handle, t.weight) for t in again] == [(0, SELF, 1.0)]


def test_a_healed_standard_reduce_waiting_for_nobody_keeps_the_own_parameters():
    """After a heal a sender's updates older than its iteration are not waited for; a worker with self-weight
    0 whose only sender is such one has nothing of positive weight in Reduce(k) (``hopdec sim
    --fault-tolerance --deaths`` ended in ZeroDivisionError): it keeps its own parameters."""
    p = Standard(0, {0: 0.0, 1: 1.0}, slots=4)
    p.reconfigure({0: 0.0, 1: 1.0}, {1: 5})
    terms = p.plan(3)
    assert terms is not None and [(t.sender, t.handle, t.weight) for t in terms] == [(0, SELF, 1.0)]


def _topo(*args):
    from test_topo_cli import topo
    return topo(*args)


@pytest.mark.parametrize("json_out", [False, True])
def test_analyze_reports_a_schedule_whose_union_is_not_strongly_connected(tmp_path, json_out):
    """A schedule whose union leaves node 2 out: ``topo analyze`` ended in a KeyError traceback (the text
    report wanted the schedule's Table 1, which was computed only for strongly connected unions) and
    ``--json`` gave the union's *static* bounds under the schedule's name. Now both report the schedule's
    bounds, inf where unbounded, as for a static graph that is not strongly connected."""
    import json
    path = tmp_path / "isolated.json"
    path.write_text(json.dumps({"steps": [[[0, 1]], [[1, 0]]], "nodes": [{"id": i} for i in range(3)]}))
    r = _topo("analyze", path, *(["--json"] if json_out else []))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "not strongly connected" in r.stderr
    if json_out:
        b = json.loads(r.stdout)["gap_bounds"]
        assert b["skip+tokens"] == "inf" and b["standard"] == "inf" and b["notify-ack"] is None
    else:
        assert "Hop Table 1 on the time-varying graph" in r.stdout and "M = W_0 W_1)" in r.stdout


@pytest.mark.parametrize("value", ['"false"', "0", "null", "[]"])
def test_node_link_directed_must_be_a_boolean(tmp_path, value):
    """``"directed": "false"`` read as true (Python's bool of a non-empty string): a one-way 3-cycle the user
    meant undirected was trained as directed, silently. Like a schedule file's, it must be true or false."""
    path = tmp_path / "d.json"
    path.write_text('{"directed": %s, "nodes": [{"id": 0}, {"id": 1}, {"id": 2}], "edges": '
                    '[{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 2, "target": 0}]}' % value)
    r = _topo("analyze", path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and str(path) in lines[0], r.stderr
    assert "'directed' must be true or false" in lines[0]


# ---------------------------------------------------------------------------------------------------------
# property: random directed graphs *as topology files* through ``hopdec sim`` (the virtual-time simulator,
# its network and send model), file weights included -- test_protocol_directed.py drives the cores alone on
# eq. (1) weights, which never gives a worker self-weight 0

from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def topology_files(draw):
    """``(text, suffix, n, min in-degree)``: a strongly connected digraph on 3..9 nodes (a random directed
    Hamiltonian cycle plus one-way chords) as an edge list or node-link JSON, without weights or with random
    weights where some workers give their own parameters weight 0."""
    import json
    n = draw(st.integers(3, 9))
    order = draw(st.permutations(range(n)))
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)}
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    for u, v in draw(st.lists(st.sampled_from(pairs), max_size=2 * n, unique=True)):
        if (v, u) not in edges:
            edges.add((u, v))
    rows = sorted(edges)
    if draw(st.booleans()):                      # weights given: every edge and every self-loop
        zero_self = draw(st.sets(st.integers(0, n - 1), max_size=n))
        w = st.sampled_from([0.25, 0.5, 1.0, 3.0, 7.0])
        rows = [(u, v, draw(w)) for u, v in rows] + [(i, i, 0.0 if i in zero_self else draw(w)) for i in range(n)]
    if draw(st.booleans()):
        text = json.dumps({"directed": True, "nodes": [{"id": i} for i in range(n)],
                           "edges": [dict(source=r[0], target=r[1], **({"weight": r[2]} if len(r) > 2 else {}))
                                     for r in rows]})
        suffix = ".json"
    else:
        text, suffix = "".join(" ".join(map(str, r)) + "\n" for r in rows), ".txt"
    indeg = min(sum(1 for u, v in edges if v == i) for i in range(n))
    return text, suffix, n, indeg


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_directed_topology_files_through_the_simulator(tmp_path, data):
    """No deadlock and no traceback, every worker runs every iteration, Hop's invariants (Theorem 2, queue
    capacities, Table 1 gaps, no update lost) hold at every event, and the largest gap the simulator observed
    is within the bound the topology gives for the setting."""
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    text, suffix, n, indeg = data.draw(topology_files(), label="file")
    path = tmp_path / f"g{suffix}"
    path.write_text(text)
    note(text)
    mech = data.draw(st.sampled_from(["plain", "queue-only", "notify-ack", "serial", "backup", "staleness",
                                      "skip", "hybrid", "deaths"]), label="mechanism")
    iters = data.draw(st.integers(8, 30), label="iterations")
    args = ["--topology", path, "--iterations", iters, "--invariants", "on", "--no-progress",
            "--seed", data.draw(st.integers(0, 99), label="seed"),
            "--max-ig", data.draw(st.integers(1, 3), label="max_ig")]
    if mech in ("queue-only", "notify-ack"):
        args = args[:-2] + ["--protocol", mech]
    if mech == "serial":
        args += ["--compute-graph", "serial"]
    backup = mech in ("backup", "hybrid") and indeg >= 2
    if backup:
        args += ["--backup-workers", 1]
    if mech in ("staleness", "hybrid", "skip"):         # (skipping needs backup workers or staleness >= 1)
        least = 0 if mech == "staleness" or backup else 1
        args += ["--staleness", data.draw(st.integers(least, 3), label="s")]
    if mech in ("skip", "hybrid"):
        args += ["--skip", f"max-jump={data.draw(st.integers(2, 5), label='J')},trigger=1"]
    if mech == "deaths" and n >= 4:
        args += ["--fault-tolerance", "--deaths", f"{data.draw(st.integers(0, n - 1), label='dead')}@0.55"]
    straggler = data.draw(st.integers(0, n - 1), label="straggler")
    args += ["--slowdown", f"rank={straggler},factor={data.draw(st.sampled_from([2, 5, 20]), label='factor')}"]
    res = simulate(parse([str(a) for a in args]), out=io.StringIO())
    if "--deaths" not in args:
        assert res["max_gap"] <= res["bound"], (res["max_gap"], res["bound"])
    assert "Traceback" not in res["text"]


@pytest.mark.parametrize("attribute", [False, True])
def test_too_many_backup_workers_name_the_option_or_the_attribute(attribute):
    """On a random directed graph many workers hear from one sender only, so ``--backup-workers 1`` is
    refused; the line said "backup workers 1 at node 0: must be smaller than its 1 in-neighbours" without
    naming the option (or the topology file's ``backup_workers``) nor what would do. ``hopdec train``, ``hopdec
    sim`` and ``HopOptimizer`` all refuse through ``check_config``, so all three say it the same way."""
    import networkx as nx

    from hopdec import topology as T
    from hopdec.errors import ConfigError
    from hopdec.hop.config import ProtocolConfig, check_config
    from hopdec.hop.worker import node_views
    G = T.with_default_weights(nx.DiGraph([(0, 1), (1, 2), (2, 0), (1, 0), (2, 1), (0, 2), (3, 0), (0, 3)]))
    if attribute:
        G.nodes[3]["backup_workers"] = 1
        cfg, text = ProtocolConfig(iterations=5), "backup_workers 1 of node 3 in the topology file: node 3 has 1 "
    else:
        cfg, text = ProtocolConfig(iterations=5, backup_workers=2), "--backup-workers 2: node 1 has 2 "
    with pytest.raises(ConfigError) as err:
        check_config(cfg, node_views(G))
    assert str(err.value).startswith(text) and str(err.value).endswith("none" + ("" if attribute else
                                                                              " on this graph")), err.value


def test_a_death_on_a_directed_cycle_passes_the_invariants_checked_after_the_heal(tmp_path):
    """A directed 4-cycle 0->1->2->3->0 with a 30x straggler at 0; worker 2 dies. Before the death 3 may run
    2 iterations ahead of 1 (the path 1->2->3); the heal joins 1->3 and the bound becomes 1. At the heal the
    gap was exactly 1 and 3 was already past its Recv, so it entered one more iteration (gap 2), then waited
    -- what the protocol allows, but the checker granted the heal's "one more iteration" only when some gap
    already exceeded the healed bound, and ``hopdec sim`` (invariants on by default up to 16 workers) ended
    in an InvariantError traceback."""
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    path = tmp_path / "cycle.txt"
    path.write_text("0 1\n1 2\n2 3\n3 0\n")
    res = simulate(parse(["--topology", str(path), "--iterations", "30", "--fault-tolerance", "--deaths", "2@1.0",
                          "--slowdown", "rank=0,factor=30", "--no-progress", "--invariants", "on"]), out=io.StringIO())
    assert "held at all" in res["text"], res["text"]
    assert [c.iteration for c in res["sim"].cores] == [29, 29, 2, 29]      # every survivor finished


@pytest.mark.parametrize("kind", ["schedule", "edge-list"])
def test_more_workers_than_hopdec_handles_are_refused_before_they_are_built(tmp_path, kind):
    """A 45-byte schedule file ``{"steps": [[[0, 99999999], [99999999, 0]]]}`` made 10^8 nodes (``topo
    analyze`` was still building them after 30 s and 2.9 GB); an edge list of a 100,001-node ring ran for
    minutes in ``topo analyze`` and ``hopdec sim``. The README's limit (100,000 workers in a topology) now
    holds for files too: one line naming the file, at once."""
    import time

    from hopdec.limits import MAX_WORKERS
    if kind == "schedule":
        path = tmp_path / "s.json"
        path.write_text('{"steps": [[[0, 99999999], [99999999, 0]]]}')
        n = 10 ** 8
    else:
        path = tmp_path / "ring.txt"
        n = MAX_WORKERS + 1
        path.write_text("".join(f"{i} {(i + 1) % n}\n" for i in range(n)))
    t0 = time.monotonic()
    r = _topo("analyze", path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"hopdec topo: error: {path}: {n} workers, more than hopdec handles ({MAX_WORKERS}")
    assert time.monotonic() - t0 < 60
