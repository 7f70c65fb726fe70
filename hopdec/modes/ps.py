"""What a parameter-server run consists of, whoever executes it: real MPI ranks
(:mod:`hopdec.runtime.ps_mpi`) or the virtual-time simulator (:mod:`hopdec.sim.run`).

:class:`PSRun` holds the decisions about a run that are not the cores' (those are in :mod:`hopdec.ps`):
who the server and the workers are, the sync model's policy (built and checked once), the work budget,
the cores and trainers, the log headers, the title, what is evaluated and saved. The server is worker id
0 -- MPI rank 0 -- and the workers are the ids 1..n.
"""

import copy

from hopdec.errors import ConfigError
from hopdec.ps.server import Server, work_budget
from hopdec.words import count

SERVER = 0


def check_size(size):
    """A parameter-server run needs a server and at least one worker."""
    if size < 2:
        raise ConfigError(f"--mode ps needs at least 2 ranks (a server and a worker), got {size}")


class PSRun:
    """One parameter-server run: ``settings`` (:class:`hopdec.settings.RunSettings`) with the server and
    ``n_workers`` workers. Built before anything is loaded; :meth:`with_work` adds the workload."""

    mode = "ps"

    def __init__(self, settings, n_workers):
        check_size(n_workers + 1)
        self.settings = settings
        self.policy = settings.ps.policy(range(1, n_workers + 1))   # the sync model's checks, once
        self._workers = tuple(self.policy.workers)                    # the run's (the policy drops the dead)
        self.work = None

    def with_work(self, work):
        run = copy.copy(self)
        run.work = work
        return run

    # ---- who takes part ----
    @property
    def workers(self):
        """The worker ids the run started with (MPI ranks 1..n); the server is 0."""
        return self._workers

    @property
    def n(self):
        return len(self._workers)

    @property
    def sync(self):
        return self.policy.sync

    @property
    def budget(self):
        """The server's work budget: ``--iterations`` mini-batches per worker."""
        return work_budget(self.work.iterations, self.n)

    def server_core(self, checkpoints=False):
        """The server's core (``checkpoints``: emit the cuts ``--checkpoint-every`` asks for, and the
        final one)."""
        every = (self.settings.checkpoints.every or 0) * self.n if checkpoints else 0
        return Server(self.policy, self.budget, checkpoints=checkpoints, checkpoint_every=every)

    def worker_core(self, worker):
        """Worker ``worker``'s core, the one its sync model runs (:meth:`hopdec.ps.sync.base.Policy.worker_core`)."""
        return self.policy.worker_core(worker)

    def trainer(self, rank, device="cpu"):
        """The server's model (rank 0: shard 0, the same initial model) or worker ``rank``'s trainer (its
        shard: its position among the workers)."""
        part = 0 if rank == SERVER else self.workers.index(rank)
        t = self.work.trainer(part, self.n, device)
        t.norm_stats_from_training = rank == SERVER     # (it applies gradients, never trains BatchNorm's)
        return t

    # ---- what is reported ----
    def bound(self):
        """The sync model's bound on the push-count gap, or None where it is unbounded."""
        return self.policy.gap_bound()

    def header(self, rank, params, emulation=None, **executor):
        """Rank ``rank``'s log header (the server's names the workers and the budget; a worker's names it
        and its emulation); ``executor``: what only the executor knows (device, cost model, ...)."""
        head = dict(mode=self.mode, sync=self.sync)
        if rank == SERVER:
            head.update(workers=self.n, worker_ranks=list(self.workers), iterations=self.work.iterations,
                        budget=self.budget)
        else:
            head.update(worker=rank, workers=self.n, iterations=self.work.iterations)
        head.update(model=self.work.model, params=params, hparams=self.work.hparams)
        if rank != SERVER:
            head.update(emulation=emulation)
        head.update(seed=self.settings.work.seed, settings=self.policy.settings(), gap_bound=self.bound(),
                    **executor)
        return head

    def title(self):
        return f"parameter server {self.policy.describe()} (1 server + {count(self.n, 'worker')})"

    model_label = "server model"

    @property
    def bound_label(self):
        return f"bound of --sync {self.sync}"

    def saves(self, rank):
        """Whether ``--save-models`` saves rank ``rank``'s parameters (the server's and every worker's)."""
        return bool(self.settings.observe.save_models and self.settings.observe.log_dir)

    def server_line(self, server, elapsed, resumed_at=None):
        """The summary's last line: what the ``server`` core did (``elapsed``: with its unit). Pushes that
        came after the stop, or wait in a step it left unfinished, are named, so the workers' "iters run" add up:
        N per update (BSP, backup) + dropped + those. A resumed run's counts (``resumed_at``: the version it
        resumed at) are since the start, while the workers' rows and ``elapsed`` are this run's: it says so."""
        from hopdec.report.html import unused_pushes
        dropped = count(server.dropped, "gradient dropped", "gradients dropped")
        updates = count(self.policy.version, "update")
        if resumed_at is not None:
            updates += f" ({resumed_at} before the resume, {self.policy.version - resumed_at} in this run)"
            dropped += " since the start"
            elapsed += " in this run"
        return f"server: {updates}, {dropped}{unused_pushes(server.unfinished, server.discarded)}, {elapsed}"

    def failure_notes(self, server):
        """The summary's lines about workers that died (``--fault-tolerance``), from the server core."""
        lines = [f"failure: worker {e['worker']} died after {e['work']} mini-batches (server at version "
                 f"{e['version']}); the others went on, the work budget is now {e['budget']}"
                 for e in server.failures]
        if server.failed:
            lines.append(f"{self.n - len(server.failed)} of {count(self.n, 'worker')} finished")
        return lines
