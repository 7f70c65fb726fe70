"""The parameter server's protocol core, sans I/O: a sync policy plus the work budget, the staleness books
and the iteration gaps.

Drive it like every core (:mod:`hopdec.core`): feed :meth:`Server.start`, :meth:`Server.on_push` and
:meth:`Server.on_query` with the arrival time, and carry out what :meth:`Server.next_action` returns
(:mod:`hopdec.ps.actions`) until it says :class:`~hopdec.core.Wait` (wait for the next message) or
:class:`~hopdec.core.Finished` (every worker has been stopped).

Work budget: ``budget`` mini-batch gradients in all (``--iterations N`` is N per worker, so N * workers;
an ESync push counts its local steps; dropped gradients count too). Once it is reached, the next time the
policy sends weights every worker it would send them to -- and every waiting worker -- is stopped instead,
and every later push or query is answered with a stop. BSP then runs exactly N steps.
"""

from collections import deque
from dataclasses import replace

from hopdec.core import Finished, Wait
from hopdec.ps.actions import ApplyDeltas, ApplyGradients, DropGradient, Note, SendWeights, StopWorkers

DROPPED = -1
"""``staleness`` of a worker whose last gradient was dropped (None: none applied yet)."""


class Server:
    """One parameter server: ``policy`` (:mod:`hopdec.ps.sync`) decides, this core keeps the books."""

    def __init__(self, policy, budget):
        if budget < 1:
            raise ValueError(f"work budget must be >= 1, got {budget}")
        self.policy = policy
        self.budget = int(budget)
        self.work = 0                                   # mini-batch gradients received so far
        self.stopping = False
        self.stopped = set()
        self.pending_step = {}                          # worker -> version its pushed buffer was computed on
        self.last_staleness = dict.fromkeys(policy.workers)
        self.applied = 0
        self.dropped = 0
        self.share = self.budget / len(policy.workers)  # each worker's part of the budget (its --iterations)
        self.work_by = dict.fromkeys(policy.workers, 0)
        self.failed = []                                # workers that died (--fault-tolerance), in order
        self.failures = []                              # what each death left: worker, work, budget, version
        self._out = deque()

    @property
    def workers(self):
        return self.policy.workers

    @property
    def budget_reached(self):
        return self.work >= self.budget

    # ---- events ----
    def start(self, now):
        """Training begins: every worker is sent the initial weights."""
        self._carry(self.policy.start(now))

    def on_push(self, worker, step, now, local_steps=1):
        """``worker`` pushed a gradient computed on version ``step`` (ESync: a model difference after
        ``local_steps`` local steps, ``step`` = its round)."""
        self.work += max(1, int(local_steps))
        self.work_by[worker] += max(1, int(local_steps))
        if self.stopping:
            self._stop([worker])
            return
        self.pending_step[worker] = int(step)
        self._carry(self.policy.on_push(worker, step, now, local_steps=local_steps))

    def on_query(self, worker, k, c, now):
        """ESync state query: ``k`` local steps done this round; ``c`` the last step's time (None: unknown)."""
        if self.stopping:
            self._stop([worker])
            return
        self._carry(self.policy.on_query(worker, k, c, now))

    def on_worker_failed(self, worker, now):
        """``worker`` died (``--fault-tolerance``): training goes on with the others. Its gradient not yet
        applied is discarded, the budget loses its unfinished share (so BSP still runs N steps), and
        the policy releases whoever waited only for it (:meth:`hopdec.ps.sync.base.Policy.remove_worker`).
        A worker already stopped, or already failed, changes nothing."""
        if worker in self.stopped or worker in self.failed:
            return
        if worker not in self.policy.pushes:
            raise RuntimeError(f"no worker {worker} (workers are {list(self.workers)})")
        unfinished = max(0.0, self.share - self.work_by[worker])
        self.failed.append(worker)
        self.stopped.add(worker)                    # never sent anything again
        self.pending_step.pop(worker, None)
        self.budget = max(1, int(round(self.budget - unfinished)))
        self.failures.append({"worker": worker, "work": self.work_by[worker], "budget": self.budget,
                              "version": self.policy.version})
        self._out.append(Note("failure", dict(self.failures[-1])))
        self._carry(self.policy.remove_worker(worker, now))
        if self.budget_reached and not self.stopping:
            self.stopping = True                    # the others already did the rest of the work
            self._out.append(Note("stop", {"work": self.work, "version": self.policy.version}))
            self._stop(self.policy.waiting)

    # ---- actions ----
    def next_action(self):
        if self._out:
            return self._out.popleft()
        if len(self.stopped) == len(self.work_by):
            return Finished()
        return Wait(tuple(w for w in self.workers if w not in self.stopped), "pushes")

    def gap_of(self, worker):
        """How many pushes ``worker`` is ahead of the slowest worker."""
        return self.policy.pushes[worker] - self.policy.slowest_pushes()

    def _carry(self, actions):
        pol = self.policy
        for a in actions:
            if isinstance(a, (ApplyGradients, ApplyDeltas)):
                workers = [w for w, _ in a.parts]
                a = replace(a, steps=tuple(self.pending_step.pop(w) for w in workers))
                if isinstance(a, ApplyGradients):
                    for w, s in zip(workers, a.staleness):
                        self.last_staleness[w] = int(s)
                else:
                    for w in workers:
                        self.last_staleness[w] = 0
                self.applied += 1
            elif isinstance(a, DropGradient):
                self.last_staleness[a.worker] = DROPPED
                self.pending_step.pop(a.worker, None)
                self.dropped += 1
            elif isinstance(a, SendWeights):
                if self.budget_reached and not self.stopping:
                    self.stopping = True
                    self._out.append(Note("stop", {"work": self.work, "version": pol.version}))
                if self.stopping:
                    self._stop(set(a.workers) | pol.waiting)
                    continue
                a = replace(a, gaps=tuple(self.gap_of(w) for w in a.workers),
                            staleness=tuple(self.last_staleness[w] for w in a.workers))
            self._out.append(a)

    def _stop(self, workers):
        new = tuple(w for w in self.workers if w in set(workers) and w not in self.stopped)
        if new:
            self.stopped.update(new)
            self._out.append(StopWorkers(new, self.policy.version))
