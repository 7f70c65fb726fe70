"""The Hop core on random strongly connected directed graphs: no deadlock, invariants at every step.

Hypothesis draws the graph (including graphs where every node's in- and out-neighbours are disjoint),
the protocol and every mechanism setting (backup workers, bounded staleness, iteration skipping), and
the workers' speeds (a straggler, random per-iteration slowdowns); the in-process scheduler then runs
the real cores with messages reordered, checking Hop's invariants after every step.
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


@st.composite
def strong_digraphs(draw):
    """A strongly connected digraph on 3..7 nodes: a random directed Hamiltonian cycle plus random chords;
    ``oriented`` graphs never hold both u->v and v->u, so in- and out-neighbours are disjoint everywhere."""
    n = draw(st.integers(3, 7))
    order = draw(st.permutations(range(n)))
    oriented = draw(st.booleans())
    G = nx.DiGraph()
    G.add_nodes_from(range(n))
    G.add_edges_from((order[i], order[(i + 1) % n]) for i in range(n))
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    for u, v in draw(st.lists(st.sampled_from(pairs), max_size=3 * n, unique=True)):
        if not (oriented and G.has_edge(v, u)):
            G.add_edge(u, v)
    return T.with_default_weights(G)


@st.composite
def configs(draw, graph):
    """A protocol and its mechanisms. Backup workers are set per node (the topology attribute), as many
    as each node's in-degree allows, so sparse directed graphs get them too."""
    protocol = draw(st.sampled_from(["tokens", "tokens", "tokens", "queue-only", "notify-ack"]))
    iterations = draw(st.integers(6, 30))
    if protocol != "tokens":
        return ProtocolConfig(iterations=iterations, protocol=protocol,
                              compute_graph=draw(st.sampled_from(["parallel", "serial"])))
    backup = draw(st.sampled_from([0, 1, 1, 2]))
    for i in graph.nodes:
        graph.nodes[i]["backup_workers"] = min(backup, len(T.in_neighbors(graph, i)) - 1)
    staleness = draw(st.sampled_from([None, None, 0, 1, 3]))
    skip = draw(st.sampled_from([(0, 2), (2, 1), (3, 2), (20, 1), (20, 1), (20, 2)]))
    if not staleness and not any(graph.nodes[i]["backup_workers"] for i in graph.nodes):
        skip = (0, 2)           # (skipping needs backup workers or staleness >= 1)
    return ProtocolConfig(iterations=iterations, protocol="tokens", max_ig=draw(st.integers(1, 3)),
                          compute_graph=draw(st.sampled_from(["parallel", "serial"])),
                          staleness=staleness, skip_max_jump=skip[0], skip_trigger=skip[1])


def run_checked(graph, cfg, seed, speeds, carry_grants=False):
    inv = Invariants(graph, cfg)

    def check(net):
        flying = [0] * len(net.cores)
        for dst, kind, _ in net.in_flight:
            flying[dst] += kind == "update"
        inv.check(net.cores, flying, net.updates_sent_to)

    views = node_views(graph)
    check_config(cfg, views)
    net = InProcNetwork(views, cfg, seed=seed, speeds=speeds, check=check, carry_grants=carry_grants)
    net.run()                                   # raises Deadlock unless every worker finished
    assert net.iterations() == [cfg.iterations - 1] * graph.number_of_nodes()
    return net, inv


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_no_deadlock_and_invariants_on_random_directed_graphs(data):
    graph = data.draw(strong_digraphs(), label="graph")
    cfg = data.draw(configs(graph), label="cfg")
    note(f"edges {sorted((u, v) for u, v in graph.edges if u != v)}, backup per node "
         f"{[graph.nodes[i].get('backup_workers') for i in sorted(graph.nodes)]}")
    n = graph.number_of_nodes()
    straggler = data.draw(st.integers(0, n - 1), label="straggler")
    factor = data.draw(st.sampled_from([1.0, 4.0, 20.0, 20.0]), label="straggler factor")
    seed = data.draw(st.integers(0, 2 ** 16), label="seed")

    def speed(rank, iteration):                  # Hop sec. 7.3: a straggler and 1/n random 6x slowdowns
        draw = np.random.default_rng([seed, rank, iteration]).random()
        return (1.0 / factor if rank == straggler else 1.0) / (6.0 if draw < 1.0 / n else 1.0)
    # odd seeds carry grants in the updates as the MPI transport does: on a directed graph the grants to
    # in-neighbours that are not out-neighbours still go as messages of their own
    net, _ = run_checked(graph, cfg, seed, speed, carry_grants=seed % 2 == 1)
    for c in net.cores:                          # a jump never goes past the run or backwards
        assert all(frm < to <= cfg.iterations - 1 for frm, to in c.jumps)


# The reproductions found before the fix: the jumper sat in Recv(target - 1) while its in-neighbours,
# which are not its out-neighbours, waited for tokens it only issues on entering the target.
EXPONENTIAL_7 = T.exponential(7)
FOUND_6 = T.with_default_weights(nx.DiGraph([(0, 2), (1, 0), (1, 4), (1, 5), (2, 4), (3, 0), (3, 1),
                                             (4, 1), (4, 3), (4, 5), (5, 2), (5, 3)]))


@pytest.mark.parametrize("graph,backup", [(EXPONENTIAL_7, 2), (FOUND_6, 1)], ids=["exponential7", "found6"])
@pytest.mark.parametrize("seed", range(6))
def test_a_straggler_jumping_on_a_directed_graph_does_not_deadlock(graph, backup, seed):
    n = graph.number_of_nodes()
    cfg = ProtocolConfig(iterations=40, max_ig=2, backup_workers=backup, skip_max_jump=20, skip_trigger=1)
    speeds = [1 / 20 if r == seed % n else 1.0 for r in range(n)]
    net, _ = run_checked(graph, cfg, seed, speeds)
    assert net.cores[seed % n].jumps, "the 20x straggler never jumped"
