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

What a policy declares, so that nothing outside it asks for its name: ``sync`` (its ``--sync`` name),
``usage`` (its words in ``--sync``'s help), ``options`` (the PS settings it reads) and
:meth:`Policy.from_options` (its defaults and checks), ``pushes_differences`` (its workers run local steps and
push model differences: :meth:`Policy.worker_core`), ``records`` (the dataclasses its :meth:`Policy.state`
holds, so a checkpoint decodes them and nothing else). Register a new one in :mod:`hopdec.ps.sync`.
"""

from hopdec.errors import ConfigError
from hopdec.ps.actions import ApplyGradients, SendWeights


class Policy:
    """Shared book-keeping of every sync model. Workers are ids (the MPI ranks), never positions."""

    sync = ""
    usage = ""
    options = ()
    """The PS settings (keyword names of :meth:`from_options`) this model reads; the others are not its."""
    pushes_differences = False
    """True when its workers run local steps between pushes and push model differences (ESync)."""
    records = ()
    """Dataclasses its attributes hold (see :func:`encode`): what a checkpoint may rebuild."""

    @classmethod
    def from_options(cls, workers, **options):
        """The policy over ``workers`` from the PS settings (``options`` it does not read are ignored);
        None takes the documented default. ConfigError names the option."""
        return cls(workers)

    def worker_core(self, worker):
        """The worker core this model's workers run (:class:`hopdec.ps.worker.PSWorker`)."""
        from hopdec.ps.worker import PSWorker
        return PSWorker(worker, pushes_differences=self.pushes_differences)

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
        c = self.pushes[worker]
        self.pushes[worker] = c + 1
        low = self.__dict__.get("_cached_low")
        if low is not None and low[0] is self.pushes and c == low[1]:     # one fewer at the minimum
            low[2] -= 1
            if not low[2]:
                del self._cached_low        # all moved on: slowest_pushes finds the next minimum
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
        self.__dict__.pop("_cached_low", None)
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
        return encode({k: v for k, v in vars(self).items() if not k.startswith("_cached")})

    def load_state(self, state, shift=0.0):
        """Put back what :meth:`state` gave; ``shift`` seconds are added to recorded times (a resumed run
        was down that long: intervals measured across the gap would count the downtime)."""
        for key, value in decode(state, self.records).items():
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

    def in_order(self, workers):
        """Those of ``workers`` that are workers of this model, in :attr:`workers`' order -- without a pass
        over every worker (ASP releases one per push, and a server stops one per push at the end)."""
        places = self.__dict__.get("_cached_places")
        if places is None or places[0] is not self.workers:
            places = self._cached_places = (self.workers, {w: i for i, w in enumerate(self.workers)})
        order = places[1]
        return tuple(sorted({w for w in workers if w in order}, key=order.__getitem__))

    def slowest_pushes(self):
        """The fewest pushes of any worker, kept with how many workers are there (:meth:`on_push` counts
        them down): found by a pass over every worker once per round of pushes, not at every release (a
        1024-worker ASP server was O(n) per push); found afresh when ``pushes`` is another dict (a
        checkpoint loaded, a test's own) or a worker died."""
        low = self.__dict__.get("_cached_low")
        if low is None or low[0] is not self.pushes:
            m = min(self.pushes.values())
            low = self._cached_low = [self.pushes, m, sum(1 for c in self.pushes.values() if c == m)]
        return low[1]

    def _release(self, workers, reason=""):
        ws = self.in_order(workers)
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


def decode(data, records=()):
    """The inverse of :func:`encode`. Records are rebuilt only as one of ``records`` (the policy's own
    record classes, :attr:`Policy.records`), matched by class name; any other is refused."""
    known = records if isinstance(records, dict) else {r.__name__: r for r in records}

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "dict" in x:
            return {dec(k): dec(v) for k, v in x["dict"]}
        if "set" in x:
            return {dec(v) for v in x["set"]}
        if "tuple" in x:
            return tuple(dec(v) for v in x["tuple"])
        if "record" in x:
            if x["record"] not in known:
                raise ValueError(f"unknown record {x['record']!r} in a checkpoint")
            return known[x["record"]](**{k: dec(v) for k, v in x["fields"].items()})
        raise ValueError(f"unknown value {sorted(x)!r} in a checkpoint")
    return dec(data)


def option_int(name, value, minimum):
    """``value`` of option ``name`` as an integer (an integral float or string is accepted) >= ``minimum``
    (None: no minimum); ConfigError names the option."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, int):
        try:
            if float(value) != int(float(value)):
                raise ValueError
            value = int(float(value))
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value
