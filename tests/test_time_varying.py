"""Time-varying topologies (schedules): the file format, the analysis, and the Hop core running them.

The core runs in-process on random schedules over random strongly connected digraphs with every mechanism
(hypothesis), checking after every step the invariants on the union graph (Theorem 2 on every union edge,
queue capacities, no update lost) and Table 1's bound with activation gaps.
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hopdec import topology as T
from hopdec.errors import ConfigError, TopologyError
from hopdec.hop.config import ProtocolConfig, check_config, gap_bound
from hopdec.hop.worker import node_views
from hopdec.sim.inproc import InProcNetwork, ToyBackend
from hopdec.topology.schedule import from_steps, schedule_of
from hopdec.topology.schedule_analysis import gap_bounds, mixing

from test_protocol import Invariants
from test_protocol_directed import strong_digraphs


def run_checked(graph, cfg, seed=0, speeds=None, stall=None, until_done=True, backend=None, carry=False):
    inv = Invariants(graph, cfg)                   # checked after every step of the scheduler
    views = node_views(graph)
    check_config(cfg, views)
    net = InProcNetwork(views, cfg, seed=seed, speeds=speeds, check=inv, stall=stall, backend_factory=backend,
                        carry_grants=carry)
    net.run(until_done=until_done)
    return net, inv


# ---- the schedule and its file -----------------------------------------------------------------

def test_one_peer_exponential_sends_to_one_peer_per_step_as_bluefog():
    s = schedule_of(T.GENERATORS["one-peer-exponential"](8))
    assert s.period == 3
    for k in range(7):
        for i in range(8):
            assert s.out_at(k, i) == ((i + 2 ** (k % 3)) % 8,)
            assert s.in_weights_at(k, i) == {i: 0.5, (i - 2 ** (k % 3)) % 8: 0.5}


def test_a_schedule_file_round_trips_and_hand_written_forms_agree(tmp_path):
    U = T.GENERATORS["one-peer-exponential"](6)
    T.save(U, tmp_path / "s.json")
    again = T.load(tmp_path / "s.json")
    assert schedule_of(again).fingerprint() == schedule_of(U).fingerprint()
    # what a user writes: pairs, node-link style edges, an undirected step, explicit weights
    (tmp_path / "h.json").write_text(json.dumps({
        "schedule": "hand", "steps": [[[0, 1], [1, 2], [2, 0]],
                                      {"edges": [{"source": 0, "target": 2, "weight": 1},
                                                 {"source": 2, "target": 2, "weight": 3}]}]}))
    H = T.load(tmp_path / "h.json")
    s = schedule_of(H)
    assert s.period == 2 and s.out_at(1, 0) == (2,)
    assert s.in_weights_at(1, 2) == {0: 0.25, 2: 0.75}          # renormalised as the static rule does
    assert s.in_weights_at(1, 1) == {1: 1.0}                       # nobody sends to 1 at step 1
    assert any("do not sum to 1" in n for n in H.graph["notes"])


@pytest.mark.parametrize("data,msg", [
    ({"steps": []}, "non-empty list"),
    ({"steps": [[[0, 1]]]}, "not strongly connected"),
    ({"steps": [[[0, 1], [0, 1]], [[1, 0]]]}, "step 0: duplicate edge 0->1"),
    ({"steps": [[[0, 1, 0.5], [1, 0]]]}, "some edges have weights"),
    ({"steps": [[[0, 1, -1], [1, 0, 1]]]}, "weights are finite numbers >= 0"),
    ({"steps": [[[0, "x"]]]}, "node ids must be the ranks"),
    ({"steps": [[{"source": 0, "target": 1, "bandwidth": 3}]]}, "key 'bandwidth'"),
    ({"steps": [[[0, 1], [1, 0]]], "period": 3}, "'period' is 3"),
    ({"steps": [[[0, 1], [1, 0]]], "nodes": [{"id": 0}, {"id": 2}]}, "exactly 0..1"),
    ({"steps": [[[0, 5], [1, 0]]], "nodes": [{"id": 0}, {"id": 1}]}, "outside 0..1"),
    ({"steps": [[[0, 1], [1, 0]]], "colour": "red"}, "unknown key 'colour'"),
])
def test_bad_schedule_files_get_one_line_naming_the_file(tmp_path, data, msg):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match=msg) as err:
        T.load(p)
    assert str(err.value).startswith(str(p)) and "\n" not in str(err.value)


# ---- analysis ----------------------------------------------------------------------------------

def test_one_peer_exponential_averages_exactly_over_a_period_for_powers_of_two():
    for n in (4, 8, 16):
        m = mixing(schedule_of(T.GENERATORS["one-peer-exponential"](n)))
        assert m["period_gap"] == pytest.approx(1.0) and m["per_step_gap"] == pytest.approx(1.0)
        assert m["steps_doubly_stochastic"]
    m = mixing(schedule_of(T.GENERATORS["one-peer-exponential"](6)))
    assert 0 < m["per_step_gap"] < m["period_gap"] < 1


def test_a_one_step_schedule_has_the_static_graphs_bounds():
    G = T.ring_based(8)
    U = from_steps(8, [[(u, v) for u, v in G.edges if u != v]])
    for setting, kw in [("standard", {}), ("standard", dict(max_ig=2)), ("backup", dict(max_ig=3)),
                        ("staleness", dict(staleness=2, max_ig=2))]:
        assert np.array_equal(gap_bounds(U, setting, **kw), T.gap_bounds(G, setting, **kw))


def test_the_update_side_counts_activation_gaps_not_hops():
    """Queue-only on a one-peer graph with a stuck worker: its out-neighbour runs ahead by the activation gap
    of their edge (3 iterations: the edge is used once a period), which the union graph's Theorem 1 bound (1)
    would call impossible; the time-varying bound allows exactly it."""
    U = T.GENERATORS["one-peer-exponential"](8)
    cfg = ProtocolConfig(iterations=40, protocol="queue-only")
    net, inv = run_checked(U, cfg, stall={0: 0}, until_done=False)
    it = net.iterations()
    assert it[0] == 0
    union_bound = T.gap_bounds(U)[:, 0]                       # Theorem 1 on the union: hops
    assert max(it[r] - union_bound[r] for r in range(8)) > 0
    assert all(it[r] <= inv.bounds[r, 0] for r in range(8))
    assert it[1] == 3                    # 0 -> 1 is active at steps 0 (= iteration 3): Recv(3) waits for 0


def test_topo_analyze_and_compare_report_the_schedule(tmp_path, capsys):
    from hopdec.cli.topo import main
    assert main(["generate", "one-peer-exponential", "-n", "8", "-o", str(tmp_path / "s.json")]) == 0
    assert "period 3" in capsys.readouterr().out
    assert main(["analyze", str(tmp_path / "s.json"), "--staleness", "1"]) == 0
    out = capsys.readouterr().out
    assert "spectral gap, period  1.0000" in out and "messages / iteration  8" in out
    assert "staleness + token queues" in out
    assert main(["analyze", str(tmp_path / "s.json"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["period"] == 3 and s["spectral_gap"] == 1.0 and s["gap_bounds"]["standard+tokens"] == 4
    assert main(["compare", str(tmp_path / "s.json"), "topologies/exponential_8.json"]) == 0
    out = capsys.readouterr().out
    assert "per step" in out


def test_settings_a_schedule_cannot_run_are_refused_with_the_option():
    views = node_views(T.GENERATORS["one-peer-exponential"](8))
    with pytest.raises(ConfigError, match="notify-ack"):
        check_config(ProtocolConfig(iterations=5, protocol="notify-ack"), views)
    with pytest.raises(ConfigError, match="--backup-workers 1: .*node 0 has 1 at some step.*one in-neighbour per step"):
        check_config(ProtocolConfig(iterations=5, backup_workers=1), views)


# ---- the core on schedules -------------------------------------------------------------------

def test_a_one_step_schedule_runs_exactly_as_the_static_graph():
    G = T.exponential(7)
    U = from_steps(7, [[(u, v) for u, v in G.edges if u != v]])
    cfg = ProtocolConfig(iterations=20, max_ig=2, backup_workers=1, skip_max_jump=3, skip_trigger=1)
    speeds = [0.2] + [1.0] * 6
    a, _ = run_checked(G, cfg, seed=3, speeds=speeds)
    b, _ = run_checked(U, cfg, seed=3, speeds=speeds)
    strip = lambda recs: [{k: v for k, v in r.items() if k != "time"} for r in recs]  # noqa: E731
    assert [strip(r) for r in a.records] == [strip(r) for r in b.records]


def test_pure_gossip_on_one_peer_exponential_reaches_the_exact_mean_in_one_period():
    U = T.GENERATORS["one-peer-exponential"](8)
    cfg = ProtocolConfig(iterations=4, max_ig=1)
    backends = {}

    def make(r):
        b = backends[r] = ToyBackend(r, dim=3, lr=0.0)
        b.x = b.target.copy()                      # start apart; lr 0: only the averaging moves them
        return b
    net, _ = run_checked(U, cfg, seed=1, backend=make)
    mean = np.mean([backends[r].target for r in range(8)], axis=0)
    for r in range(8):                             # Reduce(0), (1), (2): one period; (3) keeps the mean
        assert np.allclose(backends[r].x, mean)
        sent = [rec["sent_to"] for rec in net.records[r]]
        assert sent == [[(r + 2 ** (k % 3)) % 8] for k in range(4)]
        for rec in net.records[r]:                 # each Reduce used the step's one sender, weight 1/2
            (terms,) = rec["reduced"]
            k = rec["iter"]
            assert sorted(t[0] for t in terms) == sorted([r, (r - 2 ** (k % 3)) % 8])
            assert [t[2] for t in terms] == [0.5, 0.5]


@st.composite
def schedules(draw):
    """A random schedule: a strongly connected union digraph whose every edge is used at a random non-empty
    set of the period's 1..4 steps (so steps are usually not connected, and some nodes idle)."""
    G = draw(strong_digraphs())
    n = G.number_of_nodes()
    period = draw(st.integers(1, 4))
    steps = [[] for _ in range(period)]
    for u, v in sorted((u, v) for u, v in G.edges if u != v):
        for m in draw(st.sets(st.integers(0, period - 1), min_size=1)):
            steps[m].append((u, v))
    return from_steps(n, steps, name="random")


@st.composite
def configs(draw, U):
    protocol = draw(st.sampled_from(["tokens", "tokens", "tokens", "queue-only"]))
    iterations = draw(st.integers(6, 30))
    if protocol != "tokens":
        return ProtocolConfig(iterations=iterations, protocol=protocol,
                              compute_graph=draw(st.sampled_from(["parallel", "serial"])))
    s = schedule_of(U)
    backup = draw(st.sampled_from([0, 0, 1, 2]))
    for i in U.nodes:               # as many backup workers as every step's in-degree allows
        degs = [len(s.in_weights_at(m, i)) - 1 for m in range(s.period)]
        U.nodes[i]["backup_workers"] = max(0, min(backup, min([d for d in degs if d] or [1]) - 1))
    skip = draw(st.sampled_from([(0, 2), (2, 1), (3, 2), (20, 1)]))
    max_ig, graph = draw(st.integers(1, 3)), draw(st.sampled_from(["parallel", "serial"]))
    staleness = draw(st.sampled_from([None, None, 0, 1, 3]))
    if not staleness and not any(U.nodes[i]["backup_workers"] for i in U.nodes) and \
            all(s.out_at(m, i) for i in U.nodes for m in range(s.period)):
        skip = (0, 2)       # (refused: every worker sends at every step, so skipping alone never jumps)
    return ProtocolConfig(iterations=iterations, max_ig=max_ig, compute_graph=graph, staleness=staleness,
                          skip_max_jump=skip[0], skip_trigger=skip[1])


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_no_deadlock_and_invariants_on_random_schedules(data):
    U = data.draw(schedules(), label="schedule")
    cfg = data.draw(configs(U), label="cfg")
    s = schedule_of(U)
    note(f"steps {[sorted((u, v) for u, v in g.edges if u != v) for g in s.steps]}")
    n = U.number_of_nodes()
    straggler = data.draw(st.integers(0, n - 1), label="straggler")
    factor = data.draw(st.sampled_from([1.0, 4.0, 20.0]), label="straggler factor")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")

    def speed(rank, iteration):
        draw = np.random.default_rng([seed, rank, iteration]).random()
        return (1.0 / factor if rank == straggler else 1.0) / (6.0 if draw < 1.0 / n else 1.0)
    net, inv = run_checked(U, cfg, seed, speed, carry=seed % 2 == 1)
    assert net.iterations() == [cfg.iterations - 1] * n
    assert inv.max_gap.max() <= gap_bound(U, cfg)
    for c, recs in zip(net.cores, net.records):
        assert all(frm < to <= cfg.iterations - 1 for frm, to in c.jumps)
        for rec in recs:                           # updates went only along the step's edges
            k = rec["iter"]
            assert set(rec.get("sent_to", [])) <= set(s.out_at(k, c.rank))
            for terms in rec.get("reduced", []):
                assert all(t[0] == c.rank or c.rank in s.out_at(t[1], t[0]) for t in terms)


# Found by a random search: worker 1 jumps 3 -> 6 past iteration 4, the only step of its in-edge 5 -> 1 in
# that window, and runs 4 ahead of worker 0, which the update side's bound (3 on this schedule) would forbid
# had 1 waited at every step. So with iteration skipping Table 1 on a schedule is the token bound alone.
SKIP_FOUND = [[(0, 5), (2, 0), (5, 4)], [(0, 5), (1, 3), (2, 0), (3, 4), (5, 1), (5, 4)],
              [(0, 5), (1, 3), (4, 2), (5, 4)], [(0, 5), (2, 0), (4, 2), (5, 1), (5, 4)],
              [(0, 5), (2, 0), (3, 4), (5, 1), (5, 4)]]


def test_a_jump_on_a_schedule_can_leave_the_update_sides_bound_but_not_the_token_bound():
    U = from_steps(6, SKIP_FOUND)
    cfg = ProtocolConfig(iterations=40, max_ig=3, skip_max_jump=3, skip_trigger=1)
    net, inv = run_checked(U, cfg, seed=216, speeds=[0.05] + [1.0] * 5)      # checks the token bound
    without_skipping = gap_bounds(U, "standard", max_ig=3)
    assert net.cores[1].jumps
    assert (inv.max_gap > without_skipping).any()
    assert (inv.max_gap <= inv.bounds).all()


def test_a_run_on_a_schedule_resumed_mid_period_equals_the_uninterrupted_run():
    """The position K fixes the schedule's phase (K mod P): resuming at Enter(7), step 1 of 3, continues
    exactly."""
    U = T.GENERATORS["one-peer-exponential"](8)
    cfg = ProtocolConfig(iterations=16, max_ig=2)

    def network(cfg, seed, start=None, states=None):
        net = InProcNetwork(node_views(U), cfg, seed=seed, backend_factory=lambda r: ToyBackend(r, seed=0))
        if start is not None:
            for core, backend, x in zip(net.cores, net.backends, states):
                core.resume_at(start)
                backend.x = x.copy()
        return net
    full = network(cfg, 1).run()
    first = network(ProtocolConfig(iterations=7, max_ig=2), 2).run()
    resumed = network(cfg, 3, start=7, states=[b.x for b in first.backends]).run()
    for a, b in zip(full.backends, resumed.backends):
        assert np.array_equal(a.x, b.x)
    assert resumed.records[0][0]["sent_to"] == [2]                     # iteration 7: step 1, i -> i + 2
