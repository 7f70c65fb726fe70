"""Checkpoint and stop in the Hop core, driven in-process (no MPI): a run resumed at Enter(K) equals an
uninterrupted one, and a stop agreed at max(position) + 1 ends every worker there without a deadlock."""

import random

import numpy as np
import pytest

from hopdec import topology as T
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.invariants import Invariants as HopInvariants
from hopdec.hop.worker import Worker, node_views
from hopdec.sim.inproc import InProcNetwork, ToyBackend


class Invariants(HopInvariants):
    def __call__(self, net):
        flying = [0] * len(net.cores)
        for dst, kind, _ in net.in_flight:
            flying[dst] += kind == "update"
        self.check(net.cores, flying, net.updates_sent_to)


def network(graph, cfg, seed, start=None, states=None, speeds=None):
    net = InProcNetwork(node_views(graph), cfg, seed=seed, speeds=speeds, check=Invariants(graph, cfg),
                        backend_factory=lambda r: ToyBackend(r, seed=0))     # the same data whatever the schedule
    if start is not None:
        for core, backend, x in zip(net.cores, net.backends, states):
            core.resume_at(start)
            backend.x = x.copy()
    return net


def params(net):
    return [b.x.copy() for b in net.backends]


# the settings whose result does not depend on timing (standard Reduce: every update of iteration k)
EXACT = [
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=2),
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=1),
    ProtocolConfig(iterations=20, protocol="queue-only"),
    ProtocolConfig(iterations=20, protocol="notify-ack"),
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=3, compute_graph="serial"),
]
ALL = EXACT + [
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=3, backup_workers=1),
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=3, staleness=2),
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=3, staleness=1, backup_workers=1),
    ProtocolConfig(iterations=20, protocol="tokens", max_ig=3, backup_workers=1, skip_max_jump=3,
                   skip_trigger=2),
]


def ids(c):
    return f"{c.protocol}-ig{c.max_ig}-b{c.backup_workers}-s{c.staleness}-j{c.skip_max_jump}-{c.compute_graph}"


@pytest.mark.parametrize("cfg", EXACT, ids=ids)
@pytest.mark.parametrize("graph_name", ["ring_based_8", "exponential_8"])
def test_a_run_resumed_at_enter_k_equals_the_uninterrupted_run(cfg, graph_name):
    graph = T.load(f"topologies/{graph_name}.json")
    full = network(graph, cfg, seed=1).run()
    k = 7
    first = network(graph, ProtocolConfig(**{**cfg.__dict__, "iterations": k}), seed=2).run()
    resumed = network(graph, cfg, seed=3, start=k, states=params(first)).run()   # another interleaving
    for a, b in zip(params(full), params(resumed)):
        assert np.array_equal(a, b)
    for recs in resumed.records:
        assert [r["iter"] for r in recs] == list(range(k, cfg.iterations))
    assert resumed.iterations() == [cfg.iterations - 1] * graph.number_of_nodes()


@pytest.mark.parametrize("cfg", ALL, ids=ids)
def test_a_stop_agreed_at_the_largest_position_plus_one_ends_every_worker_there(cfg):
    """The ranks' stop agreement, in-process: all workers freeze at a random step, the stop is max over
    their positions + 1, every worker finishes up to it and no further; invariants hold throughout."""
    graph = T.load("topologies/ring_based_8.json")
    n = graph.number_of_nodes()
    for seed in range(3):
        rng = random.Random(seed)
        slow = rng.randrange(n)
        net = network(graph, cfg, seed=seed, speeds=[0.3 if r == slow else 1.0 for r in range(n)])
        for _ in range(rng.randrange(200, 1200)):
            if not net.step():
                break
        stop = max(c.position for c in net.cores) + 1
        for c in net.cores:
            c.stop_at(stop)
        net.run()
        want = min(stop, cfg.iterations) - 1
        assert all(recs[-1]["iter"] == want for recs in net.records)
        if cfg in EXACT and stop < cfg.iterations:
            resumed = network(graph, cfg, seed=seed + 10, start=stop, states=params(net)).run()
            full = network(graph, cfg, seed=seed + 20).run()
            for a, b in zip(params(full), params(resumed)):
                assert np.array_equal(a, b)


def test_stop_before_any_worker_started_runs_nothing():
    graph = T.ring(4)
    cfg = ProtocolConfig(iterations=10)
    net = network(graph, cfg, seed=0)
    stop = max(c.position for c in net.cores) + 1
    assert stop == 0
    for c in net.cores:
        c.stop_at(stop)
    net.run()
    assert all(not recs for recs in net.records)


def test_a_stop_that_comes_while_a_worker_waits_for_tokens_holds_when_they_arrive():
    """A worker waiting for the tokens of iteration k + 1 is told stop_at(k + 1) (every other worker is at
    k or below); the tokens then arrive before it acts again. It must end after iteration k, not take them
    and enter k + 1 (it did when the tokens were there by the time it looked again)."""
    from hopdec.core import Finished, Wait
    views = node_views(T.ring_based(2))
    w = Worker(views[0], ProtocolConfig(iterations=10, max_ig=1))
    for _ in range(50):
        a = w.next_action()
        if type(a) is Wait and a.what.startswith("updates"):
            w.on_update(1, int(a.what.split()[-1]), 0)
        elif type(a) is Wait:
            break
    assert a.what == "tokens" and w.position == 1
    w.stop_at(2)
    w.on_grant(1, 3)                    # worker 1 entered iteration 2's predecessor: a token is there now
    rest = [w.next_action() for _ in range(2)]
    assert rest == [Finished(), Finished()] and w.position == 1


def test_stop_at_may_not_cut_below_where_a_worker_already_is():
    graph = T.ring(3)
    net = network(graph, ProtocolConfig(iterations=10), seed=0)
    for _ in range(400):
        net.step()
    c = max(net.cores, key=lambda c: c.position)
    with pytest.raises(ValueError):
        c.stop_at(c.position)


def test_a_jump_never_skips_a_checkpoint_iteration():
    """Iteration skipping with --checkpoint-every 5: the straggler jumps, yet every worker enters every
    multiple of 5 (where the checkpoints are)."""
    graph = T.load("topologies/ring_based_8.json")
    cfg = ProtocolConfig(iterations=60, max_ig=3, backup_workers=1, skip_max_jump=3, skip_trigger=2,
                         checkpoint_every=5)
    net = network(graph, cfg, seed=5, speeds=[0.25] + [1] * 7).run()
    assert net.cores[0].jumps, "the 4x straggler never jumped"
    for recs in net.records:
        assert set(range(0, 60, 5)) <= {r["iter"] for r in recs}


def test_resume_at_sets_the_protocol_position_of_enter_k():
    """Theorem 2 at Enter(K) for every worker: issued = K + max_ig, taken = K, granted = K + max_ig."""
    views = node_views(T.ring(4))
    cfg = ProtocolConfig(iterations=30, max_ig=3)
    w = Worker(views[1], cfg)
    w.resume_at(12)
    assert w.iteration == 12 and w.position == 11
    assert set(w.ledger.issued.values()) == {15} and set(w.ledger.granted.values()) == {15}
    assert set(w.ledger.taken.values()) == {12}
    a = Worker(views[1], ProtocolConfig(iterations=30, protocol="notify-ack"))
    a.resume_at(12)
    assert a.acks.may_send(12) and not a.acks.may_send(13)
    with pytest.raises(RuntimeError):
        w.resume_at(13)
    with pytest.raises(ValueError):
        Worker(views[1], cfg).resume_at(30)
