"""What every parameter-server sync model shares: push counts, the server's version, who waits.

A policy is the decision part of the server core (:class:`hopdec.ps.server.Server`): it consumes pushes
(and ESync's queries) and returns the actions of :mod:`hopdec.ps.actions` -- apply, drop, send weights,
answer. No clock is read (times arrive as event data) and no buffer is touched.

Step size (a decision of hopdec, not of the papers): where one worker's gradient is applied on its own
(ASP, SSP, DSSP, inside ElasticBSP supersteps) its weight is 1/n, so n single pushes move the model as far
as one BSP step of n averaged gradients with the same ``--lr``: every mode then uses the same step per
sample and the comparison is about synchronization, not step size (with weight 1 and momentum 0.9 the
asynchronous modes diverge at the presets' lr on 4+ workers).

A pushed buffer is referenced by at most one apply or drop, always before that worker's next
:class:`~hopdec.ps.actions.SendWeights`, so a driver may reuse a worker's receive buffer once the worker
has been sent weights again.
"""

from hopdec.errors import ConfigError
from hopdec.ps.actions import ApplyGradients, SendWeights


class Policy:
    """Shared book-keeping of every sync model. Workers are ids (the MPI ranks), never positions."""

    sync = ""

    def __init__(self, workers):
        workers = tuple(int(w) for w in workers)
        if not workers:
            raise ConfigError("--mode ps needs at least 1 worker")
        if len(set(workers)) != len(workers):
            raise ValueError(f"worker ids must be distinct, got {workers}")
        self.workers = workers
        self.n = len(workers)
        self.version = 0                              # number of server model updates so far
        self.pushes = dict.fromkeys(workers, 0)       # pushes received per worker (its iteration clock)
        self.waiting = set()                          # pushed and not sent weights since
        self.push_weight = 1.0 / self.n               # weight of a gradient applied on its own

    # ---- what the run reports ----
    def settings(self):
        """The effective settings of this sync model (defaults filled in), for the log header and summary."""
        return {}

    def gap_bound(self):
        """The largest push-count gap between a released worker and the slowest this model allows, or
        None where it is unbounded."""
        return None

    def describe(self):
        return f"--sync {self.sync}" + "".join(
            f" {k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
            for k, v in self.settings().items())

    # ---- events ----
    def start(self, now):
        """Training begins: every worker gets the initial weights."""
        return [SendWeights(self.workers, self.version, "start")]

    def on_push(self, worker, step, now, local_steps=1):
        """``worker`` pushed a gradient computed on version ``step`` (ESync: a model difference after
        ``local_steps`` local steps; ``step`` is the round)."""
        self._check_worker(worker)
        if worker in self.waiting:
            raise RuntimeError(f"{self.sync}: worker {worker} pushed again before being sent weights")
        self.pushes[worker] += 1
        self.waiting.add(worker)
        return self._push(worker, int(step), float(now), int(local_steps))

    def on_query(self, worker, k, c, now):
        raise RuntimeError(f"--sync {self.sync} has no state queries (ESync only)")

    def remove_worker(self, worker, now):
        """``worker`` died (``--fault-tolerance``): the model goes on with the others. Returns the actions
        its absence unblocks (a step that waited only for it, a barrier it held, ...)."""
        self._check_worker(worker)
        if self.n == 1:
            raise RuntimeError(f"{self.sync}: the last worker ({worker}) died")
        self.workers = tuple(w for w in self.workers if w != worker)
        self.n = len(self.workers)
        del self.pushes[worker]
        self.waiting.discard(worker)
        self.push_weight = 1.0 / self.n
        return self._removed(worker, float(now))

    def _removed(self, worker, now):
        """What a model does when ``worker`` is gone (its books are already cleared)."""
        return []

    # ---- checkpoints ----
    def state(self):
        """Everything the policy has decided and recorded, JSON-ready (see :func:`encode`), so a policy
        built with the same settings continues from it (:meth:`load_state`)."""
        return encode(vars(self))

    def load_state(self, state, shift=0.0):
        """Put back what :meth:`state` gave; ``shift`` seconds are added to recorded times (a resumed run
        was down that long: intervals measured across the gap would count the downtime)."""
        for key, value in decode(state).items():
            setattr(self, key, value)
        if shift:
            self._shift_times(float(shift))

    def _shift_times(self, dt):
        """Add ``dt`` to every time the policy recorded (policies that record times override this)."""

    # ---- helpers ----
    def _push(self, worker, step, now, local_steps):  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_worker(self, worker):
        if worker not in self.pushes:
            raise RuntimeError(f"{self.sync}: no worker {worker} (workers are {list(self.workers)})")

    def slowest_pushes(self):
        return min(self.pushes.values())

    def _release(self, workers, reason=""):
        chosen = set(workers)
        ws = tuple(w for w in self.workers if w in chosen)
        self.waiting.difference_update(ws)
        return SendWeights(ws, self.version, reason)

    def _apply(self, parts, staleness=()):
        self.version += 1
        return ApplyGradients(tuple(parts), self.version, staleness=tuple(staleness))

    def gap(self):
        """Iteration gap: pushes of the fastest minus pushes of the slowest worker."""
        return max(self.pushes.values()) - self.slowest_pushes()


def encode(obj):
    """A policy's attributes as JSON: dicts (int keys kept), sets, tuples, lists, numbers, strings and
    dataclass records, each tagged so :func:`decode` rebuilds the same types; nothing is pickled."""
    import dataclasses
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, (set, frozenset)):
        return {"set": [encode(v) for v in sorted(obj, key=repr)]}
    if isinstance(obj, tuple):
        return {"tuple": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if dataclasses.is_dataclass(obj):
        return {"record": type(obj).__name__,
                "fields": {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if hasattr(obj, "item"):                        # a numpy scalar
        return obj.item()
    raise TypeError(f"cannot save a {type(obj).__name__} in a checkpoint")


def decode(data):
    """The inverse of :func:`encode`. Records are rebuilt only as the sync models' own record classes."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "dict" in data:
        return {decode(k): decode(v) for k, v in data["dict"]}
    if "set" in data:
        return {decode(v) for v in data["set"]}
    if "tuple" in data:
        return tuple(decode(v) for v in data["tuple"])
    if "record" in data:
        from hopdec.ps.sync.esync import _DeviceRecord
        records = {"_DeviceRecord": _DeviceRecord}
        if data["record"] not in records:
            raise ValueError(f"unknown record {data['record']!r} in a checkpoint")
        return records[data["record"]](**{k: decode(v) for k, v in data["fields"].items()})
    raise ValueError(f"unknown value {sorted(data)!r} in a checkpoint")
