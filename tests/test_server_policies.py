"""The parameter-server cores driven in-process: the real server and worker cores (the ones the MPI driver
runs) in virtual time (:class:`hopdec.sim.ps.PSSim`), plus scripted event sequences on the sync models."""

import random

import pytest

from hopdec.core import ComputeGradient, Finished, Wait
from hopdec.errors import ConfigError, RunError
from hopdec.ps.actions import (AnswerQuery, ApplyDeltas, ApplyGradients, DropGradient, LoadWeights, Note,
                               PushGradient, SendWeights, StopWorkers)
from hopdec.ps.server import DROPPED, Server
from hopdec.ps.sync import (SYNC_MODES, BackupPolicy, BSPPolicy, DSSPPolicy, ElasticPolicy, ESyncPolicy,
                            SSPPolicy, sync_policy, parse_staleness_range)
from hopdec.ps.worker import PSWorker
from hopdec.runtime.failures import cause
from hopdec.sim.ps import PSSim


def speeds(*periods, jitter=0.0, seed=0):
    rng = random.Random(seed)
    return lambda w, i: periods[w] * (1.0 + rng.uniform(-jitter, jitter))


def steps_done(sim, w):
    """Mini-batches worker ``w`` has finished (pushed, or ESync local steps taken)."""
    return sim.cores[w].iteration


# ---------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("kwargs, option", [
    (dict(sync="ssp", workers=4, staleness=-1), "--staleness"),
    (dict(sync="dssp", workers=4, staleness_range="5,3"), "--staleness-range"),
    (dict(sync="dssp", workers=4, staleness_range="-1,3"), "--staleness-range"),
    (dict(sync="dssp", workers=4, staleness_range="3"), "--staleness-range"),
    (dict(sync="dssp", workers=4, staleness_range="a,b"), "--staleness-range"),
    (dict(sync="backup", workers=4, backup_workers=4), "--backup-workers"),
    (dict(sync="backup", workers=4, backup_workers=7), "--backup-workers"),
    (dict(sync="backup", workers=4, backup_workers=-1), "--backup-workers"),
    (dict(sync="elastic", workers=4, lookahead=0), "--lookahead"),
    (dict(sync="elastic", workers=4, lookahead=10 ** 9), "--lookahead"),
    (dict(sync="esync", workers=4, esync_epsilon=float("nan")), "--esync-epsilon"),
    (dict(sync="bsp", workers=0), "at least 2 ranks"),
    (dict(sync="nope", workers=4), "--sync"),
])
def test_bad_settings_one_line_naming_the_option(kwargs, option):
    with pytest.raises(ConfigError) as info:
        sync_policy(**kwargs)
    msg = str(info.value)
    assert option in msg and "\n" not in msg


def test_defaults_settings_and_bounds_are_reported():
    for sync in SYNC_MODES:
        assert sync_policy(sync, 4).sync == sync
    assert parse_staleness_range("3, 12") == (3, 12)
    assert parse_staleness_range(None) == (3, 15)
    assert sync_policy("backup", 4).settings() == {"backup_workers": 1, "N": 3}    # documented b = 1
    assert sync_policy("backup", 4, backup_workers=0).settings() == {"backup_workers": 0, "N": 4}
    assert sync_policy("ssp", 4).settings() == {"staleness": 3}
    assert sync_policy("ssp", 4, staleness=0).s == 0   # s = 0 is legal (BSP-like)
    assert sync_policy("dssp", 4).settings() == {"staleness_range": [3, 15]}
    assert sync_policy("elastic", 4).settings() == {"lookahead": 15}
    assert sync_policy("esync", 4).settings() == {"epsilon": 0.0}
    assert sync_policy("bsp", 4).settings() == {} and sync_policy("asp", 4).settings() == {}
    bounds = {s: sync_policy(s, 4).gap_bound() for s in SYNC_MODES}
    assert bounds == {"bsp": 0, "asp": None, "ssp": 3, "dssp": 15, "elastic": None, "backup": None,
                      "esync": None}
    assert sync_policy("dssp", 4, staleness_range="2,5").describe() == "--sync dssp staleness_range=2,5"


def test_workers_are_named_by_rank():
    p = sync_policy("bsp", range(1, 4))                # MPI ranks 1..3: rank 0 is the server
    assert p.start(0.0) == [SendWeights((1, 2, 3), 0, "start")]
    with pytest.raises(RuntimeError, match="no worker 0"):
        p.on_push(0, 0, 1.0)


# ---------------------------------------------------------------------------------------------
# the server and worker cores together (what MPI runs), every mode


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_every_mode_runs_to_its_budget_through_the_cores(sync):
    """Each --sync mode, in-process through the same Server and PSWorker cores and loops as MPI: the
    run ends when the budget is used, every worker is stopped, and the books add up."""
    policy = sync_policy(sync, range(1, 5), staleness=1, staleness_range="1,3", lookahead=4)
    iters = 12
    sim = PSSim(policy, lambda w, i: (1.0, 1.3, 2.0, 0.7)[w - 1], budget=iters * 4).run()
    assert all(sim.done.values()) and sim.server.stopped == {1, 2, 3, 4}
    assert sim.server.work >= iters * 4
    applies, drops = sim.logged("apply"), sim.logged("drop")
    assert len(applies) == sim.server.applied == policy.version and len(drops) == sim.server.dropped
    assert sim.logged("stop") and sim.logged("stop")[0]["work"] >= iters * 4
    for w in range(1, 5):
        recs = sim.records[w]
        assert recs and [r["iter"] for r in recs] == list(range(len(recs)))
        assert all(r["rank"] == w for r in recs)
    if sync == "esync":
        assert all(a["kind"] == "delta" for a in applies)
        assert sim.notes("esync_round")
    else:
        pushes = sum(len(sim.records[w]) for w in range(1, 5))
        # every gradient pushed before the stop was applied or dropped exactly once
        used = sum(len(a["workers"]) for a in applies) + len(drops)
        assert used <= pushes and pushes - used <= 4
    if sync == "bsp":
        assert policy.version == iters                     # exactly N steps of n gradients


def test_worker_core_sgd_and_stop():
    w = PSWorker(3)
    assert w.next_action() == Wait((0,), "weights")
    w.on_weights(5, gap=1, staleness=None, sent_at=2.5)
    assert w.next_action() == LoadWeights(5)
    assert w.next_action() == ComputeGradient(0)
    assert w.next_action() == PushGradient(5, 0)
    assert w.next_action() == Wait((0,), "weights")
    w.on_stop(staleness=DROPPED)
    assert isinstance(w.next_action(), Finished) and w.staleness == -1
    with pytest.raises(RuntimeError, match="second server reply"):
        v = PSWorker(1)
        v.on_weights(0)
        v.on_weights(1)


def test_server_core_stops_everyone_after_the_budget():
    s = Server(sync_policy("asp", (1, 2)), budget=3)
    s.start(0.0)
    assert s.next_action() == SendWeights((1, 2), 0, "start", gaps=(0, 0), staleness=(None, None))
    s.on_push(1, 0, 1.0)
    assert isinstance(s.next_action(), ApplyGradients)
    assert s.next_action() == SendWeights((1,), 1, "", gaps=(1,), staleness=(0,))
    assert s.next_action() == Wait((1, 2), "pushes")
    s.on_push(1, 1, 2.0)
    s.on_push(2, 0, 2.5)                                   # the third gradient: budget reached
    acts = []
    while not isinstance(a := s.next_action(), Wait):
        acts.append(a)
    # worker 1's gradient applied and it continues; worker 2's applied, then a stop instead of weights
    assert [type(a).__name__ for a in acts] == ["ApplyGradients", "SendWeights", "ApplyGradients", "Note",
                                                "StopWorkers"]
    assert acts[-1] == StopWorkers((2,), 3) and a == Wait((1,), "pushes")
    s.on_push(1, 2, 3.0)                                   # a push after the stop: no apply, a stop
    assert s.next_action() == StopWorkers((1,), 3, discarded=(1,))
    assert isinstance(s.next_action(), Finished) and s.stopped == {1, 2} and s.applied == 3


def test_a_release_of_every_worker_finds_the_slowest_once():
    """The gaps of a release of all n workers (the start, BSP's every round) are each one's pushes minus the
    slowest's, the slowest found once, not once per worker (O(n^2): 1 s at 10,000 workers)."""
    n = 200
    pol = sync_policy("bsp", range(1, n + 1))
    calls = []
    slowest = pol.slowest_pushes
    pol.slowest_pushes = lambda: calls.append(1) or slowest()
    s = Server(pol, budget=10 * n)
    s.start(0.0)
    assert s.next_action() == SendWeights(tuple(range(1, n + 1)), 0, "start", gaps=(0,) * n, staleness=(None,) * n)
    for w in range(1, n + 1):
        s.on_push(w, 0, 1.0)
    acts = []
    while not isinstance(a := s.next_action(), Wait):
        acts.append(a)
    assert acts[-1].gaps == (0,) * n and len(calls) == 2, len(calls)     # once per release, not once per worker


# ---------------------------------------------------------------------------------------------
# BSP / ASP


def test_bsp_waits_for_all_and_averages():
    p = BSPPolicy(range(3))
    assert p.start(0.0) == [SendWeights((0, 1, 2), 0, "start")]
    assert p.on_push(0, 0, 1.0) == []
    assert p.on_push(2, 0, 1.5) == []
    acts = p.on_push(1, 0, 3.0)
    assert isinstance(acts[0], ApplyGradients) and acts[0].parts == ((0, 1 / 3), (1, 1 / 3), (2, 1 / 3))
    assert acts[1] == SendWeights((0, 1, 2), 1, "step")

    sim = PSSim(BSPPolicy(range(4)), speeds(1, 1, 2, 1)).run(40)
    applies = sim.logged("apply")
    assert all(len(a["workers"]) == 4 for a in applies)
    assert all(set(a["steps"]) == {a["version"] - 1} for a in applies)  # all of the current step
    assert max(steps_done(sim, w) for w in range(4)) - min(steps_done(sim, w) for w in range(4)) <= 1
    # the slow worker sets the pace: one step per 2 time units
    assert len(applies) == 20


def test_asp_never_waits_and_records_staleness():
    sim = PSSim(sync_policy("asp", 2), speeds(1, 3)).run(30)
    assert all(not sim.blocked[w] or not sim.policy.waiting for w in range(2))
    for a in sim.logged("apply"):
        assert a["staleness"][0] == a["version"] - 1 - a["steps"][0]
    slow = [a["staleness"][0] for a in sim.logged("apply") if a["workers"][0] == 1]
    assert slow and min(slow[1:]) >= 2          # ~3 fast updates land while the slow one computes
    assert steps_done(sim, 0) >= 2.5 * steps_done(sim, 1)


# ---------------------------------------------------------------------------------------------
# SSP / DSSP


def _gap_check(bound):
    def check(sim):
        low = sim.policy.slowest_pushes()
        for w in sim.policy.workers:
            if sim.running(w):
                assert sim.policy.pushes[w] - low <= bound, (w, sim.policy.pushes)
    return check


@pytest.mark.parametrize("s", [0, 1, 3, 5])
def test_ssp_gap_never_exceeds_s(s):
    for seed in range(5):
        sim = PSSim(SSPPolicy(range(4), s), speeds(1, 1.3, 4, 0.7, jitter=0.3, seed=seed),
                    check=_gap_check(s)).run(200)
        assert sim.policy.gap() <= s + 1
        assert len(sim.logged("apply")) == sum(sim.policy.pushes.values())   # every push applied at once
        # the fastest did wait: without waiting worker 3 would be ~5.7x ahead of worker 2
        assert steps_done(sim, 3) <= steps_done(sim, 2) + s + 1


def test_ssp_equal_speeds_never_wait():
    sim = PSSim(SSPPolicy(range(3), 1), speeds(1, 1, 1)).run(20)
    releases = sim.logged("release")
    assert all(r["reason"] != "step" for r in releases)
    assert all(len(r["workers"]) == 1 for r in releases[1:])


def test_ssp_scripted_fastest_waits_then_released():
    p = SSPPolicy(range(2), 1)
    p.start(0.0)
    assert p.on_push(0, 0, 1.0)[-1] == SendWeights((0,), 1)          # gap 1 <= s
    acts = p.on_push(0, 1, 2.0)                                        # gap 2 > s: waits
    assert not any(isinstance(a, SendWeights) for a in acts) and p.waiting == {0}
    acts = p.on_push(1, 0, 2.5)                                        # slowest catches up
    assert acts[-1] == SendWeights((0, 1), 3)


@pytest.mark.parametrize("s_l, s_u", [(0, 0), (1, 4), (3, 12), (3, 15), (2, 2)])
def test_dssp_gap_never_exceeds_s_upper(s_l, s_u):
    for seed in range(5):
        sim = PSSim(DSSPPolicy(range(4), s_l, s_u), speeds(1, 1.2, 2.5, 0.6, jitter=0.2, seed=seed),
                    check=_gap_check(s_u)).run(300)
        assert len(sim.logged("apply")) == sum(sim.policy.pushes.values())


def test_dssp_goes_beyond_s_lower_when_it_saves_waiting():
    # Worker 0 takes 1, worker 1 takes 3.5 per iteration: stopping at s_L=1 costs a long wait,
    # the controller lets worker 0 run to the push closest to the slow worker's next push.
    sim = PSSim(DSSPPolicy(range(2), 1, 10), speeds(1, 3.5), check=_gap_check(10)).run(200)
    granted = [n["r"] for n in sim.notes("dssp_controller")]
    assert granted and max(granted) > 0
    ssp = PSSim(SSPPolicy(range(2), 1), speeds(1, 3.5)).run(200)
    assert steps_done(sim, 0) > steps_done(ssp, 0)


def test_dssp_controller_algorithm2():
    p = DSSPPolicy(range(2), 1, 5)             # r_max = 4
    p.start(0.0)
    # worker 1 (slow) pushes at 0.5 and 3.5: interval 3, next simulated pushes 6.5, 9.5, ...
    # worker 0 pushes at 4 and 5: interval 1, simulated 5, 6, 7, 8, 9 -> r* = 1 or 2 (|6-6.5|,|7-6.5|)
    p.table = {0: [5.0, 4.0], 1: [3.5, 0.5]}
    p.pushes = {0: 6, 1: 2}
    assert p.controller(0) == 1               # tie |6-6.5| == |7-6.5|: the smallest r
    p.table = {0: [5.0, 4.0], 1: [3.0, 0.5]}   # next slow pushes 5.5, 8.0, ...: 8 is exact (r=3)
    assert p.controller(0) == 3
    p.table = {0: [5.0, None], 1: [3.2, 0.2]}  # fewer than two pushes: r* = 0 (README)
    assert p.controller(0) == 0


def test_dssp_r_star_includes_the_current_release():
    p = DSSPPolicy(range(2), 0, 4)
    p.start(0.0)
    p.table = {0: [None, None], 1: [0.0, -3.0]}   # slow worker: interval 3, next push at 3, 6, ...
    p.pushes = {0: 0, 1: 1}
    p.on_push(0, 0, 0.0)                         # gap 0: OK
    p.on_push(0, 1, 1.0)                         # gap 1 > 0, fastest: controller (next slow 3)
    # worker 0 at 1.0, interval 1: simulated 1, 2, 3, 4, 5 -> r* = 2 (time 3)
    assert p.credit[0] == 1 and 0 not in p.waiting
    p.on_push(0, 2, 2.0)                         # uses the last credit
    assert p.credit[0] == 0 and 0 not in p.waiting
    p.on_push(0, 3, 3.0)                         # the simulated stop point: gap 3, r=0 -> controller
    # slow worker's table unchanged, so its predicted pushes are 3, 6...: closest r is 0 -> wait
    assert 0 in p.waiting


# ---------------------------------------------------------------------------------------------
# ElasticBSP


def test_elastic_barrier_by_zipline_exact_speeds():
    sim = PSSim(ElasticPolicy(range(2), 15), speeds(1, 2)).run(40)
    barriers = [r for r in sim.logged("release") if r["reason"] == "barrier"]
    notes = sim.notes("elastic_barrier")
    assert barriers and notes
    # superstep: the fast worker runs 4 iterations, the slow one 2, and nobody waits
    first = notes[0]
    assert first["span"] == 0.0 and first["targets"] == [4, 2] and first["workers"] == [0, 1]
    for d in notes:
        assert d["span"] == 0.0
    # all workers leave each barrier together, with the same weights version
    for r in barriers:
        assert r["workers"] == [0, 1]
    # ASP inside the superstep: every push applied at once
    assert len(sim.logged("apply")) == sum(sim.policy.pushes.values())


def test_elastic_targets_are_future_pushes_and_bound_the_superstep():
    for seed in range(5):
        sim = PSSim(ElasticPolicy(range(4), 5), speeds(1, 1.7, 2.2, 0.9, jitter=0.25, seed=seed)).run(150)
        notes = sim.notes("elastic_barrier")
        assert len(notes) >= 5
        # every barrier: each worker stops within R pushes of the superstep start
        for d in notes:
            assert all(1 <= s <= 5 for s in d["steps"])
        # barrier releases carry all workers at once
        assert all(r["workers"] == [0, 1, 2, 3] for r in sim.logged("release") if r["reason"] == "barrier")


def test_elastic_scripted():
    p = ElasticPolicy(range(2), 3)
    p.start(0.0)
    assert p.on_push(0, 0, 1.0)[-1] == SendWeights((0,), 1)       # monitoring: ASP
    acts = p.on_push(1, 0, 3.0)                                    # all seen: barrier chosen
    note = [a for a in acts if isinstance(a, Note)][0]
    # worker 0: last push 1, interval 1 -> 2, 3, 4; worker 1: 3 + 3i -> 6, 9, 12: best |4 - 6|
    assert note.data["targets"] == [1 + 3, 1 + 1] and note.data["span"] == 2.0
    assert acts[-1] == SendWeights((1,), 2)
    for t in (2.0, 3.0):
        assert isinstance(p.on_push(0, 0, t)[-1], SendWeights)
    assert not any(isinstance(a, SendWeights) for a in p.on_push(0, 0, 4.0))   # at its count: waits
    acts = p.on_push(1, 2, 6.0)
    assert acts[-1] == SendWeights((0, 1), 6, "barrier")


# ---------------------------------------------------------------------------------------------
# backup workers


def test_backup_uses_first_n_of_current_step_and_drops_late():
    p = BackupPolicy(range(4), 1)
    p.start(0.0)
    assert p.on_push(2, 0, 1.0) == []
    assert p.on_push(0, 0, 1.1) == []
    acts = p.on_push(3, 0, 1.2)
    assert acts[0].parts == ((2, 1 / 3), (0, 1 / 3), (3, 1 / 3)) and acts[1] == SendWeights((0, 2, 3), 1, "step")
    acts = p.on_push(1, 0, 2.0)                                 # late: step 0 < 1
    assert acts == [DropGradient(1, 0, 1), SendWeights((1,), 1, "late")]


def test_backup_never_applies_old_gradients_and_always_averages_n():
    for seed in range(5):
        sim = PSSim(BackupPolicy(range(5), 2), speeds(1, 1.1, 2, 0.9, 3, jitter=0.3, seed=seed)).run(100)
        assert sim.logged("apply") and sim.logged("drop")
        for a in sim.logged("apply"):
            assert len(a["workers"]) == 3 and len(set(a["workers"])) == 3
            assert all(wt == pytest.approx(1 / 3) for wt in a["weights"])
            assert a["steps"] == [a["version"] - 1] * 3          # all computed at the current step
        for d in sim.logged("drop"):
            assert d["step"] < d["version"]


def test_backup_with_one_2x_slower_worker_drops_it():
    sim = PSSim(BackupPolicy(range(4), 1), speeds(1, 1, 1, 2)).run(50)
    applies = sim.logged("apply")
    assert all(3 not in a["workers"] for a in applies[1:])
    assert len(applies) >= 45
    # the worker's own log says its gradients were dropped (staleness -1)
    assert any(r.get("staleness") == DROPPED for r in sim.records[3])


# ---------------------------------------------------------------------------------------------
# ESync


@pytest.mark.parametrize("k", [2, 3, 4])
def test_esync_slow_device_one_step_fast_about_k(k):
    sim = PSSim(ESyncPolicy(range(4)), speeds(1, 1, k, 1)).run(30 * k)
    rounds = sim.policy.local_steps
    assert len(rounds) >= 10
    for steps in rounds:
        assert steps[2] == 1
        for w in (0, 1, 3):
            assert steps[w] == k
    assert all(a["kind"] == "delta" and len(a["workers"]) == 4 for a in sim.logged("apply"))
    assert all(wt == 0.25 for a in sim.logged("apply") for wt in a["weights"])


def test_esync_with_jitter_and_epsilon():
    sim = PSSim(ESyncPolicy(range(4), epsilon=0.05), speeds(1, 1, 3, 1, jitter=0.1, seed=3)).run(200)
    rounds = sim.policy.local_steps[1:]
    assert all(r[2] == 1 for r in rounds)
    mean_fast = sum(r[w] for r in rounds for w in (0, 1, 3)) / (3 * len(rounds))
    assert 2.0 <= mean_fast <= 3.0


def test_esync_scripted_query_protocol():
    p = ESyncPolicy(range(2))
    p.start(0.0)
    assert p.on_query(0, 0, 1.0, 0.0) == [AnswerQuery(0, False)]     # k = 0: always train
    assert p.on_query(0, 1, 1.0, 1.0) == [AnswerQuery(0, False)]     # device 1 unknown: slowest
    assert p.on_query(1, 0, 4.0, 1.0) == [AnswerQuery(1, False)]     # pulls; c = 4
    assert p.on_query(0, 2, 1.0, 2.0) == [AnswerQuery(0, False)]     # rest = 4 - (2 - 1) = 3 > 1
    assert p.on_query(0, 3, 1.0, 3.0) == [AnswerQuery(0, False)]     # rest 2 > 1
    assert p.on_query(0, 4, 1.0, 4.0) == [AnswerQuery(0, False)]     # rest 1, not < 1
    assert p.on_query(1, 1, 4.0, 5.0) == [AnswerQuery(1, True)]      # the slowest: ready
    assert p.on_query(0, 5, 1.0, 5.0) == [AnswerQuery(0, True)]      # slowest is ready
    assert p.on_push(0, 0, 5.0, local_steps=5) == []
    acts = p.on_push(1, 0, 5.0, local_steps=1)
    assert isinstance(acts[0], ApplyDeltas) and acts[0].parts == ((0, 0.5), (1, 0.5))
    assert acts[-1] == SendWeights((0, 1), 1, "round") and p.local_steps == [[5, 1]]


def test_protocol_misuse_raises():
    p = BSPPolicy(range(2))
    p.start(0.0)
    p.on_push(0, 0, 1.0)
    with pytest.raises(RuntimeError):
        p.on_push(0, 0, 1.0)       # pushed twice without being sent weights
    with pytest.raises(RuntimeError):
        p.on_query(1, 0, 1.0, 1.0)


# ---------------------------------------------------------------------------------------------
# a worker dies (--fault-tolerance): the others go on


@pytest.mark.parametrize("sync", SYNC_MODES)
@pytest.mark.parametrize("victim, at", [(3, 5.5), (4, 6.65), (1, 0.0)])
def test_every_mode_goes_on_when_a_worker_dies(sync, victim, at):
    """Worker 3 (the slowest, mid-compute), 4 (the fastest, often waiting for the others) or 1 (before
    its first push) dies: the run still ends, every survivor is stopped, the dead worker's gradients are
    never applied after its death, and the bounded models keep their gap bound among the survivors."""
    policy = sync_policy(sync, range(1, 5), staleness=1, staleness_range="1,3", lookahead=4)
    iters = 12
    bound = policy.gap_bound()

    def check(sim):
        if bound is not None and sim.now > at:
            alive = [w for w in policy.workers]
            pushes = [policy.pushes[w] for w in alive]
            assert max(pushes) - min(pushes) <= bound + 1     # a released worker may push once more
    sim = PSSim(policy, lambda w, i: (1.0, 1.3, 2.0, 0.7)[w - 1], budget=iters * 4, check=check)
    sim.fail(victim, at)
    sim.run()
    survivors = {1, 2, 3, 4} - {victim}
    assert all(sim.done.values()) and sim.server.failed == [victim] and sim.dead == {victim}
    assert sim.server.stopped == {1, 2, 3, 4} and victim not in policy.workers and policy.n == 3
    note = sim.notes("failure")
    assert len(note) == 1 and note[0]["worker"] == victim
    assert all(victim not in a["workers"] for a in sim.logged("apply") if a["time"] > at)
    assert all(sim.records[w] for w in survivors)
    # the budget lost the dead worker's unfinished share: the survivors do their own part
    assert sim.server.budget == iters * 4 - (iters - sim.server.work_by[victim])
    assert sim.server.work >= sim.server.budget
    if sync == "bsp":
        assert policy.version == iters                     # still exactly N steps
    if sync == "backup":                                   # a spare is used up first: N stays 3
        assert policy.settings() == {"backup_workers": 0, "N": 3}


def test_a_death_releases_whoever_waited_only_for_it():
    """BSP, scripted: 1 and 2 pushed, 3 dies before pushing: the step is the mean of 1 and 2, released."""
    s = Server(BSPPolicy((1, 2, 3)), budget=30)
    s.start(0.0)
    assert isinstance(s.next_action(), SendWeights)
    s.on_push(1, 0, 1.0)
    s.on_push(2, 0, 1.1)
    assert isinstance(s.next_action(), Wait)
    s.on_worker_failed(3, 1.5)
    got = [s.next_action() for _ in range(3)]
    assert isinstance(got[0], Note) and got[0].event == "failure" and got[0].data["budget"] == 20
    assert isinstance(got[1], ApplyGradients) and got[1].parts == ((1, 0.5), (2, 0.5))
    assert isinstance(got[2], SendWeights) and got[2].workers == (1, 2)
    s.on_worker_failed(3, 1.6)                             # told twice: nothing more
    assert isinstance(s.next_action(), Wait)


def test_the_last_worker_dying_is_an_error():
    """A failure the user caused, reported as one line (it read 'RuntimeError: asp: the last worker (1)
    died (HOPDEC_DEBUG=1 shows the traceback)', an internal error's form)."""
    s = Server(sync_policy("asp", (1, 2)), budget=10)
    s.start(0.0)
    s.on_worker_failed(1, 1.0)
    with pytest.raises(RunError) as err:
        s.on_worker_failed(2, 2.0)
    assert cause(err.value) == ("the last worker (rank 2) died after 0 mini-batches; the parameter server "
                                "cannot train without workers")


@pytest.mark.parametrize("sync", ["ssp", "dssp", "asp"])
def test_no_gradient_is_applied_past_the_budget_when_the_last_pusher_is_held(sync):
    """SSP held back the worker whose push met the budget, so no weights went out and the stop waited for
    the next release; meanwhile other workers' pushes were applied: 125 gradients for a budget of 120 (a
    real run: 1201 for 1200). A push after the budget is now answered with a stop, unused."""
    import io
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    res = simulate(parse(["--mode", "ps", "--sync", sync, "-n", "8", "--iterations", "15", "--slowdown",
                          "rank=2,factor=4", "--message-mb", "4", "--bandwidth", "1", "--compute-time",
                          "normal:mean=0.03,std=0.01"]), out=io.StringIO())
    server = res["sim"].server
    assert server.applied == server.budget == 120
    assert server.stopping and server.work >= server.budget


def test_the_slowest_workers_pushes_are_counted_as_they_come():
    """``slowest_pushes`` is kept per number of pushes (a min over every worker at every release was O(n)
    per push): after random pushes, a death and a state put back, it is still the min."""
    rng = random.Random(5)
    p = SSPPolicy(range(6), 3)
    p.start(0.0)
    for step in range(200):
        free = [w for w in p.workers if w not in p.waiting]
        assert free                                     # (SSP 3 keeps the others going)
        p.on_push(rng.choice(free), 0, float(step))
        assert p.slowest_pushes() == min(p.pushes.values()), step
        if step == 100:
            p.remove_worker(min(p.pushes, key=p.pushes.get), float(step))
        if step == 150:
            p.load_state(p.state())
    assert p.slowest_pushes() == min(p.pushes.values())
    assert not any(k.startswith("_cached") for k in p.state())        # not part of a checkpoint


def test_a_release_names_its_workers_in_order_and_only_the_models_own():
    p = BSPPolicy(range(5))
    assert p.in_order([3, 1, 9, 1]) == (1, 3)
    p.remove_worker(1, 0.0)
    assert p.in_order([4, 3, 1]) == (3, 4)


def test_the_servers_wait_is_on_the_workers_still_running():
    """The server's Wait for pushes names the workers running when it is read (a tuple of them at
    every wait was a pass over every worker per push)."""
    s = Server(sync_policy("asp", range(4)), budget=100)
    s.start(0.0)
    while not isinstance(s.next_action(), Wait):
        pass
    w = s.next_action()
    assert w == Wait((0, 1, 2, 3), "pushes") and len(w.on) == 4 and w.on[-1] == 3
    s.on_worker_failed(2, 0.0)
    while not isinstance(s.next_action(), Wait):
        pass
    assert tuple(s.next_action().on) == (0, 1, 3) == tuple(w.on)


def test_the_servers_wait_names_the_workers_that_owe_it_a_push():
    """A BSP round that three of four workers pushed waits on the fourth: a stopped (SIGSTOP) worker timed
    out as "no message from any worker for 10 s (still running: ranks 1, 2, 3)", naming the three that
    waited for the server's release too."""
    s = Server(sync_policy("bsp", (1, 2, 3)), budget=100)
    s.start(0.0)

    def wait():
        while not isinstance(a := s.next_action(), Wait):
            pass
        return a
    assert tuple(wait().on) == (1, 2, 3)
    s.on_push(1, 0, 0.1)
    s.on_push(3, 0, 0.2)
    assert tuple(wait().on) == (2,)
    s.on_push(2, 0, 0.3)                            # the round completes: everyone is released
    assert tuple(wait().on) == (1, 2, 3)
