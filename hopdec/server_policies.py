"""Parameter-server synchronization models as sans-I/O state machines (no MPI, no torch).

One class per ``--sync`` mode. A policy consumes events and returns a list of actions; the
transport (:mod:`hopdec.ps`) performs the actions *in order* and feeds back the events. Nothing
here reads a clock or touches a buffer, so every interleaving can be scripted in a unit test.

Workers are numbered 0..n-1 here (MPI rank = worker + 1 in :mod:`hopdec.ps`).

Events (methods)
    ``start(now)``                         training begins: returns the initial release.
    ``on_push(worker, step, now, local_steps=1)``
                                           worker pushed a gradient computed on the weights of
                                           version ``step`` (ESync: a model difference after
                                           ``local_steps`` local steps, ``step`` = round).
    ``on_query(worker, k, c, now)``        ESync state query: k local steps done this round, c
                                           the last step time in seconds (None: unknown yet).

Actions (frozen dataclasses)
    :class:`Apply`   combine the pushed buffers of ``parts`` (worker, weight) and update the
                     server model (``kind="grad"``: an optimizer step on sum(weight*g);
                     ``kind="delta"``: w += sum(weight*delta)). ``staleness`` per part.
    :class:`Drop`    discard a pushed buffer (a late gradient).
    :class:`Release` send the current weights (of ``version``) to ``workers``; they continue.
    :class:`Answer`  ESync: reply READY (True) or NOT-READY (False) to a state query.
    :class:`Note`    something worth logging (barrier chosen, controller decision).

Step size (a decision of hopdec, not of the papers): where one worker's gradient is applied on
its own (ASP, SSP, DSSP, inside ElasticBSP supersteps) its weight is 1/n, so n single pushes move
the model as far as one BSP step of n averaged gradients with the same ``--lr`` -- every mode then
uses the same step per sample and the comparison is about synchronization, not step size (with
weight 1 and momentum 0.9 the asynchronous modes diverge at the presets' lr on 4+ workers).

A pushed buffer is referenced by at most one Apply or Drop, always before that worker's next
Release, so the transport may reuse a worker's receive buffer once it has released the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from hopdec.errors import ConfigError
from hopdec.zipline import predict_pushes, zipline

SYNC_MODES = ("bsp", "asp", "ssp", "dssp", "elastic", "backup", "esync")

# Defaults when an option is not given. ssp: DSSP Table I's s=3. dssp: Table I's s_L=3, r=12,
# i.e. (s_L, s_U) = (3, 15). elastic: the ZipLine paper's "SmallR" lookahead R=15.
DEFAULT_STALENESS = 3
DEFAULT_STALENESS_RANGE = (3, 15)
DEFAULT_LOOKAHEAD = 15
DEFAULT_BACKUP_WORKERS = 1


# --------------------------------------------------------------------------------------------
# actions


@dataclass(frozen=True)
class Apply:
    parts: Tuple[Tuple[int, float], ...]
    kind: str = "grad"
    staleness: Tuple[int, ...] = ()
    version: int = 0  # the server model's version after this update


@dataclass(frozen=True)
class Drop:
    worker: int
    step: int
    version: int  # the server's current version (step), newer than ``step``
    reason: str = "late"


@dataclass(frozen=True)
class Release:
    workers: Tuple[int, ...]
    version: int
    reason: str = ""


@dataclass(frozen=True)
class Answer:
    worker: int
    ready: bool


@dataclass(frozen=True)
class Note:
    event: str
    data: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# settings


def parse_staleness_range(text) -> Tuple[int, int]:
    """``"sL,sU"`` -> (sL, sU); a tuple/list passes through. ConfigError names the option."""
    if text is None:
        return DEFAULT_STALENESS_RANGE
    if isinstance(text, (tuple, list)):
        parts = list(text)
    else:
        parts = str(text).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        s_l, s_u = (int(str(x).strip()) for x in parts)
    except ValueError:
        raise ConfigError(f"--staleness-range must be two integers sL,sU (e.g. 3,15), got {text!r}") from None
    if s_l < 0 or s_u < 0:
        raise ConfigError(f"--staleness-range must be >= 0, got {s_l},{s_u}")
    if s_l > s_u:
        raise ConfigError(f"--staleness-range: sL ({s_l}) must not exceed sU ({s_u})")
    return s_l, s_u


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if float(value) != int(value):
                raise ValueError
            value = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def make_policy(sync: str, n_workers: int, *, staleness=None, staleness_range=None,
                lookahead=None, backup_workers=None, esync_epsilon: float = 0.0) -> "Policy":
    """Validate the settings for ``sync`` and build its policy (ConfigError: one line, the option).

    Only the options that ``sync`` uses are checked, so e.g. the decentralized ``--staleness``
    default does not matter to ``--sync bsp``. Call it on every rank before any communication.
    """
    if sync not in SYNC_MODES:
        raise ConfigError(f"--sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise ConfigError(f"--mode ps needs at least 2 ranks (1 server + 1 worker), got {n_workers}+1 "
                          f"(run it under mpirun -n 2 or more)")
    if sync == "bsp":
        return BSPPolicy(n_workers)
    if sync == "asp":
        return ASPPolicy(n_workers)
    if sync == "ssp":
        s = DEFAULT_STALENESS if staleness is None else _check_int("--staleness", staleness, 0)
        return SSPPolicy(n_workers, s)
    if sync == "dssp":
        s_l, s_u = parse_staleness_range(staleness_range)
        return DSSPPolicy(n_workers, s_l, s_u)
    if sync == "elastic":
        r = DEFAULT_LOOKAHEAD if lookahead is None else _check_int("--lookahead", lookahead, 1)
        return ElasticPolicy(n_workers, r)
    if sync == "backup":
        b = DEFAULT_BACKUP_WORKERS if backup_workers is None else _check_int("--backup-workers", backup_workers, 0)
        if b >= n_workers:
            raise ConfigError(f"--backup-workers {b} must be less than the number of workers "
                              f"({n_workers}): the server needs N = workers - b >= 1 gradients")
        return BackupPolicy(n_workers, b)
    return ESyncPolicy(n_workers, epsilon=float(esync_epsilon))


# --------------------------------------------------------------------------------------------
# base


class Policy:
    """Shared book-keeping: push counts (iteration clocks), server version, who is waiting."""

    sync = ""

    def __init__(self, n_workers: int):
        if n_workers < 1:
            raise ConfigError(f"--mode ps needs at least 1 worker, got {n_workers}")
        self.n = n_workers
        self.version = 0                 # number of server model updates so far
        self.pushes = [0] * n_workers    # pushes received per worker (its iteration clock)
        self.waiting: set = set()        # workers that pushed and have not been released yet
        self.started = False
        self.push_weight = 1.0 / n_workers   # weight of a gradient applied on its own (see above)

    # events ---------------------------------------------------------------------------------
    def start(self, now: float) -> List:
        self.started = True
        return [Release(tuple(range(self.n)), self.version, "start")]

    def on_push(self, worker: int, step: int, now: float, local_steps: int = 1) -> List:
        self._check_worker(worker)
        if worker in self.waiting:
            raise RuntimeError(f"{self.sync}: worker {worker} pushed again before being released")
        self.pushes[worker] += 1
        self.waiting.add(worker)
        return self._push(worker, int(step), float(now), int(local_steps))

    def on_query(self, worker: int, k: int, c: Optional[float], now: float) -> List:
        raise RuntimeError(f"--sync {self.sync} has no state queries (ESync only)")

    # helpers --------------------------------------------------------------------------------
    def _push(self, worker, step, now, local_steps) -> List:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_worker(self, worker):
        if not (0 <= worker < self.n):
            raise RuntimeError(f"{self.sync}: no worker {worker} (have {self.n})")

    def _release(self, workers: Sequence[int], reason: str = "") -> Release:
        ws = tuple(sorted(workers))
        for w in ws:
            self.waiting.discard(w)
        return Release(ws, self.version, reason)

    def _apply(self, parts, kind="grad", staleness=()) -> Apply:
        self.version += 1
        return Apply(tuple(parts), kind, tuple(staleness), self.version)

    def gap(self) -> int:
        """Iteration gap: pushes of the fastest minus pushes of the slowest worker."""
        return max(self.pushes) - min(self.pushes)


# --------------------------------------------------------------------------------------------
# BSP, ASP, SSP


class BSPPolicy(Policy):
    """Bulk synchronous: wait for every worker's gradient of the step, apply their mean, release all."""

    sync = "bsp"

    def __init__(self, n_workers):
        super().__init__(n_workers)
        self.collected: List[int] = []

    def _push(self, worker, step, now, local_steps):
        if step != self.version:
            raise RuntimeError(f"bsp: worker {worker} pushed step {step}, server is at {self.version}")
        self.collected.append(worker)
        if len(self.collected) < self.n:
            return []
        parts = [(w, 1.0 / self.n) for w in sorted(self.collected)]
        self.collected = []
        return [self._apply(parts, staleness=[0] * self.n), self._release(range(self.n), "step")]


class ASPPolicy(Policy):
    """Asynchronous: apply every push at once, never wait; staleness = updates since the worker's read."""

    sync = "asp"

    def _push(self, worker, step, now, local_steps):
        stale = self.version - step
        return [self._apply([(worker, self.push_weight)], staleness=[stale]), self._release([worker])]


class SSPPolicy(Policy):
    """Stale synchronous, as implemented in the DSSP paper (sec. I-A3, after Ho et al.).

    Every push is applied at once (ASP-style). The pushing worker continues iff it is at most
    ``s`` iterations (pushes) ahead of the slowest worker; otherwise it waits, and it is released
    as soon as the slowest catches up to within ``s``. Only the fastest workers ever wait, so the
    gap between any *running* worker and the slowest never exceeds ``s``.
    """

    sync = "ssp"

    def __init__(self, n_workers, staleness: int):
        super().__init__(n_workers)
        if staleness < 0:
            raise ConfigError(f"--staleness must be >= 0, got {staleness}")
        self.s = staleness

    def _push(self, worker, step, now, local_steps):
        actions = [self._apply([(worker, self.push_weight)], staleness=[self.version - step])]
        slowest = min(self.pushes)
        ready = [w for w in sorted(self.waiting) if self.pushes[w] - slowest <= self.s]
        if ready:
            actions.append(self._release(ready))
        return actions


# --------------------------------------------------------------------------------------------
# DSSP


class DSSPPolicy(Policy):
    """Dynamic SSP: DSSP paper, Algorithm 1 (server) with Algorithm 2 (synchronization controller).

    Decisions (seeds README, and where the extracted pseudocode is ambiguous):

    * s_U is enforced: a worker is never released while more than s_U pushes ahead of the slowest,
      whatever its remaining extra-iteration credit r_p says (README).
    * The push-time table A (two latest push times per worker) is updated on every push, not only
      when the controller runs; before a worker (the pusher or the slowest) has two pushes the
      controller returns r* = 0 (README).
    * "Slowest" = fewest pushes, ties to the smallest worker id; "fastest" = most pushes (any worker
      tied for the most counts). Ties in Algorithm 2's argmin go to the smallest r (README: the
      earliest stop point, fewer stale gradients).
    * r* is the number of releases granted beyond s_L *including the current one*: the worker then
      stops exactly at the push the controller simulated (Sim_p[r*]), so its threshold is
      s_L + r* <= s_U (Theorem 2's s_L + r). Read literally, Algorithm 1 (OK now, then r* more
      OKs while r_p > 0) would grant one push more than the controller chose.
    * A worker that waits is released as soon as it is within s_L of the slowest (line 17).
    """

    sync = "dssp"

    def __init__(self, n_workers, s_lower: int, s_upper: int):
        super().__init__(n_workers)
        if s_lower < 0 or s_upper < 0:
            raise ConfigError(f"--staleness-range must be >= 0, got {s_lower},{s_upper}")
        if s_lower > s_upper:
            raise ConfigError(f"--staleness-range: sL ({s_lower}) must not exceed sU ({s_upper})")
        self.s_lower, self.s_upper = s_lower, s_upper
        self.r_max = s_upper - s_lower
        self.credit = [0] * n_workers                       # r_p
        self.table: List[List[Optional[float]]] = [[None, None] for _ in range(n_workers)]  # A[p]

    def slowest(self) -> int:
        low = min(self.pushes)
        return self.pushes.index(low)

    def controller(self, p: int) -> int:
        """Algorithm 2: r* in [0, r_max] minimising the simulated wait of worker p (table A given)."""
        s = self.slowest()
        a_p, a_s = self.table[p], self.table[s]
        if None in a_p or None in a_s or self.r_max == 0:
            return 0
        i_p = a_p[0] - a_p[1]
        i_s = a_s[0] - a_s[1]
        sim_p = [a_p[0] + r * i_p for r in range(self.r_max + 1)]
        sim_s = [a_s[0] + i_s + k * i_s for k in range(self.r_max + 1)]
        best_r, best = 0, float("inf")
        for r, tp in enumerate(sim_p):
            d = min(abs(ts - tp) for ts in sim_s)
            if d < best:  # strict: ties keep the smallest r
                best_r, best = r, d
        return best_r

    def _push(self, p, step, now, local_steps):
        self.table[p] = [now, self.table[p][0]]
        actions: List = [self._apply([(p, self.push_weight)], staleness=[self.version - step])]
        slowest = min(self.pushes)
        gap = self.pushes[p] - slowest
        release_p = False
        if self.credit[p] > 0:                                   # lines 3-5
            self.credit[p] -= 1
            release_p = gap <= self.s_upper                      # README: s_U enforced
        elif gap <= self.s_lower:                                # lines 8-9
            release_p = True
        elif self.pushes[p] == max(self.pushes):                 # lines 11-15
            r = self.controller(p)
            r = min(r, self.s_upper - self.s_lower)
            actions.append(Note("dssp_controller", {"worker": p, "r": r, "gap": gap}))
            if r > 0 and gap <= self.s_upper:
                self.credit[p] = r - 1                           # this release uses one
                release_p = True
        # line 17: waiting workers (p included when not released) go once within s_L
        ready = [w for w in sorted(self.waiting)
                 if (w == p and release_p) or (w != p and self.pushes[w] - slowest <= self.s_lower)]
        if ready:
            actions.append(self._release(ready))
        return actions


# --------------------------------------------------------------------------------------------
# ElasticBSP


class ElasticPolicy(Policy):
    """ElasticBSP (seed 000): ASP inside a superstep, a ZipLine-chosen barrier at its end.

    After each barrier (and at the start) the server is in a *monitoring* phase (paper Fig. 5):
    each worker must push once so that its current iteration interval is known. The interval of a
    push is measured from the later of the worker's previous push and the moment it was last
    released, so a wait at the barrier is not counted as computing time. When the last worker's
    first push of the superstep arrives, the server predicts every worker's next R pushes as
    t_p + i * gamma_p, i = 1..R (t_p: its latest push, gamma_p: its latest interval; seeds README)
    and runs :func:`hopdec.zipline.zipline` on them. The barrier is a per-worker push count (seeds
    README): worker p stops at push ``pushes[p] + index[p] + 1``. Until then its pushes are applied
    and answered at once (ASP-style); at its count it waits; when every worker has reached its
    count all are released together with the same weights (the barrier).
    """

    sync = "elastic"

    def __init__(self, n_workers, lookahead: int):
        super().__init__(n_workers)
        if lookahead < 1:
            raise ConfigError(f"--lookahead must be >= 1, got {lookahead}")
        self.R = lookahead
        self.targets: Optional[List[int]] = None
        self.mark = [0.0] * n_workers        # time of the worker's last push or release
        self.last_push = [0.0] * n_workers
        self.interval = [0.0] * n_workers
        self.seen = [False] * n_workers      # pushed since the last barrier
        self.barriers = 0

    def start(self, now):
        self.mark = [float(now)] * self.n
        return super().start(now)

    def _push(self, p, step, now, local_steps):
        self.interval[p] = max(0.0, now - self.mark[p])
        self.last_push[p] = self.mark[p] = now
        self.seen[p] = True
        actions: List = [self._apply([(p, self.push_weight)], staleness=[self.version - step])]
        if self.targets is None and all(self.seen):
            times = predict_pushes(self.last_push, self.interval, self.R)
            idx, span = zipline(times)
            self.targets = [self.pushes[w] + int(idx[w]) + 1 for w in range(self.n)]
            t_sync = float(max(times[w, idx[w]] for w in range(self.n)))
            actions.append(Note("elastic_barrier", {
                "barrier": self.barriers + 1, "targets": list(self.targets),
                "steps": [int(i) + 1 for i in idx], "span": span, "t_sync": t_sync}))
        if self.targets is None or self.pushes[p] < self.targets[p]:
            actions.append(self._release([p]))
            return actions
        if self.pushes[p] > self.targets[p]:  # cannot happen: targets are future pushes
            raise RuntimeError(f"elastic: worker {p} passed its barrier count {self.targets[p]}")
        if all(self.pushes[w] >= self.targets[w] for w in range(self.n)):
            self.barriers += 1
            self.targets = None
            self.seen = [False] * self.n
            self.mark = [now] * self.n
            actions.append(self._release(range(self.n), "barrier"))
        return actions


# --------------------------------------------------------------------------------------------
# sync SGD with backup workers


class BackupPolicy(Policy):
    """Synchronous SGD with N + b workers (seed 003, Algorithms 3-4; seeds README decision).

    The server is at step ``version``. It takes the gradients of the first N distinct workers that
    push *for the current step*, applies their mean (not the sum), advances the step and releases
    those N. A gradient computed at an older step (a backup that lost the race) is dropped and its
    worker released at once with the current weights (the token it finds waiting in the paper).
    """

    sync = "backup"

    def __init__(self, n_workers, backup_workers: int):
        super().__init__(n_workers)
        if backup_workers < 0:
            raise ConfigError(f"--backup-workers must be >= 0, got {backup_workers}")
        if backup_workers >= n_workers:
            raise ConfigError(f"--backup-workers {backup_workers} must be less than the number of "
                              f"workers ({n_workers})")
        self.b = backup_workers
        self.N = n_workers - backup_workers
        self.collected: List[int] = []
        self.dropped = 0

    def _push(self, p, step, now, local_steps):
        if step < self.version:
            self.dropped += 1
            return [Drop(p, step, self.version), self._release([p], "late")]
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


# --------------------------------------------------------------------------------------------
# ESync


@dataclass
class _DeviceRecord:
    k: int = 0
    c: Optional[float] = None     # capability: the last local step's time (seconds)
    t_e: float = 0.0              # last finish time, on the server's clock at arrival (README)
    ready: bool = False
    round: int = -1               # the round whose weights it has pulled


class ESyncPolicy(Policy):
    """ESync (seed 001): state query server (Algorithm 2) + 1/p averaging of model differences.

    Each round every device starts from the same global weights and asks before each local
    iteration whether to go on (NOT-READY) or aggregate (READY) -- the blocking state query of
    sec. 4.1 (not the delayed-ACK mode of 4.2). The k=0 query of a round doubles as
    RESET-STATE-SERVER: it records that the device has pulled the round's weights, its finish time
    and its capability. QUERY-STATE, with README decisions: times are the server's clock at
    arrival; a device's capability c is its last step time; a device whose c is still unknown
    counts as the slowest (so nobody aggregates before it has reported). The slowest device is the
    one with the largest c (ties: smallest id). ``epsilon`` is the paper's small boundary constant;
    0 by default (a fast device then takes the step that ends exactly when the slowest does).
    Aggregation: once all p devices pushed their difference, w += (1/p) * sum(delta) (the paper's
    rule, global learning rate 1; README), then every device is released into the next round.
    """

    sync = "esync"

    def __init__(self, n_workers, epsilon: float = 0.0):
        super().__init__(n_workers)
        self.epsilon = float(epsilon)
        self.round = 0
        self.rec = [_DeviceRecord() for _ in range(n_workers)]
        self.collected: Dict[int, int] = {}
        self.local_steps: List[List[int]] = []   # per finished round: local steps per device

    def slowest(self) -> int:
        def cap(w):
            c = self.rec[w].c
            return float("inf") if c is None else c
        return max(range(self.n), key=lambda w: (cap(w), -w))

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
            return [Answer(worker, False)]
        s = self.slowest()
        srec = self.rec[s]
        if srec.round < self.round:
            return [Answer(worker, False)]
        if s == worker or srec.ready:
            rec.ready = True
            return [Answer(worker, True)]
        if srec.c is None or rec.c is None:
            return [Answer(worker, False)]
        rest = srec.c - now + srec.t_e
        if rec.c + self.epsilon > rest:
            rec.ready = True
            return [Answer(worker, True)]
        return [Answer(worker, False)]

    def _push(self, p, step, now, local_steps):
        if step != self.round:
            raise RuntimeError(f"esync: worker {p} pushed round {step}, server is at {self.round}")
        if local_steps < 1:
            raise RuntimeError(f"esync: worker {p} pushed after {local_steps} local steps (needs >= 1)")
        self.collected[p] = local_steps
        if len(self.collected) < self.n:
            return []
        steps = [self.collected[w] for w in range(self.n)]
        self.local_steps.append(steps)
        parts = [(w, 1.0 / self.n) for w in range(self.n)]
        self.collected = {}
        self.round += 1
        for r in self.rec:
            r.ready = False
        return [self._apply(parts, kind="delta", staleness=[0] * self.n),
                Note("esync_round", {"round": self.round, "local_steps": steps}),
                self._release(range(self.n), "round")]
