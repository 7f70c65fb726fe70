"""One worker of synchronous all-reduce data parallelism, sans I/O: events in, actions out.

One iteration k::

    Enter(k) -> [Checkpoint(k)] -> ComputeGradient(k) -> AllReduce(k) -> Wait -> ApplyGradient(k)

:class:`AllReduce` contributes ``weight`` (1/n) times this worker's gradient to a sum over all n workers, so
the sum is the mean gradient -- the division before the reduction that DDP's default communication hook
makes -- and every worker then applies the same mean with the same optimizer. The driver reports the
completed reduction with :meth:`Worker.on_reduced`. No worker enters iteration k + 1 before every worker
has contributed its iteration-k gradient, so two workers are never more than one iteration apart
(:data:`GAP_BOUND`).

Checkpoints and stops are decided here too. A cut is Enter(K) on every worker: the parameters are the
same everywhere, nothing is in flight, and each worker's own state (optimizer, data position) is that of
K applied steps, so states saved there fit together and a resumed run continues exactly
(:func:`hopdec.hop.cuts.checkpoint_due` says which K, the same rule as the decentralized mode). A stop
(Ctrl-C) needs no messages of its own: a worker asked to stop votes in its next all-reduce (the driver
carries the vote beside the gradient), every worker learns the same outcome from the same reduction,
and all of them stop at the next cut, Enter(k + 1), with the final checkpoint.
"""

from dataclasses import dataclass

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.cuts import checkpoint_due

GAP_BOUND = 1
"""The largest iteration gap between two workers: a worker that completed iteration k's all-reduce may
enter k + 1 while another is still receiving k's result."""


@dataclass(frozen=True)
class Enter:
    """The worker enters ``iteration`` (its record starts here)."""

    iteration: int


@dataclass(frozen=True)
class AllReduce:
    """Start the all-reduce of iteration ``iteration``: add ``weight`` x this worker's gradient to the sum
    over every worker (the result replaces the gradient), with this worker's ``stop`` vote; a
    :class:`~hopdec.core.Wait` follows until :meth:`Worker.on_reduced`."""

    iteration: int
    weight: float
    stop: bool = False


@dataclass(frozen=True)
class Checkpoint:
    """Save this worker's state at the cut Enter(``iteration``); ``cause``: periodic, end or stop."""

    iteration: int
    cause: str = "periodic"

    @property
    def final(self):
        return self.cause != "periodic"


class Worker:
    """Worker ``rank`` of ``n``, for ``iterations`` iterations. ``checkpoints``: emit the periodic cuts
    (every ``checkpoint_every`` iterations) and the final one; ``start``: the iteration a resumed run
    starts at (its checkpoint's cut)."""

    def __init__(self, rank, n, iterations, checkpoint_every=0, checkpoints=False, start=0):
        if not 0 <= rank < n:
            raise ValueError(f"rank {rank} is not one of the {n} workers")
        self.rank, self.n = int(rank), int(n)
        self.target = self.budget = int(iterations)
        self.every = int(checkpoint_every or 0)
        self.checkpoints = bool(checkpoints)
        self.start = self.iteration = int(start)
        self.peers = tuple(r for r in range(self.n) if r != self.rank)
        self._vote = False
        self._reduced = None            # the iteration whose all-reduce completed last
        self._reducing = None           # the iteration whose all-reduce is under way
        self.finished = False
        self._steps = self._run()

    # ---- events ----
    def request_stop(self):
        """This worker was asked to stop (Ctrl-C): it votes so in its next all-reduce."""
        self._vote = True

    def on_reduced(self, iteration, stop=False):
        """The all-reduce of ``iteration`` completed; ``stop``: some worker voted to stop in it."""
        if iteration != self._reducing:
            raise ValueError(f"worker {self.rank}: all-reduce of iteration {iteration} completed, but "
                             f"iteration {self._reducing} is the one under way")
        self._reducing, self._reduced = None, iteration
        if stop and self.budget > iteration + 1:
            self.budget = iteration + 1           # every worker saw the same votes: the same cut

    # ---- what the driver asks ----
    def next_action(self):
        return next(self._steps)

    @property
    def position(self):
        """The last iteration entered."""
        return self.iteration

    @property
    def stopped(self):
        """A stop ended the run before its last iteration."""
        return self.budget < self.target

    def _run(self):
        while self.iteration < self.budget:
            k = self.iteration
            yield Enter(k)
            if self.checkpoints and checkpoint_due(k, self.every, self.start, self.budget):
                yield Checkpoint(k)
            yield ComputeGradient(k)
            self._reducing = k
            yield AllReduce(k, 1.0 / self.n, self._vote)
            while self._reduced != k:
                yield Wait(self.peers, "all-reduce")
            yield ApplyGradient(k)
            self.iteration = k + 1
        if self.checkpoints and self.budget > self.start:
            yield Checkpoint(self.budget, "stop" if self.stopped else "end")
        self.finished = True
        while True:
            yield Finished()
