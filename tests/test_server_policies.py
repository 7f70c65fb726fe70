"""The PS synchronization policies, driven in-process by scripted and simulated event sequences."""

import heapq
import itertools
import random

import pytest

from hopdec.errors import ConfigError
from hopdec.server_policies import (
    SYNC_MODES, Answer, Apply, BackupPolicy, BSPPolicy, Drop, DSSPPolicy, ElasticPolicy,
    ESyncPolicy, Note, Release, SSPPolicy, make_policy, parse_staleness_range)


class Sim:
    """Discrete-event simulation of n workers around a policy (no MPI, no clock).

    ``step_time(w, i)`` is worker w's i-th computing time. Non-ESync workers compute, push, and
    wait for a Release; ESync workers query before every local step and push when READY.
    After every event the invariants of the policy can be checked by ``check(sim)``.
    """

    def __init__(self, policy, step_time, check=None):
        self.p = policy
        self.n = policy.n
        self.step_time = step_time
        self.check = check
        self.now = 0.0
        self.seq = itertools.count()
        self.heap = []
        self.read_version = [None] * self.n   # weights version each worker is computing on
        self.running = [False] * self.n
        self.steps_done = [0] * self.n
        self.local_k = [0] * self.n
        self.last_c = [None] * self.n
        self.applied = []    # (time, Apply, [step of each part])
        self.dropped = []
        self.releases = []   # (time, Release)
        self.notes = []
        self.pending_steps = {}  # worker -> step of its pushed buffer

    def _schedule(self, t, kind, w):
        heapq.heappush(self.heap, (t, next(self.seq), kind, w))

    def _do(self, actions):
        for a in actions:
            if isinstance(a, Apply):
                steps = [self.pending_steps.pop(w) for w, _ in a.parts]
                self.applied.append((self.now, a, steps))
            elif isinstance(a, Drop):
                self.dropped.append((self.now, a, self.pending_steps.pop(a.worker)))
            elif isinstance(a, Release):
                self.releases.append((self.now, a))
                for w in a.workers:
                    assert not self.running[w], f"released worker {w} that is running"
                    assert w not in self.pending_steps, f"worker {w} released with an unused buffer"
                    self.read_version[w] = a.version
                    self.running[w] = True
                    if isinstance(self.p, ESyncPolicy):
                        self.local_k[w] = 0
                        self._schedule(self.now, "query", w)
                    else:
                        self._schedule(self.now + self.step_time(w, self.steps_done[w]), "push", w)
            elif isinstance(a, Answer):
                w = a.worker
                if a.ready:
                    self._schedule(self.now, "esync_push", w)
                else:
                    d = self.step_time(w, self.steps_done[w])
                    self._schedule(self.now + d, "local_done", w)
                    self.last_c[w] = d
            elif isinstance(a, Note):
                self.notes.append((self.now, a))
            else:
                raise AssertionError(a)

    def run(self, until):
        self._do(self.p.start(0.0))
        while self.heap and self.heap[0][0] <= until:
            self.now, _, kind, w = heapq.heappop(self.heap)
            if kind == "push":
                self.running[w] = False
                self.steps_done[w] += 1
                self.pending_steps[w] = self.read_version[w]
                self._do(self.p.on_push(w, self.read_version[w], self.now))
            elif kind == "query":
                c = self.last_c[w] if self.last_c[w] is not None else self.step_time(w, 0)
                self._do(self.p.on_query(w, self.local_k[w], c, self.now))
            elif kind == "local_done":
                self.steps_done[w] += 1
                self.local_k[w] += 1
                self._schedule(self.now, "query", w)
            elif kind == "esync_push":
                self.running[w] = False
                self.pending_steps[w] = self.read_version[w]
                self._do(self.p.on_push(w, self.read_version[w], self.now, local_steps=self.local_k[w]))
            if self.check:
                self.check(self)
        return self


def speeds(*periods, jitter=0.0, seed=0):
    rng = random.Random(seed)
    return lambda w, i: periods[w] * (1.0 + rng.uniform(-jitter, jitter))


# ---------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize("kwargs, option", [
    (dict(sync="ssp", n_workers=4, staleness=-1), "--staleness"),
    (dict(sync="dssp", n_workers=4, staleness_range="5,3"), "--staleness-range"),
    (dict(sync="dssp", n_workers=4, staleness_range="-1,3"), "--staleness-range"),
    (dict(sync="dssp", n_workers=4, staleness_range="3"), "--staleness-range"),
    (dict(sync="dssp", n_workers=4, staleness_range="a,b"), "--staleness-range"),
    (dict(sync="backup", n_workers=4, backup_workers=4), "--backup-workers"),
    (dict(sync="backup", n_workers=4, backup_workers=7), "--backup-workers"),
    (dict(sync="backup", n_workers=4, backup_workers=-1), "--backup-workers"),
    (dict(sync="elastic", n_workers=4, lookahead=0), "--lookahead"),
    (dict(sync="bsp", n_workers=0), "at least 2 ranks"),
    (dict(sync="nope", n_workers=4), "--sync"),
])
def test_bad_settings_one_line_naming_the_option(kwargs, option):
    with pytest.raises(ConfigError) as info:
        make_policy(**kwargs)
    msg = str(info.value)
    assert option in msg and "\n" not in msg


def test_defaults_and_parsing():
    for sync in SYNC_MODES:
        assert make_policy(sync, 4).sync == sync
    assert parse_staleness_range("3, 12") == (3, 12)
    assert parse_staleness_range(None) == (3, 15)
    assert make_policy("backup", 4, backup_workers=1).N == 3
    assert make_policy("ssp", 4, staleness=0).s == 0   # s = 0 is legal (BSP-like)


# ---------------------------------------------------------------------------------------------
# BSP / ASP


def test_bsp_waits_for_all_and_averages():
    p = BSPPolicy(3)
    assert p.start(0.0) == [Release((0, 1, 2), 0, "start")]
    assert p.on_push(0, 0, 1.0) == []
    assert p.on_push(2, 0, 1.5) == []
    acts = p.on_push(1, 0, 3.0)
    assert isinstance(acts[0], Apply) and acts[0].parts == ((0, 1 / 3), (1, 1 / 3), (2, 1 / 3))
    assert acts[1] == Release((0, 1, 2), 1, "step")

    sim = Sim(BSPPolicy(4), speeds(1, 1, 2, 1)).run(40)
    assert all(len(a.parts) == 4 for _, a, _ in sim.applied)
    assert all(set(s) == {a.version - 1} for _, a, s in sim.applied)  # all of the current step
    assert max(sim.steps_done) - min(sim.steps_done) <= 1
    # the slow worker sets the pace: one step per 2 time units
    assert len(sim.applied) == 20


def test_asp_never_waits_and_records_staleness():
    sim = Sim(make_policy("asp", 2), speeds(1, 3)).run(30)
    assert not sim.p.waiting or all(sim.running[w] is False for w in sim.p.waiting)
    for t, a, steps in sim.applied:
        assert a.staleness[0] == a.version - 1 - steps[0]
    slow = [a.staleness[0] for _, a, _ in sim.applied if a.parts[0][0] == 1]
    assert slow and min(slow[1:]) >= 2          # ~3 fast updates land while the slow one computes
    assert sim.steps_done[0] >= 2.5 * sim.steps_done[1]


# ---------------------------------------------------------------------------------------------
# SSP / DSSP


def _gap_check(bound):
    def check(sim):
        low = min(sim.p.pushes)
        for w in range(sim.n):
            if sim.running[w]:
                assert sim.p.pushes[w] - low <= bound, (w, sim.p.pushes)
    return check


@pytest.mark.parametrize("s", [0, 1, 3, 5])
def test_ssp_gap_never_exceeds_s(s):
    for seed in range(5):
        sim = Sim(SSPPolicy(4, s), speeds(1, 1.3, 4, 0.7, jitter=0.3, seed=seed), _gap_check(s)).run(200)
        assert max(sim.p.pushes) - min(sim.p.pushes) <= s + 1
        assert len(sim.applied) == sum(sim.p.pushes)   # every push applied at once
        # the fastest did wait: without waiting worker 3 would be ~5.7x ahead of worker 2
        assert sim.steps_done[3] <= sim.steps_done[2] + s + 1


def test_ssp_equal_speeds_never_wait():
    sim = Sim(SSPPolicy(3, 1), speeds(1, 1, 1)).run(20)
    assert all(a.reason != "step" for _, a in sim.releases)
    assert all(len(r.workers) == 1 for _, r in sim.releases[1:])


def test_ssp_scripted_fastest_waits_then_released():
    p = SSPPolicy(2, 1)
    p.start(0.0)
    assert p.on_push(0, 0, 1.0)[-1] == Release((0,), 1)          # gap 1 <= s
    acts = p.on_push(0, 1, 2.0)                                     # gap 2 > s: waits
    assert not any(isinstance(a, Release) for a in acts) and p.waiting == {0}
    acts = p.on_push(1, 0, 2.5)                                     # slowest catches up
    assert acts[-1] == Release((0, 1), 3)


@pytest.mark.parametrize("s_l, s_u", [(0, 0), (1, 4), (3, 12), (3, 15), (2, 2)])
def test_dssp_gap_never_exceeds_s_upper(s_l, s_u):
    for seed in range(5):
        sim = Sim(DSSPPolicy(4, s_l, s_u), speeds(1, 1.2, 2.5, 0.6, jitter=0.2, seed=seed),
                  _gap_check(s_u)).run(300)
        assert len(sim.applied) == sum(sim.p.pushes)


def test_dssp_goes_beyond_s_lower_when_it_saves_waiting():
    # Worker 0 takes 1, worker 1 takes 3.5 per iteration: stopping at s_L=1 costs a long wait,
    # the controller lets worker 0 run to the push closest to the slow worker's next push.
    sim = Sim(DSSPPolicy(2, 1, 10), speeds(1, 3.5), _gap_check(10)).run(200)
    granted = [n.data["r"] for _, n in sim.notes if n.event == "dssp_controller"]
    assert granted and max(granted) > 0
    ssp = Sim(SSPPolicy(2, 1), speeds(1, 3.5)).run(200)
    assert sim.steps_done[0] > ssp.steps_done[0]


def test_dssp_controller_algorithm2():
    p = DSSPPolicy(2, 1, 5)                    # r_max = 4
    p.start(0.0)
    # worker 1 (slow) pushes at 0.5 and 3.5: interval 3, next simulated pushes 6.5, 9.5, ...
    # worker 0 pushes at 4 and 5: interval 1, simulated 5, 6, 7, 8, 9 -> r* = 1 or 2 (|6-6.5|,|7-6.5|)
    p.table = [[5.0, 4.0], [3.5, 0.5]]
    p.pushes = [6, 2]
    assert p.controller(0) == 1               # tie |6-6.5| == |7-6.5|: the smallest r
    p.table = [[5.0, 4.0], [3.0, 0.5]]         # next slow pushes 5.5, 8.0, ...: 8 is exact (r=3)
    assert p.controller(0) == 3
    p.table = [[5.0, None], [3.2, 0.2]]        # fewer than two pushes: r* = 0 (README)
    assert p.controller(0) == 0


def test_dssp_r_star_includes_the_current_release():
    p = DSSPPolicy(2, 0, 4)
    p.start(0.0)
    p.table = [[None, None], [0.0, -3.0]]       # slow worker: interval 3, next push at 3, 6, ...
    p.pushes = [0, 1]
    p.on_push(0, 0, 0.0)                         # gap 0: OK
    p.on_push(0, 1, 1.0)                         # gap 1 > 0, fastest: controller (next slow 3)
    # worker 0 at 1.0, interval 1: simulated 1, 2, 3, 4, 5 -> r* = 2 (time 3)
    assert p.credit[0] == 1 and 0 not in p.waiting
    assert 0 not in p.waiting
    p.on_push(0, 2, 2.0)                         # uses the last credit
    assert p.credit[0] == 0 and 0 not in p.waiting
    p.on_push(0, 3, 3.0)                         # the simulated stop point: gap 3, r=0 -> controller
    # slow worker's table unchanged, so its predicted pushes are 3, 6...: closest r is 0 -> wait
    assert 0 in p.waiting


# ---------------------------------------------------------------------------------------------
# ElasticBSP


def test_elastic_barrier_by_zipline_exact_speeds():
    sim = Sim(ElasticPolicy(2, 15), speeds(1, 2)).run(40)
    barriers = [r for _, r in sim.releases if r.reason == "barrier"]
    notes = [n.data for _, n in sim.notes if n.event == "elastic_barrier"]
    assert barriers and notes
    # superstep: the fast worker runs 4 iterations, the slow one 2, and nobody waits
    first = notes[0]
    assert first["span"] == 0.0 and first["targets"] == [4, 2]
    for d in notes:
        assert d["span"] == 0.0
    # all workers leave each barrier together, with the same weights version
    for r in barriers:
        assert r.workers == (0, 1)
    # ASP inside the superstep: every push applied at once
    assert len(sim.applied) == sum(sim.p.pushes)


def test_elastic_targets_are_future_pushes_and_bound_the_superstep():
    for seed in range(5):
        pol = ElasticPolicy(4, 5)
        sim = Sim(pol, speeds(1, 1.7, 2.2, 0.9, jitter=0.25, seed=seed)).run(150)
        notes = [n.data for _, n in sim.notes if n.event == "elastic_barrier"]
        assert len(notes) >= 5
        # every barrier: each worker stops within R + 1 pushes of the superstep start
        for d in notes:
            assert all(1 <= s <= 5 for s in d["steps"])
        # barrier releases carry all workers at once
        assert all(r.workers == (0, 1, 2, 3) for _, r in sim.releases if r.reason == "barrier")


def test_elastic_scripted():
    p = ElasticPolicy(2, 3)
    p.start(0.0)
    assert p.on_push(0, 0, 1.0)[-1] == Release((0,), 1)       # monitoring: ASP
    acts = p.on_push(1, 0, 3.0)                                # all seen: barrier chosen
    note = [a for a in acts if isinstance(a, Note)][0]
    # worker 0: last push 1, interval 1 -> 2, 3, 4; worker 1: 3 + 3i -> 6, 9, 12: best |4 - 6|
    assert note.data["targets"] == [1 + 3, 1 + 1] and note.data["span"] == 2.0
    assert acts[-1] == Release((1,), 2)
    for t in (2.0, 3.0):
        assert isinstance(p.on_push(0, 0, t)[-1], Release)
    assert not any(isinstance(a, Release) for a in p.on_push(0, 0, 4.0))   # at its count: waits
    acts = p.on_push(1, 2, 6.0)
    assert acts[-1] == Release((0, 1), 6, "barrier")


# ---------------------------------------------------------------------------------------------
# backup workers


def test_backup_uses_first_n_of_current_step_and_drops_late():
    p = BackupPolicy(4, 1)
    p.start(0.0)
    assert p.on_push(2, 0, 1.0) == []
    assert p.on_push(0, 0, 1.1) == []
    acts = p.on_push(3, 0, 1.2)
    assert acts[0].parts == ((2, 1 / 3), (0, 1 / 3), (3, 1 / 3)) and acts[1] == Release((0, 2, 3), 1, "step")
    acts = p.on_push(1, 0, 2.0)                                 # late: step 0 < 1
    assert acts == [Drop(1, 0, 1), Release((1,), 1, "late")]


def test_backup_never_applies_old_gradients_and_always_averages_n():
    for seed in range(5):
        sim = Sim(BackupPolicy(5, 2), speeds(1, 1.1, 2, 0.9, 3, jitter=0.3, seed=seed)).run(100)
        assert sim.applied and sim.dropped
        for _, a, steps in sim.applied:
            assert len(a.parts) == 3 and len({w for w, _ in a.parts}) == 3
            assert all(wt == pytest.approx(1 / 3) for _, wt in a.parts)
            assert steps == [a.version - 1] * 3          # all computed at the current step
        for _, d, step in sim.dropped:
            assert step < d.version


def test_backup_with_one_2x_slower_worker_drops_it():
    sim = Sim(BackupPolicy(4, 1), speeds(1, 1, 1, 2)).run(50)
    assert all(3 not in [w for w, _ in a.parts] for _, a, _ in sim.applied[1:])
    assert len(sim.applied) >= 45


# ---------------------------------------------------------------------------------------------
# ESync


@pytest.mark.parametrize("k", [2, 3, 4])
def test_esync_slow_device_one_step_fast_about_k(k):
    sim = Sim(ESyncPolicy(4), speeds(1, 1, k, 1)).run(30 * k)
    rounds = sim.p.local_steps
    assert len(rounds) >= 10
    for steps in rounds:
        assert steps[2] == 1
        for w in (0, 1, 3):
            assert steps[w] == k
    assert all(a.kind == "delta" and len(a.parts) == 4 for _, a, _ in sim.applied)
    assert all(wt == 0.25 for _, a, _ in sim.applied for _, wt in a.parts)


def test_esync_with_jitter_and_epsilon():
    sim = Sim(ESyncPolicy(4, epsilon=0.05), speeds(1, 1, 3, 1, jitter=0.1, seed=3)).run(200)
    rounds = sim.p.local_steps[1:]
    assert all(r[2] == 1 for r in rounds)
    mean_fast = sum(r[w] for r in rounds for w in (0, 1, 3)) / (3 * len(rounds))
    assert 2.0 <= mean_fast <= 3.0


def test_esync_scripted_query_protocol():
    p = ESyncPolicy(2)
    p.start(0.0)
    assert p.on_query(0, 0, 1.0, 0.0) == [Answer(0, False)]     # k = 0: always train
    assert p.on_query(0, 1, 1.0, 1.0) == [Answer(0, False)]     # device 1 unknown: slowest, no pull yet
    assert p.on_query(1, 0, 4.0, 1.0) == [Answer(1, False)]     # pulls; c = 4
    assert p.on_query(0, 2, 1.0, 2.0) == [Answer(0, False)]     # rest = 4 - (2 - 1) = 3 > 1
    assert p.on_query(0, 3, 1.0, 3.0) == [Answer(0, False)]     # rest 2 > 1
    assert p.on_query(0, 4, 1.0, 4.0) == [Answer(0, False)]     # rest 1, not < 1
    assert p.on_query(1, 1, 4.0, 5.0) == [Answer(1, True)]      # the slowest: ready
    assert p.on_query(0, 5, 1.0, 5.0) == [Answer(0, True)]      # slowest is ready
    assert p.on_push(0, 0, 5.0, local_steps=5) == []
    acts = p.on_push(1, 0, 5.0, local_steps=1)
    assert acts[0].kind == "delta" and acts[0].parts == ((0, 0.5), (1, 0.5))
    assert acts[-1] == Release((0, 1), 1, "round") and p.local_steps == [[5, 1]]


def test_protocol_misuse_raises():
    p = BSPPolicy(2)
    p.start(0.0)
    p.on_push(0, 0, 1.0)
    with pytest.raises(RuntimeError):
        p.on_push(0, 0, 1.0)       # pushed twice without a release
    with pytest.raises(RuntimeError):
        p.on_query(1, 0, 1.0, 1.0)
