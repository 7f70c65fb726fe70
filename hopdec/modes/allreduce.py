"""What an all-reduce run consists of -- synchronous data parallelism, what PyTorch DDP does -- whoever
executes it: real MPI ranks (:mod:`hopdec.runtime.allreduce_mpi`) or the virtual-time simulator
(:mod:`hopdec.sim.run`).

:class:`AllReduceRun` holds the decisions about a run that are not the core's (those are in
:mod:`hopdec.allreduce`): the workers (every rank), one core and one trainer per worker (the same
workload, shards and slowdowns as the other modes, :mod:`hopdec.modes.work`), the log header, the title,
what is evaluated (every worker holds the same model: rank 0's) and saved.
"""

import copy

from hopdec.allreduce.worker import GAP_BOUND, Worker

EVAL_MODEL = "the workers' model (identical on every worker)"


class AllReduceRun:
    """One all-reduce run of ``settings`` (:class:`hopdec.settings.RunSettings`) over ``n`` workers.
    Built before anything is loaded; :meth:`with_work` adds the workload."""

    mode = "allreduce"
    model_label = "the model (every worker's)"
    bound_label = "bound of synchronous all-reduce"
    eval_model = EVAL_MODEL

    def __init__(self, settings, n):
        from hopdec.errors import ConfigError
        if n < 1:
            raise ConfigError(f"--mode allreduce needs at least 1 worker, got {n}")
        self.settings, self._n = settings, int(n)
        self.work = None

    def with_work(self, work):
        run = copy.copy(self)
        run.work = work
        return run

    # ---- who takes part ----
    @property
    def n(self):
        return self._n

    @property
    def workers(self):
        """The worker ids: the ranks 0..n-1."""
        return tuple(range(self._n))

    def core(self, rank):
        """Worker ``rank``'s core."""
        return Worker(rank, self._n, self.work.iterations)

    def trainer(self, rank, device="cpu"):
        """Worker ``rank``'s trainer: shard ``rank`` of n, the same initial model everywhere."""
        t = self.work.trainer(rank, self._n, device)
        if any(b.is_floating_point() for b in t.model.buffers()):
            # BatchNorm's running statistics are no gradient: each replica computes its own on its shard
            # (PyTorch DDP would broadcast rank 0's before every forward), so only the parameters are every
            # worker's, and the model evaluated is rank 0's
            self.model_label = "rank 0's model (its parameters every worker's, its BatchNorm statistics its own)"
            self.eval_model = ("rank 0's model (parameters identical on every worker; BatchNorm statistics "
                               "rank 0's own)")
        return t

    # ---- what is reported ----
    def bound(self):
        """The largest iteration gap between two workers (:data:`hopdec.allreduce.GAP_BOUND`)."""
        return GAP_BOUND if self._n > 1 else 0

    def header(self, params, emulation, **executor):
        """The log header every worker writes; ``executor``: what only the executor knows."""
        return dict(mode=self.mode, workers=self._n, iterations=self.work.iterations, model=self.work.model,
                    params=params, hparams=self.work.hparams, emulation=emulation, gap_bound=self.bound(),
                    seed=self.settings.work.seed, reduction="mean of the workers' gradients (sum of 1/n x each)",
                    **executor)

    def message_bytes(self, params):
        """Bytes of one worker's gradient (float32)."""
        return 4 * int(params)

    def title(self):
        return f"synchronous all-reduce data parallelism ({self._n} workers, mean gradient every iteration)"

    def saves(self, rank):
        """Whether ``--save-models`` saves rank ``rank``'s parameters (every worker's; they are equal)."""
        return bool(self.settings.observe.save_models and self.settings.observe.log_dir)
