"""Stale synchronous parallel (SSP), as the DSSP paper implements it (sec. I-A3, after Ho et al.)."""

from hopdec.errors import ConfigError
from hopdec.ps.sync.base import Policy, option_int

DEFAULT_STALENESS = 3
"""``--staleness`` when not given: DSSP Table I's s = 3."""


class SSPPolicy(Policy):
    """Every push is applied at once (ASP-style). The pushing worker continues iff it is at most ``s``
    iterations (pushes) ahead of the slowest worker; otherwise it waits, and it is sent weights as soon
    as the slowest catches up to within ``s``. Only the fastest ever wait, so the gap between any
    *running* worker and the slowest never exceeds ``s``.
    """

    sync = "ssp"
    usage = "ssp (--staleness s, default 3)"
    options = ("staleness",)

    @classmethod
    def from_options(cls, workers, staleness=None, **_):
        return cls(workers, DEFAULT_STALENESS if staleness is None else option_int("--staleness", staleness, 0))

    def __init__(self, workers, staleness):
        super().__init__(workers)
        if staleness < 0:
            raise ConfigError(f"--staleness must be >= 0, got {staleness}")
        self.s = staleness

    def settings(self):
        return {"staleness": self.s}

    def gap_bound(self):
        return self.s

    def _push(self, worker, step, now, local_steps):
        return [self._apply([(worker, self.push_weight)], staleness=[self.version - step])] + self._ready()

    def _removed(self, worker, now):
        return self._ready()                     # the slowest may have been the one that died

    def _ready(self):
        slowest = self.slowest_pushes()
        ready = [w for w in self.workers if w in self.waiting and self.pushes[w] - slowest <= self.s]
        return [self._release(ready)] if ready else []
