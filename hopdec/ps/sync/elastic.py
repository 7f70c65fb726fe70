"""ElasticBSP (ZipLine paper): ASP inside a superstep, a barrier chosen by ZipLine at its end."""

from hopdec.errors import ConfigError
from hopdec.ps.actions import Note
from hopdec.ps.sync.base import Policy, option_int
from hopdec.ps.zipline import predict_pushes, zipline

DEFAULT_LOOKAHEAD = 15
"""``--lookahead`` when not given: the ZipLine paper's "SmallR", R = 15."""
MAX_LOOKAHEAD = 10_000
"""ZipLine's input is workers x R floats: a bound keeps ``--lookahead`` from exhausting memory."""


class ElasticPolicy(Policy):
    """After each barrier (and at the start) the server is in a *monitoring* phase (ZipLine paper Fig. 5):
    each worker must push once so that its current iteration interval is known. The interval of a push
    is measured from the later of the worker's previous push and the moment it was last sent weights,
    so a wait at the barrier is not counted as computing time. When the last worker's first push of the
    superstep arrives, the server predicts every worker's next R pushes as t_p + i * gamma_p, i = 1..R
    (t_p: its latest push, gamma_p: its latest interval; seeds README) and runs
    :func:`hopdec.ps.zipline.zipline` on them. The barrier is a per-worker push count (seeds README):
    worker p stops at push ``pushes[p] + index[p] + 1``. Until then its pushes are applied and answered
    at once (ASP-style); at its count it waits; when every worker has reached its count all get the
    same weights together (the barrier).
    """

    sync = "elastic"
    usage = "elastic (--lookahead)"
    options = ("lookahead",)

    @classmethod
    def from_options(cls, workers, lookahead=None, **_):
        r = DEFAULT_LOOKAHEAD if lookahead is None else option_int("--lookahead", lookahead, 1)
        if r > MAX_LOOKAHEAD:
            raise ConfigError(f"--lookahead {r}: at most {MAX_LOOKAHEAD} predicted pushes per worker "
                              f"(ZipLine holds workers x R times)")
        return cls(workers, r)

    def __init__(self, workers, lookahead):
        super().__init__(workers)
        if lookahead < 1:
            raise ConfigError(f"--lookahead must be >= 1, got {lookahead}")
        self.R = lookahead
        self.targets = None                              # worker -> push count of the next barrier
        self.mark = dict.fromkeys(self.workers, 0.0)     # time of the worker's last push or release
        self.last_push = dict.fromkeys(self.workers, 0.0)
        self.interval = dict.fromkeys(self.workers, 0.0)
        self.seen = set()                                # pushed since the last barrier
        self.barriers = 0

    def settings(self):
        return {"lookahead": self.R}

    def _shift_times(self, dt):
        self.mark = {w: t + dt for w, t in self.mark.items()}
        self.last_push = {w: t + dt for w, t in self.last_push.items()}

    def start(self, now):
        self.mark = dict.fromkeys(self.workers, float(now))
        return super().start(now)

    def _removed(self, worker, now):
        for books in (self.mark, self.last_push, self.interval):
            books.pop(worker, None)
        self.seen.discard(worker)
        if self.targets is None:
            return []
        self.targets.pop(worker, None)
        if all(self.pushes[w] >= self.targets[w] for w in self.workers) and self.waiting:
            self.barriers += 1                   # everyone else was at the barrier: pass it
            self.targets = None
            self.seen = set()
            self.mark = dict.fromkeys(self.workers, now)
            return [self._release(self.workers, "barrier")]
        return []

    def _push(self, p, step, now, local_steps):
        self.interval[p] = max(0.0, now - self.mark[p])
        self.last_push[p] = self.mark[p] = now
        self.seen.add(p)
        actions = [self._apply([(p, self.push_weight)], staleness=[self.version - step])]
        if self.targets is None and len(self.seen) == self.n:
            times = predict_pushes([self.last_push[w] for w in self.workers],
                                   [self.interval[w] for w in self.workers], self.R)
            idx, span = zipline(times)
            self.targets = {w: self.pushes[w] + int(i) + 1 for w, i in zip(self.workers, idx)}
            t_sync = float(max(times[r, i] for r, i in enumerate(idx)))
            actions.append(Note("elastic_barrier", {
                "barrier": self.barriers + 1, "workers": list(self.workers),
                "targets": [self.targets[w] for w in self.workers],
                "steps": [int(i) + 1 for i in idx], "span": span, "t_sync": t_sync}))
        if self.targets is None or self.pushes[p] < self.targets[p]:
            actions.append(self._release([p]))
            return actions
        if self.pushes[p] > self.targets[p]:  # cannot happen: targets are future pushes
            raise RuntimeError(f"elastic: worker {p} passed its barrier count {self.targets[p]}")
        if all(self.pushes[w] >= self.targets[w] for w in self.workers):
            self.barriers += 1
            self.targets = None
            self.seen = set()
            self.mark = dict.fromkeys(self.workers, now)
            actions.append(self._release(self.workers, "barrier"))
        return actions
