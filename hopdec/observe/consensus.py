"""Consensus distance ||x_i - x_bar|| measured while training runs, without stalling anyone.

Rounds are at iterations K, 2K, ... (``--consensus-every K``) and at the end of training (a loop of a
user's own, whose length nobody knows in advance: every K-th iteration the ranks reach, no end round;
they all end at the same iteration, :mod:`hopdec.optim.ending`, so they join the same rounds). Worker i takes
part in round k when it enters an iteration >= k (a jump may cross several rounds: it joins each with
the same parameters):

1. it copies its parameters x_i (one copy of P floats) and starts a nonblocking ``Iallreduce`` (sum) of
   the copy on a communicator of its own (``Dup``), then goes on training;
2. whenever it finishes an iteration or waits for messages anyway (:func:`hopdec.transport.waiting.
   add_idle_hook`), it tests the request; once the sum is there, x_bar = sum / n and it computes
   d_i^2 = ||x_i - x_bar||^2 (one pass over P floats) and starts an ``Igather`` of (d_i^2, when it
   entered the round's iteration, ||x_bar||^2) to rank 0 on a second communicator (so that every rank
   starts its collectives on each communicator in the same order);
3. rank 0 logs the round: mean, max and root-mean-square of d_i over workers, every d_i, ||x_bar||.

The cost to a worker is a copy and a pass over its parameters per round, plus the reduction's traffic
(about two messages of parameters); nobody waits for anybody: a round completes when the slowest worker
reaches it. Rounds wait for stragglers in memory (two arrays of P floats each), at most
``gap / K + 1`` of them on the fastest worker with token queues.
"""

import math
from collections import deque

import numpy as np


def next_round(at, every, iterations):
    """The iteration of the round after the one at ``at`` (0: the first): every K-th below ``iterations``,
    then ``iterations`` itself for the end of training; None after it. ``iterations`` None (the length is
    not known): every K-th, with no end."""
    nxt = (at // every + 1) * every if every else math.inf
    if iterations is not None:
        if at >= iterations:
            return None
        nxt = min(nxt, iterations)
    return None if nxt == math.inf else int(nxt)


class _Round:
    __slots__ = ("at", "x", "total", "req", "stage", "out", "t_enter", "entered", "d2", "norm2", "extra")

    def __init__(self, at):
        self.at, self.stage, self.extra = at, 0, None


class Consensus:
    """One rank's part in the consensus-distance rounds (collective over ``comm_sum``/``comm_gather``).

    ``write_params(out)`` copies the current parameters into a float32 array; ``on_result(event)`` (rank
    0) gets each finished round as a dict for the log.
    """

    def __init__(self, comm_sum, comm_gather, every, iterations, numel, write_params, on_result=None,
                 timeout=120.0, clock=None, on_average=None):
        """``on_average(xbar, at)`` (rank 0, optional): called with each round's average model before
        its memory is dropped; what it returns is added to the round's result (e.g. a test accuracy)."""
        import time
        self.cs, self.cg = comm_sum, comm_gather
        self.rank, self.size = comm_sum.Get_rank(), comm_sum.Get_size()
        self.every = every
        self.next_at = next_round(0, every, iterations)   # the next round to join (None: none left)
        self.active = deque()
        self.numel, self.write_params, self.on_result = numel, write_params, on_result
        self.on_average = on_average if self.rank == 0 else None
        self.timeout, self.clock = timeout, clock or time.time
        self.iterations = iterations
        self.results = []
        self._logged = None             # a resumed run: the last round the saved run logged (see resume)

    def resume(self, start, logged=None):
        """A run resumed at iteration ``start`` (a checkpoint's) joins the rounds at ``start`` and after (the
        saved run's later rounds were lost with it); ``logged``: the last round whose result the saved run
        had logged by then (rank 0: a round finishes after the iteration it measures) -- joined, not
        logged again."""
        if start > 0:
            self.next_at = next_round(start - 1, self.every, self.iterations)
        self._logged = logged

    @property
    def logged(self):
        """The last round whose result rank 0 logged (None: none yet)."""
        return self.results[-1]["at"] if self.results else self._logged

    def enter(self, iteration, now=None):
        """This worker enters ``iteration`` (``iterations``: it finished): join every round up to it."""
        if self.next_at is None or self.next_at > iteration:
            return
        from mpi4py import MPI
        now = self.clock() if now is None else now
        x = None
        while self.next_at is not None and self.next_at <= iteration:
            r = _Round(self.next_at)
            self.next_at = next_round(self.next_at, self.every, self.iterations)
            if x is None:
                x = self.write_params(np.empty(self.numel, dtype=np.float32))
            r.x, r.t_enter, r.entered = x, now, iteration
            r.total = np.empty_like(x)
            r.req = self.cs.Iallreduce(x, r.total, op=MPI.SUM)
            r.stage = 1
            self.active.append(r)

    def poll(self):
        """Advance the rounds in flight; quick, never waits."""
        from mpi4py import MPI
        for r in self.active:
            if r.stage == 1:
                if not r.req.Test():
                    break                   # later rounds cannot gather before this one does
                xbar = r.total
                xbar /= np.float32(self.size)
                diff = np.subtract(r.x, xbar)
                np.square(diff, out=diff)
                d2 = float(diff.sum(dtype=np.float64))
                norm2 = float(np.dot(xbar, xbar)) if self.rank == 0 else 0.0
                if self.on_average is not None:
                    r.extra = self.on_average(xbar, r.at)
                r.x = r.total = None         # the memory goes back now
                send = np.array([d2, r.t_enter, r.entered, norm2])
                r.out = np.empty(4 * self.size) if self.rank == 0 else None
                r.req = self.cg.Igather(send, [r.out, MPI.DOUBLE] if self.rank == 0 else None, root=0)
                r.d2 = send                  # keep the send buffer alive until the gather completes
                r.stage = 2
        while self.active and self.active[0].stage == 2 and self.active[0].req.Test():
            r = self.active.popleft()
            if self.rank == 0:
                self._result(r)

    def _result(self, r):
        if self._logged is not None and r.at <= self._logged:
            return                          # the saved run logged it (resume)
        g = r.out.reshape(self.size, 4)
        d = np.sqrt(np.maximum(g[:, 0], 0.0))
        ev = dict(at=int(r.at), time=float(g[:, 1].max()), t_first=float(g[:, 1].min()),
                  dist_mean=float(d.mean()), dist_max=float(d.max()),
                  dist_rms=float(math.sqrt(max(g[:, 0].mean(), 0.0))),
                  argmax=int(d.argmax()), norm=float(math.sqrt(max(g[0, 3], 0.0))),
                  dists=[round(float(v), 8) for v in d], end=bool(r.at == self.iterations))
        if r.extra:
            ev.update(r.extra)
        self.results.append(ev)
        if self.on_result:
            self.on_result(ev)

    def pending(self):
        return bool(self.active) or self.next_at is not None

    def close(self):
        """After training and the transport's shutdown (every rank has joined every round): finish."""
        from hopdec.transport.waiting import poll_until

        def done():
            self.poll()
            return not self.active
        poll_until(done, self.timeout, f"rank {self.rank}: the consensus-distance reductions did not "
                                       f"complete in {self.timeout:.0f} s; a peer may have died or hung")
