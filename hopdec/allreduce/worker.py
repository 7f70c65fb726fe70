"""One worker of synchronous all-reduce data parallelism, sans I/O: events in, actions out.

One iteration k::

    Enter(k) -> ComputeGradient(k) -> AllReduce(k) -> Wait ... -> ApplyGradient(k)

:class:`AllReduce` adds ``weight`` (1/n) times this worker's gradient to a sum over all n workers, so the
sum is the mean gradient -- the division before the reduction that DDP's default communication hook
makes -- and every worker applies the same mean with the same optimizer, so the parameters stay
identical. The driver reports the completed reduction with :meth:`Worker.on_reduced`. No worker enters
k + 1 before every worker has contributed its iteration-k gradient, so two workers are never more than
one iteration apart (:data:`GAP_BOUND`).

Cuts, checkpoints and stops follow the decentralized worker's interface (:attr:`Worker.position`,
:meth:`Worker.stop_at`, :meth:`Worker.resume_at`, :class:`hopdec.hop.actions.Enter`), so the same
drivers save and stop it: Enter(K) on every worker is a consistent cut (the parameters are the same
everywhere, nothing is in flight, each worker's optimizer and data position are those of K applied
steps), and :func:`hopdec.hop.cuts.checkpoint_due` says which K.
"""

from dataclasses import dataclass
from itertools import chain

from hopdec.core import ApplyGradient, ComputeGradient, Finished, RankView, Wait
from hopdec.hop.actions import Enter

GAP_BOUND = 1
"""The largest iteration gap between two workers: a worker that completed iteration k's all-reduce may
enter k + 1 while another is still receiving k's result."""


class Peers(RankView):
    """Every worker of ``0 .. n - 1`` but ``rank``, in order, without a tuple of n - 1 ranks per worker
    (an all-reduce waits on every other worker: at 10,000 simulated workers those tuples were 800 MB).

    >>> list(Peers(1, 4)), len(Peers(1, 4)), Peers(1, 4)[1], 1 in Peers(1, 4)
    ([0, 2, 3], 3, 2, False)
    """

    __slots__ = ("rank", "n")

    def __init__(self, rank, n):
        self.rank, self.n = rank, n

    def __len__(self):
        return self.n - 1

    def __iter__(self):
        return chain(range(self.rank), range(self.rank + 1, self.n))

    def __contains__(self, r):
        return r != self.rank and 0 <= r < self.n

    def __repr__(self):
        return f"Peers(every rank of {self.n} but {self.rank})"


@dataclass(frozen=True)
class AllReduce:
    """Start the all-reduce of iteration ``iteration``: add ``weight`` x this worker's gradient to the sum
    over every worker (the result replaces the gradient); a :class:`~hopdec.core.Wait` follows until
    :meth:`Worker.on_reduced`."""

    iteration: int
    weight: float


class Worker:
    """Worker ``rank`` of ``n``, for ``iterations`` iterations."""

    def __init__(self, rank, n, iterations):
        if not 0 <= rank < n:
            raise ValueError(f"rank {rank} is not one of the {n} workers")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self.rank, self.n = int(rank), int(n)
        self.budget = int(iterations)
        self.iteration = self._start = 0
        self._entered = -1
        self.peers = Peers(self.rank, self.n)
        self._reduced = None            # the iteration whose all-reduce completed last
        self._reducing = None           # the iteration whose all-reduce is under way
        self.finished = False
        self._steps = None

    # ---- before the start ----
    def resume_at(self, k):
        """Start at Enter(k), as if iterations 0..k-1 had run (every worker resumes at the same k; the
        driver restores the trainer's state saved at that cut)."""
        if self._steps is not None or self._start:
            raise RuntimeError("resume_at must be called once, before the worker starts")
        if not 0 <= k < self.budget:
            raise ValueError(f"resume_at({k}): the run has iterations 0..{self.budget - 1}")
        self.iteration = self._start = int(k)
        self._entered = k - 1

    # ---- events ----
    def on_reduced(self, iteration):
        """The all-reduce of ``iteration`` completed (the reduced gradient is in place)."""
        if iteration != self._reducing:
            raise ValueError(f"worker {self.rank}: all-reduce of iteration {iteration} completed, but "
                             f"{self._reducing} is the one under way")
        self._reducing, self._reduced = None, iteration

    def stop_at(self, n):
        """End after iteration n - 1 (n never raises the budget); every worker gets the same n > every
        worker's :attr:`position` (:func:`hopdec.hop.cuts.stop_agreement`), so Enter(n) is a cut."""
        if n <= self._entered:
            raise ValueError(f"stop_at({n}): worker {self.rank} is already at iteration {self._entered}")
        self.budget = min(self.budget, int(n))

    # ---- what the driver asks ----
    @property
    def reducing(self):
        """The iteration whose all-reduce is under way, or None."""
        return self._reducing

    @property
    def position(self):
        """The last iteration entered (``start - 1`` before the start)."""
        return self._entered

    def next_action(self):
        if self._steps is None:
            self._steps = self._run()
        return next(self._steps)

    def _run(self):
        while self.iteration < self.budget:
            k = self.iteration
            self._entered = k
            yield Enter(k)
            yield ComputeGradient(k)
            self._reducing = k
            yield AllReduce(k, 1.0 / self.n)
            while self._reduced != k:
                yield Wait(self.peers, "all-reduce")
            yield ApplyGradient(k)
            self.iteration = k + 1
        self.finished = True
        while True:
            yield Finished()
