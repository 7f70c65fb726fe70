"""The Hop worker cores in one process, interleaved by a seeded random scheduler (for property tests); the
third executor of a run assembly (:meth:`InProcNetwork.of`), beside MPI ranks and the simulator.

Deterministic for a seed, so every interleaving a test finds can be replayed. Messages are delivered in an
order the scheduler picks (it may reorder messages between the same pair, which MPI never does, so the
core is tested under weaker assumptions than it gets). Worker speeds are relative weights; a weight of 0
is a worker that never advances. Used by the tests to check the protocol's invariants after every step.
"""

import random

import numpy as np

from hopdec.core import Deadlock, Wait
from hopdec.hop.worker import Worker
from hopdec.runtime.hop_loop import worker_loop
from hopdec.transport.message import NO_GRANT, split_grants


class InProcIO:
    """One worker's end of the in-process network. Handles are ints naming held payloads. With
    ``carries_grants`` it carries token grants in updates as the MPI transport does
    (:func:`hopdec.transport.message.split_grants`): delivered with the update, just before it."""

    def __init__(self, net, rank, carries_grants=False):
        self.net, self.rank = net, rank
        self.held = {}
        self.freed = set()
        self._next = 0
        self.carries_grants = carries_grants

    def send_update(self, iteration, dests, fill, grants=None):
        data = fill(None)                             # the snapshot a real Isend buffer would hold
        carried, rest = NO_GRANT, ()
        if grants:
            grantees = set(self.net.cores[self.rank].view.in_neighbors)
            carried, rest = split_grants(dests, grants, grantees)
            if carried != NO_GRANT:
                self.net.grants_carried += len(grants) - len(rest)
        for d in dests:
            self.net.in_flight.append((d, "update", (self.rank, iteration, data, carried)))
            self.net.updates_sent_to[d] += 1
        if rest:
            self.send_grants(rest)

    def send_grants(self, grants):
        for d, count in grants:
            self.net.in_flight.append((d, "grant", (self.rank, count)))

    def deliver_update(self, sender, iteration, data):
        h = (self.rank, self._next)
        self._next += 1
        self.held[h] = data
        return h

    def payload(self, handle):
        if handle in self.freed:
            raise AssertionError(f"worker {self.rank} used update {handle} after freeing it")
        return self.held[handle]

    def release(self, handles):
        for h in handles:
            if h in self.freed or h not in self.held:
                raise AssertionError(f"worker {self.rank} freed update {h} twice")
            del self.held[h]
            self.freed.add(h)


class ToyBackend:
    """A tiny model: x in R^d pulled towards a per-worker target (quadratic loss), plain SGD."""

    def __init__(self, rank, dim=4, lr=0.1, seed=0):
        rng = np.random.default_rng(seed + 1000 * rank)
        self.x = np.zeros(dim)
        self.target = rng.normal(size=dim)
        self.lr = lr
        self.grad = None
        self.last_compute = None

    def write_params(self, out=None):
        if out is None:
            return self.x.copy()
        out[:] = self.x
        return out

    def compute(self, iteration):
        self.last_compute = iteration
        self.grad = self.x - self.target
        return {"loss": float(0.5 * self.grad @ self.grad), "compute_s": 0.0}

    def reduce(self, pairs):
        out = np.zeros_like(self.x)
        for arr, w in pairs:
            out += w * (self.x if arr is None else arr)
        self.x = out

    def apply(self, iteration):
        self.x = self.x - self.lr * self.grad


class InProcNetwork:
    """Runs one :class:`hopdec.hop.worker.Worker` per view under a seeded random scheduler."""

    def __init__(self, views, cfg, seed=0, speeds=None, backend_factory=None, check=None, stall=None,
                 carry_grants=False, compress=None, numel=4):
        """``speeds``: relative scheduling weights, a list or a function ``(rank, iteration) -> weight``
        (so a slowdown can be drawn per iteration, like Hop sec. 7.3.1); ``stall={rank: k}``: that
        worker sends its update of iteration k, computes, and then never moves again (a stuck
        worker, Hop Figure 3); ``carry_grants``: grants ride in updates where they can (as over MPI);
        ``compress``: a ``--compress`` spec for vectors of ``numel`` (:mod:`hopdec.sim.compressed`; each
        pair's updates are then delivered in order, as MPI does)."""
        self.cores = [Worker(v, cfg) for v in views]
        self.fifo = compress is not None and str(compress) != "none"
        if self.fifo:
            from hopdec.sim.compressed import CodedInProcIO
            self.ios = [CodedInProcIO(self, v.rank, carry_grants, compress, numel) for v in views]
        else:
            self.ios = [InProcIO(self, v.rank, carry_grants) for v in views]
        make = backend_factory or (lambda r: ToyBackend(r, seed=seed))
        self.backends = [make(v.rank) for v in views]
        self.records = [[] for _ in views]
        self.loops = [worker_loop(c, io, b, on_record=self.records[c.rank].append, step=True,
                                  clock=lambda: float(self.steps))
                      for c, io, b in zip(self.cores, self.ios, self.backends)]
        self.blocked = [False] * len(views)
        self.done = [False] * len(views)
        self.in_flight = []
        self.updates_sent_to = [0] * len(views)
        self.rng = random.Random(seed)
        if callable(speeds):
            self.speed = lambda r: speeds(r, self.cores[r].iteration)
        else:
            fixed = list(speeds) if speeds is not None else [1.0] * len(views)
            self.speed = lambda r: fixed[r]
        self.check = check
        self.stall = dict(stall or {})
        self.steps = 0
        self.grants_carried = 0             # grants that rode in updates (``carry_grants``)
        self.dead = set()
        self.heals = []                     # (step, failed ranks, healed graph)

    @classmethod
    def of(cls, run, seed=0, speeds=None, check=None):
        """Execute a run assembly (:class:`hopdec.modes.HopRun` with its workload) under this scheduler:
        its cores, and its real trainers as backends (compute takes no time here, only turns)."""
        from hopdec.sim.backends import MathBackend
        trainers = {r: run.trainer(r) for r in run.workers}
        net = cls(run.views, run.cfg, seed=seed, speeds=speeds, check=check,
                  backend_factory=lambda r: MathBackend(trainers[r], r, lambda w, i: 0.0),
                  compress=run.cfg.compress, numel=trainers[run.workers[0]].numel)
        net.trainers = trainers
        return net

    def alive_cores(self):
        return {c.rank: c for c in self.cores if c.rank not in self.dead}

    def fail(self, ranks, graph):
        """Workers ``ranks`` die now. As under MPI with fault tolerance: every message in flight is lost
        (the communicator is revoked), the survivors heal ``graph`` (:func:`hopdec.topology.heal.heal_graph`)
        and reconfigure their cores from their current iterations. Returns the healed graph."""
        from hopdec.hop.heal import heal
        self.dead.update(ranks)
        for r in ranks:
            self.done[r] = True
        for dst, kind, _ in self.in_flight:
            if kind == "update":
                self.updates_sent_to[dst] -= 1
        self.in_flight = []
        alive = self.alive_cores()
        healed, _ = heal(graph, ranks, alive, {r: c.iteration for r, c in alive.items()})
        for r in healed.nodes:
            self.blocked[r] = False
            if self.done[r] and self.cores[r].catching_up:  # finished before the death: it sends again
                self.done[r] = False                        # what was lost, as a rank does at shutdown
                self.loops[r] = worker_loop(self.cores[r], self.ios[r], self.backends[r], step=True,
                                            clock=lambda: float(self.steps))
        self.heals.append((self.steps, sorted(ranks), healed))
        return healed

    def _deliver(self, idx):
        if self.fifo and self.in_flight[idx][1] == "update":     # the pair's oldest update (compressed streams)
            dst, _, (src, *_) = self.in_flight[idx]
            idx = next(i for i, (d, k, p) in enumerate(self.in_flight) if d == dst and k == "update" and p[0] == src)
        dst, kind, payload = self.in_flight.pop(idx)
        core = self.cores[dst]
        if kind == "update":
            sender, iteration, data, carried = payload
            if carried != NO_GRANT:
                core.on_grant(sender, carried)
            core.on_update(sender, iteration, self.ios[dst].deliver_update(sender, iteration, data))
        else:
            core.on_grant(*payload)
        self.blocked[dst] = False

    def step(self):
        """One scheduling decision: deliver a message or let one worker do one action."""
        runnable = [r for r in range(len(self.cores))
                    if not self.done[r] and not self.blocked[r] and not self._stalled(r)]
        weights = [self.speed(r) for r in runnable]
        runnable = [r for r, w in zip(runnable, weights) if w > 0]
        weights = [w for w in weights if w > 0]
        if not runnable and not self.in_flight:
            return False                                  # quiet: everyone done, stuck or blocked
        if self.in_flight and (not runnable or self.rng.random() < 0.5):
            self._deliver(self.rng.randrange(len(self.in_flight)))
        else:
            r = self.rng.choices(runnable, weights=weights)[0]
            try:
                got = next(self.loops[r])
            except StopIteration:
                self.done[r] = True
            else:
                if isinstance(got, Wait):
                    self.blocked[r] = True
        self.steps += 1
        if self.check:
            self.check(self)
        return True

    def _stalled(self, r):
        return r in self.stall and getattr(self.backends[r], "last_compute", None) == self.stall[r]

    def run(self, max_steps=1_000_000, until_done=True):
        """Step until quiet. With ``until_done``, raise :class:`Deadlock` unless every worker finished."""
        while self.step():
            if self.steps > max_steps:
                raise RuntimeError(f"no end after {max_steps} steps: {self.describe()}")
        if until_done and not all(self.done):
            raise Deadlock(self.describe())
        return self

    def iterations(self):
        return [c.iteration for c in self.cores]

    def describe(self):
        return "; ".join(f"worker {c.rank} at {c.iteration}{' done' if self.done[c.rank] else ''}"
                         f"{' blocked' if self.blocked[c.rank] else ''}" for c in self.cores)
