"""The protocol core driven in-process: invariants checked after every scheduling step."""

import numpy as np
import pytest

from hopdec import topology as T
from hopdec.hop.actions import Reduce
from hopdec.hop.config import ProtocolConfig, check_config
from hopdec.hop.worker import Worker, node_views
from hopdec.hop.update_queue import Entry, IterationSlots, NewestPerSender, QueueOverflow
from hopdec.hop.token_queue import TokenLedger
from hopdec.hop.invariants import Invariants as HopInvariants
from hopdec.sim.inproc import Deadlock, InProcNetwork


class Invariants(HopInvariants):
    """The library's invariant checker, called by the in-process scheduler after every step."""

    def __call__(self, net):
        flying = [0] * len(net.cores)
        for dst, kind, _ in net.in_flight:
            flying[dst] += kind == "update"
        self.check(net.cores, flying, net.updates_sent_to)


def run(graph, cfg, seed, speeds=None, until_done=True, stall=None, carry_grants=False):
    inv = Invariants(graph, cfg)
    net = InProcNetwork(node_views(graph), cfg, seed=seed, speeds=speeds, check=inv, stall=stall,
                        carry_grants=carry_grants)
    net.run(until_done=until_done)
    return net, inv


def random_slowdown(n, seed, factor=6.0):
    """Hop sec. 7.3.1: every worker, every iteration, factor x slower with probability 1/n."""
    def speed(rank, iteration):
        draw = np.random.default_rng([seed, rank, iteration]).random()
        return 1.0 / factor if draw < 1.0 / n else 1.0
    return speed


def straggler(n, rank=0, factor=4.0):
    """Hop sec. 7.3.5: one worker deterministically factor x slower."""
    return [1.0 / factor if r == rank else 1.0 for r in range(n)]


SETTINGS = [
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=2),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=1),
    ProtocolConfig(iterations=25, protocol="queue-only"),
    ProtocolConfig(iterations=25, protocol="notify-ack"),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=3, backup_workers=1),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=3, staleness=2),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=3, staleness=1, backup_workers=1),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=3, backup_workers=1,
                   skip_max_jump=3, skip_trigger=2),
    ProtocolConfig(iterations=25, protocol="tokens", max_ig=2, compute_graph="serial"),
]


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda c: f"{c.protocol}-ig{c.max_ig}-b{c.backup_workers}"
                         f"-s{c.staleness}-j{c.skip_max_jump}-{c.compute_graph}")
@pytest.mark.parametrize("graph_name", ["ring_based_8", "exponential_8"])
@pytest.mark.parametrize("slowdown", [random_slowdown, straggler])
def test_invariants_hold_at_every_step(cfg, graph_name, slowdown):
    graph = T.load(f"topologies/{graph_name}.json")
    for seed in range(2):
        speeds = slowdown(graph.number_of_nodes(), seed) if slowdown is random_slowdown else \
            slowdown(graph.number_of_nodes(), rank=seed)
        # the second seed carries token grants in the updates, as the MPI transport does
        net, inv = run(graph, cfg, seed, speeds=speeds, carry_grants=seed == 1)
        assert all(net.done)
        assert net.iterations() == [cfg.iterations - 1] * graph.number_of_nodes()
        assert inv.checks > 100
        check_records(net, cfg)
        # (on the serial graph compute comes between the grant and the send: nothing rides)
        assert (net.grants_carried > 0) == (seed == 1 and cfg.protocol == "tokens"
                                            and cfg.compute_graph == "parallel")


def check_records(net, cfg):
    """No update used twice, none used when too stale, every iteration reduced once."""
    for rank, recs in enumerate(net.records):
        seen = set()
        iters = [r["iter"] for r in recs]
        assert iters == sorted(iters) and len(set(iters)) == len(iters)
        for r in recs:
            for terms in r.get("reduced", []):
                weights = [w for _, _, w in terms]
                assert abs(sum(weights) - 1) < 1e-5
                k = next(it for s, it, _ in terms if s == rank)   # the self term: iteration reduced
                for sender, it, _ in (t for t in terms if t[0] != rank):
                    assert (sender, it) not in seen, "an update was used twice"
                    seen.add((sender, it))
                    if cfg.staleness is None:
                        assert it == k
                    else:
                        assert it >= k - cfg.staleness
        # the freed set only grows: every payload was freed exactly once (InProcIO asserts on repeats)
        assert not net.ios[rank].held or cfg.backup_workers or cfg.staleness is not None


def test_complete_graph_equals_synchronous_averaging():
    graph = T.complete(5)
    cfg = ProtocolConfig(iterations=15, max_ig=2)
    net, _ = run(graph, cfg, seed=4, speeds=[1, 0.3, 1, 0.5, 1])
    # reference: every iteration, average all parameters, then each worker applies its own gradient
    ref = [b.__class__(r, seed=4) for r, b in enumerate(net.backends)]
    for _ in range(cfg.iterations):
        for b in ref:
            b.compute(0)
        mean = np.mean([b.x for b in ref], axis=0)
        for b in ref:
            b.x = mean.copy()
            b.apply(0)
    for got, want in zip(net.backends, ref):
        np.testing.assert_allclose(got.x, want.x, atol=1e-12)


def test_tokens_bound_a_fast_worker_next_to_a_stuck_one():
    graph = T.ring(6)
    cfg = ProtocolConfig(iterations=50, max_ig=2)
    net, inv = run(graph, cfg, seed=1, stall={0: 0}, until_done=False)
    it = net.iterations()
    assert it[0] == 0
    # each worker ends exactly at the bound the analysis gives against the stuck worker
    assert it == [int(min(b, 49)) for b in inv.bounds[:, 0]]


def test_backup_workers_keep_neighbours_of_a_stuck_worker_going_until_the_token_bound():
    graph = T.ring_based(8)
    cfg = ProtocolConfig(iterations=60, max_ig=3, backup_workers=1)
    net, inv = run(graph, cfg, seed=2, stall={0: 0}, until_done=False)
    it = net.iterations()
    bound = inv.bounds[:, 0]
    assert it[0] == 0
    for r in graph.successors(0):
        if r != 0:
            assert it[r] == bound[r] == cfg.max_ig    # neighbours run until their tokens from 0 are gone
    assert max(it) > cfg.max_ig                       # and others further, which standard would not allow
    # nothing was lost: Invariants checked after every step that each update sent is in flight, held,
    # reduced or dropped as late; here at the end nothing is in flight any more
    assert not net.in_flight


def test_standard_protocol_cannot_pass_a_stuck_worker_by_more_than_the_path():
    graph = T.ring_based(8)
    cfg = ProtocolConfig(iterations=60, max_ig=3)
    net, inv = run(graph, cfg, seed=2, stall={0: 0}, until_done=False)
    assert max(net.iterations()) <= inv.bounds[:, 0].max() <= 2


def test_deterministic_straggler_jumps_and_tokens_are_conserved():
    graph = T.ring_based(8)
    cfg = ProtocolConfig(iterations=80, max_ig=3, backup_workers=1, skip_max_jump=3, skip_trigger=2)
    net, inv = run(graph, cfg, seed=5, speeds=[0.25] + [1] * 7)
    assert all(net.done)
    straggler = net.cores[0]
    assert straggler.jumps, "the 4x straggler never jumped"
    for frm, to in straggler.jumps:
        assert 2 <= to - frm <= 3
    jumps_logged = [r for r in net.records[0] if "jumped_from" in r]
    assert len(jumps_logged) == len(straggler.jumps)
    assert len(net.records[0]) < cfg.iterations       # it really skipped iterations
    assert not any(c.jumps for c in net.cores[1:])


def test_notify_ack_is_the_papers_baseline():
    """Sec. 3.3: ACK right after Reduce(k); Send(k + 1) only after every out-neighbour ACKed update k. So
    one update per sender is outstanding (the invariant checker asserts it at every step), the update
    queue holds one per in-neighbour, and the gap between neighbours reaches Table 1's 2 -- not the 1 of
    token queues with max_ig = 1, which notify-ack used to be."""
    graph = T.with_default_weights(T.nx.DiGraph([(i, (i + 1) % 5) for i in range(5)]))  # directed cycle
    cfg = ProtocolConfig(iterations=20, protocol="notify-ack")
    worst = np.zeros((5, 5))
    for seed in range(20):
        net, inv = run(graph, cfg, seed, speeds=[1, 0.3, 1, 1, 0.5])
        assert all(net.done)
        assert all(c.capacity() == len(c.view.in_neighbors) == 1 for c in net.cores)
        worst = np.maximum(worst, inv.max_gap)
    # sender j, receiver j + 1: the bound is min(len Path j+1->j, 2 len Path j->j+1) = min(4, 2) = 2
    assert inv.bounds[0, 1] == 2
    assert max(worst[j, (j + 1) % 5] for j in range(5)) == 2


def test_notify_ack_core_acks_after_reduce_and_waits_before_send():
    from hopdec.core import Wait
    from hopdec.hop.actions import SendAcks, SendParams
    view = node_views(T.ring(3))[0]
    w = Worker(view, ProtocolConfig(iterations=3, protocol="notify-ack"))
    acts = []
    while not isinstance(a := w.next_action(), Wait):
        acts.append(a)
    assert isinstance(acts[1], SendParams) and acts[1].iteration == 0     # update 0 needs no ACK
    for s in (1, 2):
        w.on_update(s, 0, f"h{s}")
    acts = []
    while not isinstance(a := w.next_action(), Wait):
        acts.append(a)
    names = [type(x).__name__ for x in acts]
    assert names[:3] == ["Reduce", "SendAcks", "ApplyGradient"]          # the ACK right after Reduce(0)
    assert acts[1] == SendAcks(((1, 1), (2, 1)))
    assert "SendParams" not in names and a.what == "ACKs of update 0"     # Send(1) waits for both ACKs
    w.on_grant(1, 1)
    assert isinstance(w.next_action(), Wait)                               # still one missing
    w.on_grant(2, 1)
    assert w.next_action() == SendParams(1, (1, 2))


def test_late_updates_are_dropped_or_not_sent():
    graph = T.ring_based(8)
    cfg = ProtocolConfig(iterations=60, max_ig=3, backup_workers=1)
    dropped = skipped = 0
    for seed in range(3):
        net, _ = run(graph, cfg, seed, speeds=[0.2] + [1] * 7)
        dropped += sum(c.policy.dropped for c in net.cores)
        skipped += sum(c.sends_skipped for c in net.cores)
    assert dropped > 0 and skipped > 0


def test_staleness_reduce_uses_eq2_weights():
    view = node_views(T.ring(4))[0]
    cfg = ProtocolConfig(iterations=10, max_ig=5, staleness=2)
    w = Worker(view, cfg)
    acts = []
    # iteration 0 sends, computes, then waits for updates no older than -2: it has none but needs none
    a = w.next_action()
    while not isinstance(a, Reduce):
        acts.append(a)
        a = w.next_action()
    assert [t.sender for t in a.terms] == [0]          # nothing received yet: own parameters only
    w2 = Worker(view, cfg)
    w2.on_update(1, 0, "a")
    w2.on_update(3, 0, "b")
    a = w2.next_action()
    while not isinstance(a, Reduce):
        a = w2.next_action()
    weights = {t.sender: t.weight for t in a.terms}
    # eq. (2) at k=0, s=2: every update of iteration 0 weighs 0 - (0 - 2) + 1 = 3: equal thirds
    assert weights == pytest.approx({0: 1 / 3, 1: 1 / 3, 3: 1 / 3})


def test_eq2_weights_favour_newer_updates():
    view = node_views(T.ring(4))[0]
    w = Worker(view, ProtocolConfig(iterations=10, max_ig=5, staleness=3))
    # drive worker 0 to iteration 3 with neighbours' updates of iterations 0..2 and 3
    for k in range(4):
        w.on_update(1, k, f"1@{k}")
        w.on_update(3, max(k - 2, 0), f"3@{k}") if k >= 2 else None
        w.on_grant(1, 10)
        w.on_grant(3, 10)
        a = w.next_action()
        while not isinstance(a, Reduce):
            a = w.next_action()
    weights = {(t.sender, t.iteration): t.weight for t in a.terms}
    # k=3, s=3: self 3-0+1=4, neighbour 1 at iteration 3 -> 4, neighbour 3 at iteration 1 -> 2
    assert weights == pytest.approx({(0, 3): 0.4, (1, 3): 0.4, (3, 1): 0.2})


def test_queues_refuse_to_overflow_and_keep_newest():
    q = IterationSlots(2)
    q.put(Entry(1, 0, "a"))
    q.put(Entry(1, 1, "b"))
    with pytest.raises(QueueOverflow):
        q.put(Entry(1, 2, "c"))
    assert [e.handle for e in q.drop_older(1)] == ["a"]
    n = NewestPerSender()
    assert n.put(Entry(1, 3, "x")) == []
    assert [e.handle for e in n.put(Entry(1, 2, "old"))] == ["old"]
    assert n.newest(1).handle == "x"


def test_ledger_never_takes_ungranted_tokens():
    led = TokenLedger([1, 2], [1, 2], max_ig=2)
    led.take(2)
    assert not led.can_take()
    with pytest.raises(RuntimeError):
        led.take()
    led.on_grant(1, 4)
    led.on_grant(1, 3)                                 # an overtaken, older grant changes nothing
    assert led.available(1) == 2 and led.available(2) == 0


@pytest.mark.parametrize("kw,msg", [
    (dict(protocol="queue-only", backup_workers=1), "needs --protocol tokens"),
    (dict(protocol="notify-ack", staleness=2), "needs --protocol tokens"),
    (dict(backup_workers=2), "node 0"),
    (dict(max_ig=0), "--max-ig"),
    (dict(staleness=-1), "--staleness"),
    (dict(protocol="gossip"), "--protocol"),
    (dict(skip_max_jump=3, protocol="queue-only"), "--skip"),
])
def test_bad_settings_are_named(kw, msg):
    cfg = ProtocolConfig(iterations=5, **kw)
    with pytest.raises(ValueError, match=msg.replace("-", r"\-")):
        check_config(cfg, node_views(T.ring(6)))


def test_deadlock_is_reported_not_hung():
    graph = T.ring(4)
    net = InProcNetwork(node_views(graph), ProtocolConfig(iterations=5), speeds=[0, 1, 1, 1])
    with pytest.raises(Deadlock, match="worker 0 at 0"):
        net.run()


@pytest.mark.parametrize("graph", [T.ring(3), T.complete(3), T.exponential(4)],
                         ids=["ring3", "complete3", "exponential4"])
def test_token_relation_under_many_random_interleavings(graph):
    """Hundreds of schedules on tiny graphs: message reordering, uneven speeds, every setting."""
    settings = [ProtocolConfig(iterations=8, max_ig=1), ProtocolConfig(iterations=8, max_ig=2),
                ProtocolConfig(iterations=8, max_ig=2, backup_workers=1),
                ProtocolConfig(iterations=8, max_ig=2, staleness=1),
                ProtocolConfig(iterations=8, max_ig=3, backup_workers=1, skip_max_jump=3,
                               skip_trigger=1)]
    rng = np.random.default_rng(0)
    jumps = stale_used = 0
    for cfg in settings:
        for seed in range(60):
            speeds = rng.choice([0.1, 0.3, 1.0], size=graph.number_of_nodes())
            net, inv = run(graph, cfg, seed, speeds=speeds)
            assert all(net.done)
            assert inv.checks >= sum(len(r) for r in net.records)    # checked at every step, not once
            check_records(net, cfg)
            jumps += sum(len(c.jumps) for c in net.cores)
            if cfg.staleness is not None:
                stale_used += sum(t[1] < r["iter"] for rs in net.records for r in rs
                                  for terms in r.get("reduced", []) for t in terms)
    # the schedules did reach the mechanisms they are meant to exercise
    assert stale_used > 0
    assert jumps > 0 or graph.number_of_nodes() == 3 and T.nx.density(graph) == 1.0


@pytest.mark.parametrize("graph", [T.ring(6), T.exponential(8), T.hierarchical((4, 2, 2), "a")],
                         ids=["ring6", "exponential8", "hierarchical"])
def test_analysed_queue_capacities_are_what_the_runtime_allocates(graph):
    """``hopdec topo analyze`` and the cores agree on every protocol's update-queue capacity."""
    from hopdec.topology.analysis import summarize
    s = summarize(graph, max_ig=3)
    views = node_views(graph)

    def runtime(**kw):
        return max(Worker(v, ProtocolConfig(iterations=5, **kw)).capacity() for v in views)
    assert runtime(protocol="tokens", max_ig=3) == s["update_queue_capacity_remote"]
    assert runtime(protocol="notify-ack") == s["update_queue_capacity_notify_ack"]
    # queue-only gives every sender the slots of the farthest one (Theorem 1's path bound + 1): at least
    # the analysed need, the sum over senders of len(Path i->j) + 1 (sec. 4.1)
    assert runtime(protocol="queue-only") >= s["update_queue_capacity_no_tokens"] - 1   # analysis counts self


class _ScriptedCore:
    """A core that hands out a fixed list of actions (for what the loop does with each)."""

    rank, ledger, held_updates = 0, None, 0

    def __init__(self, actions):
        self.actions = iter(actions)

    def next_action(self):
        return next(self.actions)


class _RecordingIO:
    carries_grants = True

    def __init__(self):
        self.calls = []

    def poll(self, core):
        self.calls.append(("poll",))

    def send_update(self, iteration, dests, fill, grants=None):
        self.calls.append(("update", iteration, dests, grants))

    def send_grants(self, grants):
        self.calls.append(("grants", grants))


class _NoBackend:
    def compute(self, iteration):
        self.calls.append(("compute", iteration))
        return {"loss": 0.0, "compute_s": 0.0}

    def apply(self, iteration):
        pass

    def write_params(self, out=None):
        return out


def _drive(actions):
    from hopdec.runtime.hop_loop import worker_loop
    io, backend = _RecordingIO(), _NoBackend()
    backend.calls = io.calls
    for _ in worker_loop(_ScriptedCore(actions), io, backend, step=True):
        pass
    return [c for c in io.calls if c[0] != "poll"], io.calls


def test_the_loop_hands_grants_to_the_send_right_behind_them_and_never_holds_them_longer():
    from hopdec.core import ApplyGradient, ComputeGradient, Finished
    from hopdec.hop.actions import Enter, SendParams
    g = ((1, 3), (2, 3))
    # parallel graph: the grants go with the update, no grant message
    calls, _ = _drive([Enter(1, None, g), SendParams(1, (1, 2)), ComputeGradient(1), Finished()])
    assert calls == [("update", 1, (1, 2), g), ("compute", 1)]
    # serial graph: compute comes first, so the grants go as messages before it
    calls, _ = _drive([Enter(1, None, g), ComputeGradient(1), ApplyGradient(1),
                       SendParams(1, (1, 2)), Finished()])
    assert calls == [("grants", g), ("compute", 1), ("update", 1, (1, 2), None)]
    # every out-neighbour skipped: no update to ride on, the grants go as messages
    calls, _ = _drive([Enter(1, None, g), SendParams(1, (), (1, 2)), ComputeGradient(1), Finished()])
    assert calls == [("grants", g), ("compute", 1)]


def test_the_loop_polls_after_actions_that_take_time_not_after_bookkeeping():
    from hopdec.core import ApplyGradient, ComputeGradient, Finished
    from hopdec.hop.actions import Enter, SendParams
    _, calls = _drive([Enter(1, None, ((1, 3),)), SendParams(1, (1,)), ComputeGradient(1),
                       ApplyGradient(1), Finished()])
    kinds = [c[0] for c in calls]
    # a poll before the first action, then after the send, the compute and the apply only
    assert kinds == ["poll", "update", "poll", "compute", "poll", "poll"]


def test_updates_let_go_while_a_worker_waits_are_released_once_by_whoever_takes_them():
    """With staleness a worker uses the newest update of each sender, so an older one is let go of as soon
    as a newer arrives. A driver that polls while the worker is paused (HopOptimizer in finish()) takes the
    handles to free its receive slots, and no later action releases them again; handles not taken come out
    as the next action, as before."""
    from hopdec.core import Wait
    from hopdec.hop.actions import ReleaseUpdates

    def waiting():
        w = Worker(node_views(T.ring(3))[0], ProtocolConfig(iterations=20, max_ig=2, staleness=2))
        w.on_update(1, 0, 101)                   # rank 2's updates are late: the worker runs on without them
        for j in w.view.out_neighbors:
            w.on_grant(j, 100)
        while not isinstance(w.next_action(), Wait):
            pass
        assert w.iteration == 2
        w.on_update(2, 0, 201)
        w.on_update(2, 1, 202)                   # supersedes 201
        return w

    w = waiting()
    assert w.take_releases() == (201,) and w.take_releases() == ()
    later = [w.next_action() for _ in range(12)]
    released = [h for a in later if isinstance(a, ReleaseUpdates) for h in a.handles]
    assert any(isinstance(a, Reduce) and a.iteration == 2 for a in later) and 201 not in released
    a = waiting().next_action()
    assert isinstance(a, ReleaseUpdates) and a.handles == (201,)
