"""The ``--math`` fidelity: every simulated worker holds a real model replica and really trains.

:class:`MathBackend` adapts a :class:`~hopdec.ml.trainer.LocalTrainer` to the Hop loop's backend interface
(the same calls :class:`hopdec.runtime.backend.TorchBackend` makes under MPI): ``compute`` runs a real
forward/backward pass (with ``--local-steps``, a round's inner steps), ``reduce`` averages real parameter
arrays, ``apply`` takes a real SGD step (or a round's last inner step and outer step). Only
time is virtual: ``compute`` reports the cost model's ``compute_time(rank, iteration)``, never the
measured time (so a run is deterministic for its seed and does not depend on this machine's speed).
:class:`PSMathBackend` does the same for a parameter-server worker (on top of
:class:`hopdec.runtime.backend.WorkerBackend`, which loads weights and forms ESync's model differences).
"""

from hopdec.runtime.backend import WorkerBackend, check_loss


def step_of(compute_time, rank, iteration):
    """(seconds, slowdown factor) of a mini-batch from a cost callable returning either."""
    got = compute_time(rank, iteration)
    return got if type(got) is tuple else (got, None)


def compute_record(seconds, factor, loss=None):
    rec = {"loss": loss, "compute_s": seconds}
    if factor is not None:
        rec["slowdown"] = factor
    return rec


class MathBackend:
    """A real trainer, virtual time: ``duration`` is the virtual length of the last ``compute``."""

    def __init__(self, trainer, rank, compute_time):
        self.t, self.rank, self.compute_time = trainer, rank, compute_time
        self.duration = 0.0

    def write_params(self, out=None):
        return self.t.write_params(out)

    def compute(self, iteration):
        if getattr(self.t, "local", None) is not None:        # a round of local steps (--local-steps)
            losses = [loss for _, loss in self.t.compute_round(iteration)]
            loss = sum(losses) / len(losses)
        else:
            loss = self.t.compute()
        check_loss(loss, iteration, f"rank {self.rank}: ")     # (as hopdec train's ranks stop)
        self.duration, factor = step_of(self.compute_time, self.rank, iteration)
        return compute_record(self.duration, factor, loss)

    def reduce(self, pairs):
        self.t.reduce(pairs)

    def apply(self, iteration):
        self.t.apply(iteration)


class PSMathBackend(WorkerBackend):
    """A parameter-server worker with a real trainer, virtual time (see :class:`MathBackend`)."""

    def __init__(self, trainer, rank, compute_time):
        super().__init__(MathBackend(trainer, rank, compute_time))

    @property
    def duration(self):
        return self.b.duration
