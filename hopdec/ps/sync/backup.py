"""Synchronous SGD with backup workers (Chen et al., *Revisiting Distributed Synchronous SGD*)."""

from hopdec.errors import ConfigError
from hopdec.ps.actions import DropGradient
from hopdec.ps.sync.base import Policy, option_int

DEFAULT_BACKUP_WORKERS = 1
"""``--backup-workers`` when not given with ``--sync backup``: b = 1."""


class BackupPolicy(Policy):
    """N + b workers, N = workers - b gradients per step (Algorithms 3-4; seeds README decision).

    The server is at step ``version``. It takes the gradients of the first N distinct workers that push
    *for the current step*, applies their mean (not the sum), advances the step and sends those N the new
    weights. A gradient computed at an older step (a backup that lost the race) is dropped and its worker
    sent the current weights at once (the token it finds waiting in the paper).
    """

    sync = "backup"
    usage = "backup (--backup-workers b, default 1: N = workers - b gradients per step)"
    options = ("backup_workers",)

    @classmethod
    def from_options(cls, workers, backup_workers=None, **_):
        return cls(workers, DEFAULT_BACKUP_WORKERS if backup_workers is None else
                   option_int("--backup-workers", backup_workers, 0))

    def __init__(self, workers, backup_workers):
        super().__init__(workers)
        if backup_workers < 0:
            raise ConfigError(f"--backup-workers must be >= 0, got {backup_workers}")
        if backup_workers >= self.n:
            raise ConfigError(f"--backup-workers {backup_workers} must be less than the number of "
                              f"workers ({self.n}): the server needs N = workers - b >= 1 gradients")
        self.b = backup_workers
        self.N = self.n - backup_workers
        self.collected = []
        self.dropped = 0

    def settings(self):
        return {"backup_workers": self.b, "N": self.N}

    def _removed(self, worker, now):
        """One fewer spare (b - 1, N unchanged) while there is one; then N - 1."""
        if self.b > 0:
            self.b -= 1
        else:
            self.N -= 1
        if worker in self.collected:
            self.collected.remove(worker)
        if self.collected and len(self.collected) >= self.N:
            parts = [(w, 1.0 / len(self.collected)) for w in self.collected]
            used, self.collected = self.collected, []
            return [self._apply(parts, staleness=[0] * len(parts)), self._release(used, "step")]
        return []

    def _push(self, p, step, now, local_steps):
        if step < self.version:
            self.dropped += 1
            return [DropGradient(p, step, self.version), self._release([p], "late")]
        if step > self.version:
            raise RuntimeError(f"backup: worker {p} pushed step {step} ahead of the server ({self.version})")
        if p in self.collected:  # impossible (it waits), kept as the "distinct" guarantee
            raise RuntimeError(f"backup: worker {p} pushed twice for step {step}")
        self.collected.append(p)
        if len(self.collected) < self.N:
            return []
        parts = [(w, 1.0 / self.N) for w in self.collected]
        used = self.collected
        self.collected = []
        return [self._apply(parts, staleness=[0] * self.N), self._release(used, "step")]
