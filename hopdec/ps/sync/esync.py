"""ESync (Li, Zhou, Yu): a state query server decides each device's local steps; then synchronous
averaging of the model differences."""

import math
from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.ps.actions import AnswerQuery, ApplyDeltas, Note
from hopdec.ps.sync.base import Policy


@dataclass
class _DeviceRecord:
    k: int = 0
    c: float = None               # capability: the last local step's time (seconds)
    t_e: float = 0.0              # last finish time, on the server's clock at arrival (README)
    ready: bool = False
    round: int = -1               # the round whose weights it has pulled


class ESyncPolicy(Policy):
    """State query server (ESync Algorithm 2) + 1/p averaging of model differences.

    Each round every device starts from the same global weights and asks before each local iteration
    whether to go on (NOT-READY) or aggregate (READY) -- the blocking state query of sec. 4.1 (not the
    delayed-ACK mode of 4.2). The k=0 query of a round doubles as RESET-STATE-SERVER: it records that the
    device has pulled the round's weights, its finish time and its capability. QUERY-STATE, with README
    decisions: times are the server's clock at arrival; a device's capability c is its last step time; a
    device whose c is still unknown counts as the slowest (so nobody aggregates before it has reported).
    The slowest device is the one with the largest c (ties: the first worker id). ``epsilon`` is the
    paper's small boundary constant; 0 by default (a fast device then takes the step that ends exactly
    when the slowest does). Aggregation: once all p devices pushed their difference, w += (1/p) * sum(delta)
    (the paper's rule, global learning rate 1; README), then every device gets the weights of the next round.
    """

    sync = "esync"
    usage = "esync"
    options = ("esync_epsilon",)
    pushes_differences = True           # its workers run local steps and push model differences
    records = (_DeviceRecord,)          # what state() holds besides plain values

    @classmethod
    def from_options(cls, workers, esync_epsilon=0.0, **_):
        eps = float(esync_epsilon or 0.0)
        if not math.isfinite(eps):
            raise ConfigError(f"--esync-epsilon must be a finite number of seconds, got {esync_epsilon!r}")
        return cls(workers, epsilon=eps)

    def __init__(self, workers, epsilon=0.0):
        super().__init__(workers)
        self.epsilon = float(epsilon)
        self.round = 0
        self.rec = {w: _DeviceRecord() for w in self.workers}
        self.collected = {}
        self.local_steps = []            # per finished round: local steps per device, in worker order

    def settings(self):
        return {"epsilon": self.epsilon}

    def _shift_times(self, dt):
        for r in self.rec.values():
            r.t_e += dt

    def slowest(self):
        def cap(w):
            c = self.rec[w].c
            return float("inf") if c is None else c
        best = self.workers[0]
        for w in self.workers[1:]:
            if cap(w) > cap(best):
                best = w
        return best

    def on_query(self, worker, k, c, now):
        self._check_worker(worker)
        if worker in self.waiting:
            raise RuntimeError(f"esync: worker {worker} queried while waiting for aggregation")
        rec = self.rec[worker]
        rec.k = int(k)
        if c is not None:
            rec.c = float(c)
        rec.t_e = float(now)
        if k == 0:
            rec.round = self.round
            rec.ready = False
            return [AnswerQuery(worker, False)]
        s = self.slowest()
        srec = self.rec[s]
        if srec.round < self.round:
            return [AnswerQuery(worker, False)]
        if s == worker or srec.ready:
            rec.ready = True
            return [AnswerQuery(worker, True)]
        if srec.c is None or rec.c is None:
            return [AnswerQuery(worker, False)]
        rest = srec.c - now + srec.t_e
        if rec.c + self.epsilon > rest:
            rec.ready = True
            return [AnswerQuery(worker, True)]
        return [AnswerQuery(worker, False)]

    def _removed(self, worker, now):
        self.rec.pop(worker, None)
        self.collected.pop(worker, None)
        if self.collected and len(self.collected) == self.n:
            return self._aggregate()
        return []

    def _push(self, p, step, now, local_steps):
        if step != self.round:
            raise RuntimeError(f"esync: worker {p} pushed round {step}, server is at {self.round}")
        if local_steps < 1:
            raise RuntimeError(f"esync: worker {p} pushed after {local_steps} local steps (needs >= 1)")
        self.collected[p] = local_steps
        if len(self.collected) < self.n:
            return []
        return self._aggregate()

    def _aggregate(self):
        steps = [self.collected[w] for w in self.workers]
        self.local_steps.append(steps)
        parts = [(w, 1.0 / self.n) for w in self.workers]
        self.collected = {}
        self.round += 1
        for r in self.rec.values():
            r.ready = False
        self.version += 1
        return [ApplyDeltas(tuple(parts), self.version),
                Note("esync_round", {"round": self.round, "local_steps": steps}),
                self._release(self.workers, "round")]
