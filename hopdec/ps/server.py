"""The parameter server's protocol core, sans I/O: a sync policy plus the work budget, the staleness books
and the iteration gaps.

Drive it like every core (:mod:`hopdec.core`): feed :meth:`Server.start`, :meth:`Server.on_push` and
:meth:`Server.on_query` with the arrival time, and carry out what :meth:`Server.next_action` returns
(:mod:`hopdec.ps.actions`) until it says :class:`~hopdec.core.Wait` (wait for the next message) or
:class:`~hopdec.core.Finished` (every worker has been stopped).

Work budget: ``budget`` mini-batch gradients in all (``--iterations N`` is N per worker, so N * workers;
an ESync push counts its local steps; dropped gradients count too). Once it is reached, the next time the
policy sends weights every worker it would send them to -- and every waiting worker -- is stopped instead,
and every later push or query is answered with a stop; a push that comes before any such release, when
no step is collecting pushes (the one that met the budget was applied and released no one: SSP held its
pusher back), starts the stop itself, unused. A push answered with a stop is not work (its worker does not
count it, and a resumed run computes it again). BSP then runs exactly N steps. :meth:`Server.request_stop`
(Ctrl-C) lowers the budget to the work done, which stops the run the same way at the next release.

Checkpoints (``checkpoint_every`` mini-batches, ``0``: none): a consistent cut needs every worker waiting
-- none computing, no push in flight. Once the work reaches the next multiple, the server holds the
weights the policy releases until every worker is waiting (held, or kept waiting by the policy), then
emits :class:`~hopdec.ps.actions.Checkpoint` (cut number c) and sends the held weights. Every message a
worker gets from then on carries c; a worker that has not saved c saves its state before acting on it --
the state it had at the cut, since a waiting worker does nothing until a message arrives. For BSP (and
ESync rounds) every step end is such a cut, so nothing is held. When every worker has been stopped
the final cut is emitted the same way. :meth:`Server.resume` continues from a cut's :meth:`Server.state`:
it sends weights to the workers the policy had released (the others keep waiting, as they were).

A worker that dies (``--fault-tolerance``) saves nothing more, so no later cut is complete on every rank:
the last cut it is known to have saved is pinned (``pin`` in every message and cut from then on, kept
besides ``keep_from`` and later ones), so ``--resume`` can restart all the ranks from before the death.
"""

from collections import deque
from dataclasses import replace

from hopdec.core import Finished, RankView, Wait
from hopdec.errors import RunError
from hopdec.ps.actions import (ApplyDeltas, ApplyGradients, Checkpoint, DropGradient, Note, SendWeights,
                               StopWorkers)

DROPPED = -1
"""``staleness`` of a worker whose last gradient was dropped (None: none applied yet)."""
DISCARDED = -3
"""``staleness`` in the stop sent to a worker whose last gradient came after the stop and was not used
(the worker logs it as dropped and does not count it as an iteration done)."""


def work_budget(iterations, workers):
    """The server's work budget: ``--iterations N`` means N mini-batches per worker, so N x workers in all
    (the one place this is computed: the run assemblies, resume checks and checkpoint cuts ask here)."""
    return int(iterations) * int(workers)


class _Owing(RankView):
    """The workers ``server`` waits on, as they are when read (read by a transport only when its wait times
    out): those not stopped that owe it a message -- not the ones that pushed and wait for its release
    (BSP's barrier, SSP's bound, a checkpoint's cut) -- else, should none owe one, all not stopped."""

    __slots__ = ("server",)

    def __init__(self, server):
        self.server = server

    def __iter__(self):
        s = self.server
        running = [w for w in s.workers if w not in s.stopped]
        owing = [w for w in running if w not in s.policy.waiting and w not in s.held]
        return iter(owing or running)

    def __repr__(self):
        return f"owing{tuple(self)}"


class Server:
    """One parameter server: ``policy`` (:mod:`hopdec.ps.sync`) decides, this core keeps the books."""

    def __init__(self, policy, budget, checkpoints=False, checkpoint_every=0):
        """``checkpoints``: emit the final cut when every worker has been stopped; ``checkpoint_every``:
        also a cut every that many mini-batches (0: none)."""
        if budget < 1:
            raise ValueError(f"work budget must be >= 1, got {budget}")
        self.policy = policy
        self.budget = int(budget)
        self.work = 0                                   # mini-batch gradients received so far
        self.stopping = False
        self.interrupted = False                        # request_stop() ended the run early
        self.stopped = set()
        self.pending_step = {}                          # worker -> version its pushed buffer was computed on
        self.last_staleness = dict.fromkeys(policy.workers)
        self.applied = 0
        self.dropped = 0
        self.discarded = 0                              # pushes that came after the stop, not used (this leg)
        self.share = self.budget / len(policy.workers)  # each worker's part of the budget (its --iterations)
        self.work_by = dict.fromkeys(policy.workers, 0)
        self.failed = []                                # workers that died (--fault-tolerance), in order
        self.failures = []                              # what each death left: worker, work, budget, version
        self._out = deque()
        self._wait = None                               # see _waiting_for_pushes
        self.checkpoints = bool(checkpoints or checkpoint_every)
        self.checkpoint_every = int(checkpoint_every)   # mini-batches between cuts (0: only the final one)
        self.cuts = 0                                   # cuts emitted so far (the last one's number)
        self.next_cut = self.checkpoint_every
        self.holding = False                            # waiting for every worker to wait, for a cut
        self.held = set()                               # workers whose release is held for the cut
        self.told = dict.fromkeys(policy.workers, 0)    # cut carried by the last message to each worker
        self.saved = dict.fromkeys(policy.workers, 0)   # cut each worker is known to have saved
        self.pin = 0                                    # a dead worker's last saved cut, kept (0: none)

    @property
    def workers(self):
        return self.policy.workers

    @property
    def unfinished(self):
        """Pushes counted as work but neither applied nor dropped: at the end, those waiting in a step the stop
        left unfinished (``--sync backup``: the budget, which counts dropped gradients, can be met while the
        next step collects). A resumed run completes that step with them."""
        return len(self.pending_step)

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
        past = self.budget_reached                      # the budget was met before this push came
        self.saved[worker] = self.told[worker]          # it saved that cut before computing this
        if past and not self.stopping and not self.pending_step:
            # the push that met the budget was applied and released no one (its pusher is held back, e.g.
            # by SSP's bound): stop now rather than at a later release, or this gradient would be applied
            # past it. (With a step still collecting pushes -- BSP, ESync's round -- that step completes
            # and its release stops everyone, as before: a step is never cut in two.)
            self._begin_stop()
            self._stop(self.policy.waiting | self.held)
            self.held, self.holding = set(), False
        if self.stopping:
            # its gradient is not used, nor counted as work: the worker does not count it either, and a
            # resumed run computes it again (counted, the budget lost it: fewer gradients than asked)
            self.discarded += 1
            self._stop([worker], discarded=True)
            return
        self.work += max(1, int(local_steps))
        self.work_by[worker] += max(1, int(local_steps))
        self.pending_step[worker] = int(step)
        self._carry(self.policy.on_push(worker, step, now, local_steps=local_steps))

    def on_query(self, worker, k, c, now):
        """ESync state query: ``k`` local steps done this round; ``c`` the last step's time (None: unknown)."""
        self.saved[worker] = self.told[worker]
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
        if self.policy.n == 1:                      # a failure as input: one line, not an internal error
            raise RunError(f"the last worker (rank {worker}) died after {self.work_by[worker]} mini-batches; "
                           f"the parameter server cannot train without workers")
        unfinished = max(0.0, self.share - self.work_by[worker])
        self.failed.append(worker)
        self.stopped.add(worker)                    # never sent anything again
        self.pending_step.pop(worker, None)
        self.held.discard(worker)                   # a cut waits only for the living
        last = self.saved.pop(worker, 0)            # the latest cut it has: keep it, the last one every rank has
        if last:
            self.pin = min(self.pin, last) if self.pin else last
        self.told.pop(worker, None)
        self.budget = max(1, int(round(self.budget - unfinished)))
        self.failures.append({"worker": worker, "work": self.work_by[worker], "budget": self.budget,
                              "version": self.policy.version})
        self._out.append(Note("failure", dict(self.failures[-1])))
        self._carry(self.policy.remove_worker(worker, now))
        if self.budget_reached and not self.stopping:
            self.stopping = True                    # the others already did the rest of the work
            if self.checkpoints:
                self.cuts += 1                      # the final cut, as in _carry
            self._out.append(Note("stop", {"work": self.work, "version": self.policy.version}))
            self._stop(self.policy.waiting | self.held)
            self.held, self.holding = set(), False

    def request_stop(self):
        """End the run early (Ctrl-C): the budget becomes the work done, so the next release stops every
        worker (after the current BSP step or ESync round) and the final cut follows. Idempotent."""
        if not self.stopping and self.budget > self.work:
            self.budget = max(self.work, 1)
            self.interrupted = True

    # ---- checkpoints ----
    def state(self):
        """The books at a cut, JSON-ready (the weights, optimizer and pushed buffers are the driver's)."""
        return {"work": self.work, "applied": self.applied, "dropped": self.dropped, "cuts": self.cuts,
                "pending_step": {str(w): s for w, s in self.pending_step.items()},
                "last_staleness": {str(w): s for w, s in self.last_staleness.items()},
                "policy": self.policy.state()}

    def resume(self, state, now, shift=0.0):
        """Continue from :meth:`state` instead of :meth:`start`: weights go to every worker the policy had
        released (they were held, or stopped, at the cut); the others go on waiting for the policy.
        ``shift``: seconds to add to the policy's recorded times (the time the run was down)."""
        self.work, self.applied, self.dropped = int(state["work"]), int(state["applied"]), int(state["dropped"])
        self.cuts = int(state["cuts"])
        self.told = dict.fromkeys(self.workers, self.cuts)
        self.saved = dict.fromkeys(self.workers, self.cuts)
        self.pending_step = {int(w): int(s) for w, s in state["pending_step"].items()}
        self.last_staleness = {int(w): s for w, s in state["last_staleness"].items()}
        self.policy.load_state(state["policy"], shift=shift)
        if self.checkpoint_every:
            self.next_cut = (self.work // self.checkpoint_every + 1) * self.checkpoint_every
        go = tuple(w for w in self.workers if w not in self.policy.waiting)
        if not go:
            raise RuntimeError("resume: the policy released no worker at this cut")
        self._carry([SendWeights(go, self.policy.version, "resume")])

    def _keep_from(self):
        if not self.cuts:           # no cut yet: every worker's is 0 (no pass over them at every send)
            return 0
        return min(self.saved.values(), default=self.cuts)

    def _maybe_cut(self):
        """Emit the cut once every worker waits: held by us, or kept waiting by the policy."""
        if not self.holding or len(self.held | self.policy.waiting) < self.policy.n:
            return
        self.cuts += 1
        self.next_cut = (self.work // self.checkpoint_every + 1) * self.checkpoint_every
        self._out.append(Checkpoint(self.cuts, self.policy.version, self.work, keep_from=self._keep_from(),
                                    pin=self.pin))
        go = tuple(w for w in self.workers if w in self.held)
        self.held, self.holding = set(), False
        if go:
            self._send(SendWeights(go, self.policy.version, "checkpoint"))

    def _send(self, a):
        a = replace(a, gaps=self.gaps_of(a.workers),
                    staleness=tuple(self.last_staleness[w] for w in a.workers),
                    cut=self.cuts, keep_from=self._keep_from(), pin=self.pin)
        for w in a.workers:
            self.told[w] = self.cuts
        self._out.append(a)

    # ---- actions ----
    def next_action(self):
        if self._out:
            return self._out.popleft()
        if len(self.stopped) == len(self.work_by):
            return Finished()
        return self._waiting_for_pushes()

    def _waiting_for_pushes(self):
        """The Wait for pushes from the workers that owe one (:class:`_Owing`, read when it is read: a
        tuple of them at every wait cost a pass over every worker per push)."""
        if self._wait is None:
            self._wait = Wait(_Owing(self), "pushes")
        return self._wait

    def gaps_of(self, workers):
        """How many pushes each of ``workers`` is ahead of the slowest worker (the slowest found once: a
        release of all n workers, BSP's every round, was O(n^2))."""
        pushes, low = self.policy.pushes, self.policy.slowest_pushes()
        return tuple(pushes[w] - low for w in workers)

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
                    self._begin_stop()
                if self.stopping:
                    self._stop(set(a.workers) | pol.waiting | self.held)
                    self.held, self.holding = set(), False
                    continue
                if self.checkpoint_every and self.work >= self.next_cut:
                    self.holding = True
                if self.holding:
                    self.held.update(a.workers)
                    continue
                self._send(a)
                continue
            self._out.append(a)
        if self.holding:
            self._maybe_cut()

    def _begin_stop(self):
        """The budget is met: from now on every release and every push is answered with a stop."""
        self.stopping = True
        if self.checkpoints:
            self.cuts += 1                              # the final cut: every stop message carries it
        self._out.append(Note("stop", {"work": self.work, "version": self.policy.version}))

    def _stop(self, workers, discarded=False):
        new = self.policy.in_order(w for w in workers if w not in self.stopped)
        if new:
            self.stopped.update(new)
            for w in new:
                self.told[w] = self.cuts
            # a worker whose push waits in a step the stop leaves unfinished: its gradient was not applied
            # (None, as before any was; a resumed run's step still uses it, :meth:`unfinished`)
            self._out.append(StopWorkers(new, self.policy.version, cut=self.cuts, keep_from=self._keep_from(),
                                         pin=self.pin,
                                         discarded=new if discarded else (),
                                         staleness=tuple(DISCARDED if discarded else None if w in self.pending_step
                                                         else self.last_staleness[w] for w in new)))
            if len(self.stopped) == len(self.work_by) and self.checkpoints:   # failed ones included
                self._out.append(Checkpoint(self.cuts, self.policy.version, self.work, final=True,
                                            keep_from=self._keep_from(), pin=self.pin))
