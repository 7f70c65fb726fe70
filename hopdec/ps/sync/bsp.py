"""Bulk synchronous parallel (BSP): wait for every worker's gradient of the step, apply their mean."""

from hopdec.ps.sync.base import Policy


class BSPPolicy(Policy):
    """Every step: one gradient from each worker, all computed on the current version; their mean is
    applied and every worker gets the new weights (ZipLine paper sec. 2, the BSP model)."""

    sync = "bsp"
    usage = "bsp"

    def __init__(self, workers):
        super().__init__(workers)
        self.collected = []

    def gap_bound(self):
        return 0

    def _removed(self, worker, now):
        if worker in self.collected:
            self.collected.remove(worker)        # its gradient of this step is not used: a mean of the rest
        return self._step_if_complete()

    def _step_if_complete(self):
        if not self.collected or len(self.collected) < self.n:
            return []
        got = set(self.collected)
        parts = [(w, 1.0 / self.n) for w in self.workers if w in got]
        self.collected = []
        return [self._apply(parts, staleness=[0] * self.n), self._release(self.workers, "step")]

    def _push(self, worker, step, now, local_steps):
        if step != self.version:
            raise RuntimeError(f"bsp: worker {worker} pushed step {step}, server is at {self.version}")
        self.collected.append(worker)
        return self._step_if_complete()
