"""Asynchronous parallel (ASP): apply every push at once, never make a worker wait."""

from hopdec.ps.sync.base import Policy


class ASPPolicy(Policy):
    """Each gradient is applied on arrival with weight 1/n (see :mod:`hopdec.ps.sync.base`); its
    staleness is the number of updates applied since the worker read the weights."""

    sync = "asp"
    usage = "asp"

    def _push(self, worker, step, now, local_steps):
        stale = self.version - step
        return [self._apply([(worker, self.push_weight)], staleness=[stale]), self._release([worker])]
