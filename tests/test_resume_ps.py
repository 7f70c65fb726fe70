"""Checkpoints in the parameter-server cores, driven in-process with random message orders: every cut
finds every worker waiting and nothing in flight, a BSP run resumed from a cut equals the uninterrupted
run, every sync model resumes from its cut and finishes its budget, and a stop request ends a run with
a final cut."""

import json
import random
from collections import deque

import numpy as np
import pytest

from hopdec.core import Wait
from hopdec.ps.server import Server
from hopdec.ps.sync import SYNC_MODES, sync_policy
from hopdec.ps.worker import PSWorker
from hopdec.runtime.ps_loop import server_loop, worker_loop

DIM = 3


def target(worker, batch):
    return np.random.default_rng([worker, batch]).normal(size=DIM)


class Sim:
    """One server core and n worker cores; messages delivered one at a time in a seeded random order
    (FIFO per link, as MPI). Worker w's data stream is its batch counter."""

    def __init__(self, sync, n=3, budget=60, every=0, seed=0, snapshot=None, speeds=None):
        self.rng = random.Random(seed)
        self.policy = sync_policy(sync, range(1, n + 1), staleness=1)
        self.server = Server(self.policy, budget, checkpoints=True, checkpoint_every=every)
        self.workers = self.policy.workers
        self.cores = {w: PSWorker(w, pushes_differences=sync == "esync") for w in self.workers}
        self.w = np.zeros(DIM)
        self.batch = dict.fromkeys(self.workers, 0)
        self.grad = {}
        self.pushed = {}
        self.links = {w: deque() for w in self.workers}        # server -> worker
        self.up = {w: deque() for w in self.workers}           # worker -> server
        self.snapshots = {}                                     # cut -> {"server": ..., w: ...}
        self.at_cut, self.waiting_at_cut, self.final_cuts = {}, {}, set()
        self.cut_checks = 0
        self.speeds = speeds or {}
        self.time = 0.0
        outer = self

        class SIO:
            def pushed(self, w):
                return outer.pushed[w]

            def send_weights(self, w, version, gap, staleness, model, now, cut=0, keep_from=0):
                outer.links[w].append(("weights", outer.w.copy(), version, cut, keep_from))

            def answer(self, w, ready):
                outer.links[w].append(("answer", ready))

            def stop(self, w, staleness, cut=0, keep_from=0):
                outer.links[w].append(("stop", cut, keep_from, staleness))

        class Model:
            def apply_gradients(self, pairs):
                outer.w = outer.w - 0.1 * sum(wt * g for g, wt in pairs)

            def add_deltas(self, pairs):
                outer.w = outer.w + sum(wt * g for g, wt in pairs)

        class WIO:
            def __init__(self, w):
                self.w = w

            def weights(self):
                return outer.loaded[self.w]

            def push_gradient(self, step, iteration, grad):
                outer.up[self.w].append(("push", step, grad.copy(), 1))

            def push_delta(self, rnd, k, iteration, delta):
                outer.up[self.w].append(("push", rnd, delta.copy(), k))

            def query(self, rnd, k, c, iteration):
                outer.up[self.w].append(("query", k, c))

        class Backend:
            def __init__(self, w):
                self.w = w
                self.x = np.zeros(DIM)

            def compute(self, iteration):
                outer.grad[self.w] = self.x - target(self.w, outer.batch[self.w])
                outer.batch[self.w] += 1
                return {"loss": 0.0, "compute_s": 0.0}

            def apply(self, iteration):
                self.x = self.x - 0.1 * outer.grad[self.w]

            def load_params(self, buf):
                self.x = buf.copy()

            def keep_params(self):
                self.kept = self.x.copy()

            def gradient(self):
                return outer.grad[self.w]

            def delta(self):
                return self.x - self.kept

        self.loaded = {}
        self.backends = {w: Backend(w) for w in self.workers}
        if snapshot is not None:
            self._restore(snapshot)
        else:
            self.server.start(0.0)
        self.sloop = server_loop(self.server, SIO(), Model(), clock=lambda: self.time,
                                 on_checkpoint=self._server_cut)
        self.wloops = {w: worker_loop(c, WIO(w), self.backends[w], clock=lambda: self.time,
                                      on_checkpoint=lambda a, w=w: self._worker_cut(w, a))
                       for w, c in self.cores.items()}
        self.blocked = dict.fromkeys(self.workers, False)
        self.done = dict.fromkeys(self.workers, False)
        next(self.sloop, None)

    # ---- checkpoints: what the MPI driver saves, as plain data ----
    def _server_cut(self, a):
        if not a.final:
            assert all(not q for q in self.up.values()), "a push was in flight at a cut"
            assert all(not q for q in self.links.values()), "a message to a worker was in flight at a cut"
            assert all(self.blocked[w] for w in self.workers), "a worker was computing at a cut"
        self.cut_checks += 1
        self.at_cut[a.cut] = {w: (self.cores[w].iteration, self.batch[w]) for w in self.workers}
        if a.final:
            self.final_cuts.add(a.cut)
        self.waiting_at_cut[a.cut] = set(self.policy.waiting)
        snap = self.snapshots.setdefault(a.cut, {})
        snap["server"] = json.loads(json.dumps(dict(core=self.server.state(), w=self.w.tolist(), time=self.time,
                                                    version=self.policy.version,
                                                    pending={w: self.pushed[w].tolist()
                                                             for w in self.server.pending_step})))

    def _worker_cut(self, w, a):
        state = dict(iteration=self.cores[w].iteration, batch=self.batch[w], x=self.backends[w].x.tolist())
        for cut in a.cuts:      # saved later than the cut, maybe: the state must be the one it had then
            if cut in self.at_cut:
                assert state["batch"] == self.at_cut[cut][w][1]
                if cut not in self.final_cuts:
                    assert state["iteration"] == self.at_cut[cut][w][0]
                elif self.policy.sync != "esync":    # a gradient discarded at the stop is not counted
                    assert state["iteration"] == self.policy.pushes[w]
            self.snapshots.setdefault(cut, {})[w] = state

    def _restore(self, snap):
        s = snap["server"]
        self.w = np.array(s["w"])
        for w, g in s["pending"].items():
            self.pushed[int(w)] = np.array(g)
        for w in self.workers:
            st = snap[w]
            self.cores[w].resume(st["iteration"], s["core"]["cuts"])
            self.batch[w] = st["batch"]
            self.backends[w].x = np.array(st["x"])
        self.server.resume(s["core"], self.time, shift=0.0)

    # ---- running ----
    def _advance(self, w):
        try:
            got = next(self.wloops[w])
        except StopIteration:
            self.done[w] = True
            return
        self.blocked[w] = isinstance(got, Wait)

    def step(self):
        moves = [("down", w) for w in self.workers if self.links[w]]
        moves += [("up", w) for w in self.workers if self.up[w]]
        moves += [("run", w) for w in self.workers
                  if not self.blocked[w] and not self.done[w] and self.rng.random() < self.speeds.get(w, 1.0)]
        if not moves:
            return any(not self.blocked[w] and not self.done[w] for w in self.workers)
        kind, w = self.rng.choice(moves)
        self.time += 0.01
        if kind == "down":
            msg = self.links[w].popleft()
            core = self.cores[w]
            if msg[0] == "weights":
                self.loaded[w] = msg[1]
                core.on_weights(msg[2], cut=msg[3], keep_from=msg[4])
            elif msg[0] == "answer":
                core.on_answer(msg[1])
            else:
                core.on_stop(msg[3], cut=msg[1], keep_from=msg[2])
            self.blocked[w] = False
        elif kind == "up":
            msg = self.up[w].popleft()
            if msg[0] == "push":
                self.pushed[w] = msg[2]
                self.server.on_push(w, msg[1], self.time, local_steps=msg[3])
            else:
                self.server.on_query(w, msg[1], msg[2], self.time)
            next(self.sloop, None)
        else:
            self._advance(w)
        return True

    def run(self, until=None, max_steps=200_000):
        for _ in range(max_steps):
            if until is not None and until(self):
                return self
            if not self.step() and all(self.done.values()):
                return self
        raise AssertionError("no end")


def latest_common(sim):
    full = [c for c, snap in sim.snapshots.items() if "server" in snap and all(w in snap for w in sim.workers)]
    return max(full)


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_every_cut_finds_every_worker_waiting_and_nothing_in_flight(sync):
    """Checked at each cut (Sim._server_cut); and what each worker saves for a cut -- perhaps much later,
    when the policy finally releases it -- is the state it had at the cut (Sim._worker_cut)."""
    kept_waiting = 0
    for seed in range(3):
        sim = Sim(sync, budget=300, every=12, seed=seed, speeds={1: 0.2}).run()
        assert sim.cut_checks >= 20, sim.cut_checks            # periodic cuts, and the final one
        assert sim.server.work >= 300
        assert all(sim.cores[w].saved_cut == sim.server.cuts for w in sim.workers)
        kept_waiting += sum(bool(v) for v in sim.waiting_at_cut.values())
    if sync in ("dssp", "elastic"):       # these keep workers waiting across cuts: the deferred saves ran
        assert kept_waiting > 0


def test_bsp_resumed_from_a_cut_equals_the_uninterrupted_run():
    full = Sim("bsp", budget=60, seed=1).run()
    for seed in range(3):
        killed = Sim("bsp", budget=60, every=9, seed=seed).run(until=lambda s: s.server.work >= 40)
        cut = latest_common(killed)
        snap = killed.snapshots[cut]
        resumed = Sim("bsp", budget=60, every=9, seed=seed + 7, snapshot=snap).run()
        assert np.array_equal(resumed.w, full.w)
        assert resumed.server.cuts > cut


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_every_sync_model_resumes_from_its_latest_cut_and_finishes_the_budget(sync):
    killed = Sim(sync, budget=90, every=12, seed=3, speeds={2: 0.4}).run(until=lambda s: s.server.work >= 50)
    cut = latest_common(killed)
    resumed = Sim(sync, budget=90, every=12, seed=4, speeds={2: 0.4}, snapshot=killed.snapshots[cut]).run()
    assert resumed.server.work >= 90 and all(resumed.done.values())
    assert resumed.policy.version > killed.snapshots[cut]["server"]["version"]


@pytest.mark.parametrize("sync", SYNC_MODES)
def test_a_stop_request_ends_the_run_early_with_a_final_cut(sync):
    """Every rank saves the final cut; a worker whose gradient came after the stop (discarded) saves the
    iterations the policy counted (checked in Sim._worker_cut); the run resumes from there."""
    sim = Sim(sync, budget=10 ** 6, seed=2).run(until=lambda s: s.server.work >= 30)
    sim.server.request_stop()
    sim.run()
    assert sim.server.interrupted and 30 <= sim.server.work < 40
    final = max(sim.snapshots)
    assert set(sim.snapshots[final]) == {"server", *sim.workers}
    # the server's work at the cut is what the workers count as done: a gradient discarded at the stop was
    # counted by the server (a resumed run then fell short of the budget by the discarded ones)
    snap = sim.snapshots[final]
    assert snap["server"]["core"]["work"] == sum(snap[w]["iteration"] for w in sim.workers)
    resumed = Sim(sync, budget=60, seed=5, snapshot=sim.snapshots[final]).run()
    assert resumed.server.work >= 60


def test_policy_state_round_trips_through_json_for_every_sync_model():
    for sync in SYNC_MODES:
        sim = Sim(sync, budget=40, seed=6).run()
        state = json.loads(json.dumps(sim.policy.state()))
        fresh = sync_policy(sync, sim.workers, staleness=1)
        fresh.load_state(state)
        assert fresh.state() == sim.policy.state()
        assert fresh.pushes == sim.policy.pushes and fresh.waiting == sim.policy.waiting
