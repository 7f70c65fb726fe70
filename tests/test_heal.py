"""Surviving dead workers, without MPI: the graph heals and the survivors' cores go on (issue 11).

The in-process scheduler kills workers mid-run the way MPI with fault tolerance does (every message in
flight is lost, the survivors heal the graph and reconfigure from their current iterations); the Hop
invariants are checked at every step, against the healed graph after each heal.
"""

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hopdec import topology as T
from hopdec.hop.config import ProtocolConfig, check_config
from hopdec.hop.invariants import Invariants
from hopdec.hop.worker import node_views
from hopdec.sim.inproc import InProcNetwork
from hopdec.topology.heal import CannotHeal, heal_graph
from hopdec.topology.weights import is_column_stochastic, is_doubly_stochastic, metropolis_weights


# ---- the graph ----------------------------------------------------------------------------------
@st.composite
def graphs_and_failures(draw):
    n = draw(st.integers(3, 9))
    order = draw(st.permutations(range(n)))
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    G.add_edges_from((order[i], order[(i + 1) % n]) for i in range(n))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    G.add_edges_from(draw(st.lists(st.sampled_from(pairs), max_size=2 * n, unique=True)))
    failed = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 2, unique=True))
    return T.with_default_weights(G), failed


@settings(max_examples=200, deadline=None, derandomize=True)
@given(graphs_and_failures())
def test_a_healed_graph_stays_strongly_connected_and_mixes(case):
    G, failed = case
    H, _ = heal_graph(G, failed)
    assert set(H.nodes) == set(G.nodes) - set(failed)
    assert nx.is_strongly_connected(H)
    W = T.mixing_matrix(nx.relabel_nodes(H, {v: i for i, v in enumerate(sorted(H.nodes))}))
    assert is_column_stochastic(W)                    # eq. (1) recomputed: every column sums to 1
    assert H.graph["failed"] == sorted(failed)


def test_bypass_edges_and_weight_rules():
    ring = T.ring(6)
    H, _ = heal_graph(ring, [2])                    # 1 and 3 lose their neighbour 2 and are joined
    assert H.has_edge(1, 3) and H.has_edge(3, 1) and H[1][3]["weight"] == pytest.approx(1 / 3)
    M, _ = heal_graph(metropolis_weights(T.hierarchical((4, 2, 2), "a")), [5])
    W = T.mixing_matrix(nx.relabel_nodes(M, {v: i for i, v in enumerate(sorted(M.nodes))}))
    assert M.graph["weights"] == "metropolis" and is_doubly_stochastic(W)
    # weights a file gave: survivors keep theirs, the bypass carries the flow through the dead node
    G = nx.DiGraph()
    for u, v, w in [(0, 1, .5), (1, 2, .5), (2, 0, .5), (0, 0, .5), (1, 1, .5), (2, 2, .5), (2, 1, .1)]:
        G.add_edge(u, v, weight=w)
    G = T.graph_io.effective_graph(G, "f")
    assert G.graph["weights"] == "file"
    H, notes = heal_graph(G, [1])
    assert H.has_edge(0, 2) and is_column_stochastic(
        T.mixing_matrix(nx.relabel_nodes(H, {0: 0, 2: 1})))


def test_backup_workers_shrink_with_the_in_degree_and_two_workers_are_the_minimum():
    G = T.with_default_weights(nx.DiGraph([(0, 1), (1, 2), (0, 2), (2, 0)]))
    G.nodes[2]["backup_workers"] = 1                  # 2 hears from 0 and 1; the bypass 0->2 exists
    H, notes = heal_graph(G, [1])
    assert T.in_neighbors(H, 2) == [0] and H.nodes[2]["backup_workers"] == 0
    assert any("node 2: backup_workers lowered from 1 to 0" in n for n in notes)
    with pytest.raises(CannotHeal, match="only 1 worker"):
        heal_graph(T.ring(3), [0, 2])


# ---- the cores, in-process ----------------------------------------------------------------------
def run_with_failures(graph, cfg, seed, kills, speeds=None):
    """Run until each ``kills[i] = (iteration, rank)`` is reached by the killed rank, then kill it."""
    inv = Invariants(graph, cfg)

    def check(net):
        alive = net.alive_cores()
        flying = {r: 0 for r in alive}
        for dst, kind, _ in net.in_flight:
            if kind == "update" and dst in flying:
                flying[dst] += 1
        inv.check(alive, flying, net.updates_sent_to)

    views = node_views(graph)
    check_config(cfg, views)
    net = InProcNetwork(views, cfg, seed=seed, speeds=speeds, check=check)
    g = graph
    for at, rank in kills:
        while net.cores[rank].iteration < at and not net.done[rank]:
            if not net.step():
                break
        g = net.fail([rank], g)
        inv.rebase(g, net.alive_cores())
    net.run(until_done=False)
    return net, inv, g


SETTINGS = [ProtocolConfig(iterations=30, max_ig=2),
            ProtocolConfig(iterations=30, max_ig=1),
            ProtocolConfig(iterations=30, max_ig=3, backup_workers=1),
            ProtocolConfig(iterations=30, max_ig=3, staleness=2),
            ProtocolConfig(iterations=30, max_ig=3, staleness=1, backup_workers=1),
            ProtocolConfig(iterations=30, max_ig=3, backup_workers=1, skip_max_jump=4, skip_trigger=2)]


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: f"ig{c.max_ig}-b{c.backup_workers}-s{c.staleness}"
                                                      f"-j{c.skip_max_jump}")
@pytest.mark.parametrize("graph_name", ["ring_based_8", "exponential_8"])
def test_survivors_finish_every_iteration_after_two_failures(cfg, graph_name):
    graph = T.load(f"topologies/{graph_name}.json")
    for seed in range(3):
        speeds = [0.25 if r == 5 else 1.0 for r in range(8)]            # and a straggler
        net, inv, healed = run_with_failures(graph, cfg, seed, kills=[(6, 3), (14, 6)], speeds=speeds)
        survivors = sorted(healed.nodes)
        assert survivors == [0, 1, 2, 4, 5, 7]
        assert all(net.done[r] for r in survivors), net.describe()
        assert [net.cores[r].iteration for r in survivors] == [cfg.iterations - 1] * len(survivors)
        assert inv.checks > 100 and len(net.heals) == 2
        for r in survivors:                           # nothing restarted: iterations only went forward
            iters = [rec["iter"] for rec in net.records[r]]
            assert iters == sorted(set(iters))


def test_a_worker_that_finished_before_a_death_sends_again_what_the_death_lost():
    """Worker 0 has finished every iteration when worker 3 dies; the heal drops every message in flight
    and the survivors wait for each sender's update of the iteration it is at, 0's last among them. As a
    rank does at shutdown (``hop_mpi``: a failure then is healed and the loop driven again), the finished
    worker sends it again; before, the in-process scheduler left it done and the others waited forever."""
    G = T.with_default_weights(nx.DiGraph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]))
    cfg = ProtocolConfig(iterations=10, max_ig=2)
    for seed in range(5):
        net = InProcNetwork(node_views(G), cfg, seed=seed, speeds=[4.0, 1.0, 1.0, 1.0])
        while not net.done[0]:
            net.step()
        net.fail([3], G)
        net.run(until_done=False)
        assert all(net.done[r] and net.cores[r].iteration == 9 for r in (0, 1, 2)), (seed, net.describe())


@st.composite
def runs_with_failures(draw):
    n = draw(st.integers(4, 8))
    order = draw(st.permutations(range(n)))
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    G.add_edges_from((order[i], order[(i + 1) % n]) for i in range(n))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    G.add_edges_from(draw(st.lists(st.sampled_from(pairs), max_size=2 * n, unique=True)))
    G = T.with_default_weights(G)
    backup = draw(st.sampled_from([0, 1]))
    for i in G.nodes:
        G.nodes[i]["backup_workers"] = min(backup, len(T.in_neighbors(G, i)) - 1)
    staleness = draw(st.sampled_from([None, None, 1]))
    skip = draw(st.sampled_from([0, 0, 3]))
    if not staleness and not any(G.nodes[i]["backup_workers"] for i in G.nodes):
        skip = 0                # (skipping needs backup workers or staleness >= 1)
    cfg = ProtocolConfig(iterations=draw(st.integers(8, 24)), max_ig=draw(st.integers(1, 3)),
                         staleness=staleness, skip_max_jump=skip, skip_trigger=1)
    victims = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=min(2, n - 2), unique=True))
    kills = [(draw(st.integers(0, cfg.iterations - 2)), v) for v in victims]
    return G, cfg, sorted(kills), draw(st.integers(0, 2 ** 16))


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(runs_with_failures())
def test_no_deadlock_and_invariants_when_workers_die_on_random_graphs(case):
    G, cfg, kills, seed = case
    note(f"edges {sorted((u, v) for u, v in G.edges if u != v)} kills {kills}")
    n = G.number_of_nodes()
    speeds = [1.0 / (1 + (r * 7919 + seed) % 3) for r in range(n)]
    net, inv, healed = run_with_failures(G, cfg, seed, kills, speeds=speeds)
    for r in healed.nodes:
        assert net.done[r] and net.cores[r].iteration == cfg.iterations - 1, net.describe()


# ---- which MPI errors mean "a peer died" -------------------------------------------------------------
class _Err(Exception):
    def __init__(self, cls):
        self.cls = cls

    def Get_error_class(self):
        return self.cls


class _Comm:
    def __init__(self, failed, revoked=False):
        self.failed, self.revoked = failed, revoked

    def Is_revoked(self):
        return self.revoked

    def Get_failed(self):
        return type("G", (), {"Get_size": lambda _: self.failed})()


def test_a_failure_inside_a_nonblocking_collective_counts_as_a_peer_failure(monkeypatch):
    """Open MPI 5.0 reports a peer's death inside Iallgather & co as MPI_ERR_OTHER: the communicator's
    failed group decides (a summary gathered while a rank died ended the job before this)."""
    from mpi4py import MPI

    import hopdec.transport.mpi as T
    monkeypatch.setattr(T, "FAILED_GROUP_WAIT_S", 0.0)
    assert T.is_peer_failure(_Err(MPI.ERR_PROC_FAILED))
    assert T.is_peer_failure(_Err(MPI.ERR_OTHER), _Comm(failed=1))
    assert not T.is_peer_failure(_Err(MPI.ERR_OTHER), _Comm(failed=0))
    # a schedule aborted by another survivor's revoke ("error 77"), this rank's detector unaware of the death
    # yet: a failure (it was not, and the survivor's job ended on MPI_ERR_OTHER instead of healing)
    assert T.is_peer_failure(_Err(MPI.ERR_OTHER), _Comm(failed=0, revoked=True))
    assert not T.is_peer_failure(_Err(MPI.ERR_OTHER))            # no communicator to ask
    assert not T.is_peer_failure(_Err(MPI.ERR_TRUNCATE), _Comm(failed=1))
    assert not T.is_peer_failure(ValueError("x"))
