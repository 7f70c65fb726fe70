"""The all-reduce mode in virtual time: the same cores (:mod:`hopdec.allreduce`) and the same loop
(:mod:`hopdec.runtime.allreduce_loop`) as under MPI, with the reduction carried out as a ring
all-reduce on the simulated network (:mod:`hopdec.sim.network`).

Cost model of one all-reduce of ``B`` bytes over ``n`` workers (the bandwidth-optimal ring that NCCL and
Open MPI use for large messages; Patarasuk and Yuan, *Bandwidth optimal all-reduce algorithms for
clusters of workstations*, 2009): ``2(n - 1)`` steps; in each, worker i sends a chunk of ``B/n`` bytes to
worker i + 1. Worker i takes step s once it has entered the all-reduce and (s > 0) received step s - 1
from worker i - 1, so the reduction starts when the slowest worker arrives, and each chunk shares the
NICs like any other message (latency per step, bandwidth shares, slow links). A worker's all-reduce
ends when it has received its last chunk. Sums cost no time (as the simulator's Reduce). With
``--math`` the workers' real gradients are summed, so every worker applies the same mean.

Full-duplex NICs (the default) carry one ring transfer each way at a time, so every chunk moves at its
pair's rate alone and the network model reduces to a max-plus recursion over the steps, computed with
numpy once the last worker has entered (:func:`ring_ends`): O(n) vector work per step instead of n events,
which made a 1024-worker iteration take seconds. Half duplex (a NIC's sends and receives share it) keeps
the chunk-by-chunk events on the network model; tests check both give the same times.
"""

from functools import partial

import numpy as np

from hopdec.allreduce.worker import Worker
from hopdec.core import ComputeGradient, Deadlock, Wait
from hopdec.runtime.allreduce_loop import worker_loop
from hopdec.runtime.backend import check_loss
from hopdec.sim.backends import compute_record, step_of
from hopdec.sim.events import EventQueue
from hopdec.sim.gap import GapMeter
from hopdec.sim.network import Network


def ring_ends(entered, free, chunk_s, latency, steps):
    """When each worker has received its last chunk of a ring all-reduce, and when each pair's last chunk
    left: ``(arrived, left)``. ``entered[i]``: when worker i entered it; ``free[i]``: when the pair i -> i+1
    is free (its previous message left); ``chunk_s[i]``: a chunk's time on that pair alone, ``latency[i]``
    its latency. Worker i starts step s once it has entered, received step s - 1 and its previous chunk
    has left (one message at a time per pair, as :class:`~hopdec.sim.network.Network`); the chunk leaves
    ``chunk_s[i]`` later and arrives ``latency[i]`` after that -- the network model's times, to the bit.

    >>> a, d = ring_ends(np.zeros(3), np.zeros(3), np.ones(3), np.zeros(3), 4)
    >>> a.tolist(), d.tolist()
    ([4.0, 4.0, 4.0], [4.0, 4.0, 4.0])
    """
    d = np.maximum(np.asarray(free, dtype=np.float64), entered)
    reach = np.empty_like(d)
    chunk_s, latency = _uniform(chunk_s), _uniform(latency)
    head = d[1:]                            # (a view: pair i -> i+1 feeds worker i + 1)
    for s in range(steps):
        if s:       # after step s - 1 of pair i left, and worker i received its step s - 1 (max is exact;
            np.add(d, latency, out=reach)                 # entered needs no second look: d >= entered)
            np.maximum(head, reach[:-1], out=head)
            if reach[-1] > d[0]:
                d[0] = reach[-1]
        np.add(d, chunk_s, out=d)
    np.add(d, latency, out=reach)
    return np.roll(reach, 1), d


def _uniform(values):
    """``values`` as one float when they are all equal (a ring of like links: numpy adds a scalar about
    17% faster than an array, to the same bits), else as they are."""
    values = np.asarray(values, dtype=np.float64)
    return float(values[0]) if values.size and (values == values[0]).all() else values


class TimingBackend:
    """No tensors: compute says how long it takes; there is no gradient (None: the loop scales nothing)."""

    def __init__(self, rank, compute_time):
        self.rank, self.compute_time, self.duration = rank, compute_time, 0.0

    def compute(self, iteration):
        self.duration, factor = step_of(self.compute_time, self.rank, iteration)
        return compute_record(self.duration, factor)

    def gradient(self):
        return None

    def load_gradient(self, arr):
        pass

    def apply(self, iteration):
        pass


class MathBackend(TimingBackend):
    """A real trainer (:class:`~hopdec.ml.trainer.LocalTrainer`), virtual time: the gradient is a view of
    its flat gradient, reduced in place."""

    def __init__(self, trainer, rank, compute_time):
        super().__init__(rank, compute_time)
        self.t = trainer

    def compute(self, iteration):
        loss = self.t.compute()
        check_loss(loss, iteration, f"rank {self.rank}: ")     # (as hopdec train's ranks stop)
        self.duration, factor = step_of(self.compute_time, self.rank, iteration)
        return compute_record(self.duration, factor, loss)

    def gradient(self):
        return self.t.flat.grad.numpy()

    def apply(self, iteration):
        self.t.apply(iteration)


class _IO:
    """Worker ``rank``'s end of the simulated ring all-reduce (the loop's transport)."""

    def __init__(self, sim, rank):
        self.sim, self.rank = sim, rank
        self.bytes_sent = 0

    def start(self, iteration, grad):
        self.sim._entered_reduce(self.rank, iteration, grad)


class AllReduceSim:
    """Run ``n`` all-reduce cores in virtual time. ``compute_time(rank, iteration)``: virtual seconds of a
    mini-batch (or seconds and slowdown factor); ``network``: a :class:`~hopdec.sim.network.LinkModel`;
    ``message_bytes``: one worker's gradient; ``backend_factory(rank)``: a math backend (None: timing
    only); ``on_record(rank, rec)``: each iteration's log record; ``closed_form``: the ring's times by
    :func:`ring_ends` (default: with full-duplex NICs) or by the network model's events (False)."""

    def __init__(self, n, iterations, compute_time, network=None, message_bytes=0, backend_factory=None,
                 on_record=None, closed_form=None):
        self.n = n
        self.q = EventQueue()
        self.net = Network(self.q, n, network)
        self.chunk = float(message_bytes) / n
        self.steps = 2 * (n - 1)
        self.cores = [Worker(r, n, iterations) for r in range(n)]
        self.ios = [_IO(self, r) for r in range(n)]
        self.backends = [backend_factory(r) if backend_factory else TimingBackend(r, compute_time)
                         for r in range(n)]
        clock = lambda: self.q.now  # noqa: E731
        self.loops = [worker_loop(c, io, b, clock=clock, step=True,
                                  on_record=None if on_record is None else (lambda rec, r=c.rank: on_record(r, rec)))
                      for c, io, b in zip(self.cores, self.ios, self.backends)]
        self.done = [False] * n
        self.finished = 0
        self.math = backend_factory is not None
        self._grads = {}                   # iteration -> {worker: its gradient (a view), until reduced}
        self._sums = {}                    # iteration -> the sum (--math), until every worker has it
        self._iter = [None] * n
        self._got = [0] * n                # ring steps received by each worker in this reduction
        self._in = [False] * n             # entered this reduction
        self._sent = [0] * n               # ring steps sent by each worker in this reduction
        self.gap = GapMeter(n, self.q)
        self.bytes = 0.0
        # the recursion (ring_ends) where the network model allows it: full duplex, a ring of 2 or more
        m = self.net.model
        self.closed_form = m.duplex == "full" and self.steps > 0 if closed_form is None else bool(closed_form)
        if self.closed_form:
            routes = [self.net._route(r, (r + 1) % n) for r in range(n)]
            # a chunk's time alone on its pair, as Network._solo_send rates it (one transfer per NIC)
            self._chunk_s = np.array([self.chunk / (rest if rest < self.net.cap[r] else self.net.cap[r])
                                      for r, (_, _, _, _, _, rest) in enumerate(routes)], dtype=np.float64)
            self._lat = np.array([lat for _, _, lat, _, _, _ in routes], dtype=np.float64)
            self._free = np.zeros(n)           # when each pair's last chunk left
            self._entry = {}                   # iteration -> entry time per worker (NaN: not yet)
            self._waiting = {}                 # iteration -> workers not yet entered

    @property
    def now(self):
        return self.q.now

    @property
    def max_gap(self):
        return self.gap.max_gap

    def run(self):
        for r in range(self.n):
            self._advance(r)
        self.q.run()
        if self.finished < self.n:
            raise Deadlock(f"no event left but workers {[r for r in range(self.n) if not self.done[r]]} "
                           f"did not finish")
        return self

    def _advance(self, r):
        for a in self.loops[r]:
            t = type(a)
            if t is Wait:
                return
            if t is ComputeGradient:
                self.q.at(self.q.now + self.backends[r].duration, lambda r=r: self._advance(r))
                return
            if t.__name__ == "Enter":
                self.gap.entered(r, a.iteration)
        self.done[r] = True
        self.finished += 1

    # ---- the ring ----
    def _entered_reduce(self, r, iteration, grad):
        self._iter[r] = iteration
        self._grads.setdefault(iteration, {})[r] = grad
        self._in[r] = True
        if self.steps == 0:
            self.q.at(self.q.now, lambda: self._reduced(r))
            return
        if self.closed_form:
            self._entered_ring(r, iteration)
            return
        self._send(r)

    def _entered_ring(self, r, k):
        """The closed form: once every worker has entered reduction ``k``, each one's end is known (every
        worker's last chunk passed through every other worker, so none ends before the last entry)."""
        sent = self.chunk * self.steps
        self.bytes += sent
        self.ios[r].bytes_sent += sent
        self.net.transfers += self.steps
        self.net.bytes += sent
        when = self._entry.get(k)
        if when is None:
            when = self._entry[k] = np.full(self.n, np.nan)
            self._waiting[k] = self.n
        when[r] = self.q.now
        self._waiting[k] -= 1
        if self._waiting[k]:
            return
        del self._entry[k], self._waiting[k]
        arrived, self._free = ring_ends(when, self._free, self._chunk_s, self._lat, self.steps)
        for w, t in enumerate(arrived.tolist()):
            self.q.at(t, partial(self._reduced, w))

    def _send(self, r):
        """Worker ``r`` takes every ring step it may (it has entered; it received the step before)."""
        while self._in[r] and self._sent[r] < self.steps and self._got[r] >= self._sent[r]:
            self._sent[r] += 1
            self.bytes += self.chunk
            self.ios[r].bytes_sent += self.chunk
            self.net.send(r, ((r + 1) % self.n,), self.chunk, self._arrived)

    def _arrived(self, d):
        self._got[d] += 1
        if self._got[d] == self.steps:
            self._reduced(d)
        else:
            self._send(d)

    def _reduced(self, r):
        k = self._iter[r]
        grads = self._grads[k]
        if self.math:
            if k not in self._sums:       # the first worker done: every gradient of k is in (the ring
                self._sums[k] = np.sum([grads[w] for w in range(self.n)], axis=0, dtype=np.float32)
            np.copyto(grads[r], self._sums[k])
        del grads[r]
        if not grads:                     # needs them all), and no worker has overwritten its own yet
            self._sums.pop(k, None)
            del self._grads[k]
        self._in[r], self._got[r], self._sent[r] = False, 0, 0
        self.cores[r].on_reduced(k)
        self._advance(r)
