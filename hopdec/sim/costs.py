"""The simulator's compute costs: how long each worker's mini-batch takes in virtual seconds.

``--compute-time`` (repeatable) gives each worker a distribution of its per-iteration compute time;
``--slowdown`` multiplies it exactly as :class:`hopdec.heterogeneity.Emulator` does in a real
run (same specs, same draws for the same seed, rank and iteration, so a simulated run and an emulated
``mpirun`` run slow down the same iterations).

Syntax of one ``--compute-time`` value: ``[WHO@]DIST``

* ``DIST``: a number of seconds (``0.25``), ``normal:mean=0.25,std=0.02`` (draws below 0 count as 0),
  or ``uniform:low=0.2,high=0.3``;
* ``WHO``: the ranks it applies to, e.g. ``3``, ``0-7``, ``1,4,9-12`` (MPI ranks: in the
  parameter-server mode the workers are ranks 1..n). Without ``WHO@`` it applies to every worker;
  later values override earlier ones for the workers they name.

>>> m = ComputeModel(["0.25", "3@normal:mean=1,std=0.1"], workers=range(4), seed=1)
>>> m.duration(0, 7), round(m.duration(3, 7), 3)
(0.25, 1.07)
>>> parse_dist("uniform:low=0.2,high=0.3").describe()
'uniform(0.2, 0.3)'
"""

import math
from array import array

import numpy as np

from hopdec.errors import ConfigError
from hopdec.heterogeneity import Emulator
from hopdec.settings.cost import MAX_VIRTUAL_S, MIN_BANDWIDTH_GBPS

DEFAULT_COMPUTE_S = 0.1
"""Compute time per iteration when ``--compute-time`` is not given (the log and summary say so)."""

BLOCK = 256
"""Draws are made per worker in blocks of this many iterations, each from its own seeded stream:
a draw depends only on (seed, worker, iteration), never on the order events happen in."""

_STREAM_COMPUTE = 0x5C0317


class Dist:
    """A per-iteration compute-time distribution: ``kind`` const / normal / uniform with its ``params``."""

    def __init__(self, kind, **params):
        self.kind, self.params = kind, params

    @property
    def constant(self):
        return self.params["value"] if self.kind == "const" else None

    def sample(self, rng, size):
        p = self.params
        if self.kind == "const":
            return np.full(size, p["value"])
        if self.kind == "normal":
            return np.maximum(rng.normal(p["mean"], p["std"], size), 0.0)
        return rng.uniform(p["low"], p["high"], size)

    def mean(self):
        p = self.params
        return {"const": lambda: p["value"], "normal": lambda: p["mean"],
                "uniform": lambda: (p["low"] + p["high"]) / 2}[self.kind]()

    def describe(self):
        p = self.params
        if self.kind == "const":
            return f"{p['value']:g} s"
        if self.kind == "normal":
            return f"normal(mean {p['mean']:g}, std {p['std']:g})"
        return f"uniform({p['low']:g}, {p['high']:g})"

    def __eq__(self, other):
        return isinstance(other, Dist) and (self.kind, self.params) == (other.kind, other.params)

    def __hash__(self):
        return hash((self.kind, tuple(sorted(self.params.items()))))


_DIST_KEYS = {"normal": ("mean", "std"), "uniform": ("low", "high")}

NORMAL_Z = 2.33
"""A normal compute time's draws below 0 are clipped to 0, which raises their mean: a ``std`` over
``mean / NORMAL_Z`` (more than 1% of the draws below 0; std = mean raised it by 8%) is refused, so the mean
the summary states is the mean the run had."""


def parse_dist(text, option="--compute-time", spec=None):
    """``0.25`` | ``normal:mean=M,std=S`` | ``uniform:low=A,high=B`` -> :class:`Dist` (seconds).
    Errors are one line naming the option and the value."""
    spec = text if spec is None else spec
    body = text.strip()

    def fail(why):
        raise ConfigError(f"{option} {spec!r}: {why}")

    def number(key, v):
        try:
            x = float(v)
        except ValueError:
            fail(f"{key} {v!r} is not a number")
        if not math.isfinite(x) or not 0 <= x <= MAX_VIRTUAL_S:
            fail(f"{key} must be a finite number >= 0 and at most {MAX_VIRTUAL_S:g} s, got {v}")
        return x

    if ":" not in body:
        if not body:
            fail("empty value (expected seconds, normal:mean=M,std=S or uniform:low=A,high=B)")
        try:
            float(body)
        except ValueError:
            fail("expected seconds (e.g. 0.25), normal:mean=M,std=S or uniform:low=A,high=B")
        return Dist("const", value=number("seconds", body))
    kind, _, rest = body.partition(":")
    kind = kind.strip().lower()
    if kind not in _DIST_KEYS:
        fail(f"unknown distribution {kind!r} (expected normal:mean=M,std=S or uniform:low=A,high=B)")
    vals = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        k = k.strip().lower()
        if not eq:
            fail(f"{item!r} is not key=value")
        if k not in _DIST_KEYS[kind]:
            fail(f"unknown key {k!r} for {kind} (expected {', '.join(_DIST_KEYS[kind])})")
        if k in vals:
            fail(f"{k} given twice")
        vals[k] = number(k, v.strip())
    for k in _DIST_KEYS[kind]:
        if k not in vals:
            fail(f"missing {k}=")
    if kind == "uniform" and vals["low"] > vals["high"]:
        fail(f"low {vals['low']:g} > high {vals['high']:g}")
    if kind == "normal" and vals["std"] * NORMAL_Z > vals["mean"]:
        fail(f"std {vals['std']:g} is over mean/{NORMAL_Z:g}: more than 1% of the draws would fall below 0 and be "
             f"clipped to 0, raising the mean above {vals['mean']:g} (uniform:low=A,high=B gives a wide spread)")
    return Dist(kind, **vals)


def parse_who(who, ranks, option, spec, members="workers"):
    """``3`` | ``0-7`` | ``1,4,9-12`` -> the ranks named (each must be one of ``ranks``: the run's workers, or
    else every rank of ``members`` -- a topology, "this run" -- where a PS server's NIC counts too)."""
    out, known = [], set(ranks)
    for item in who.split(","):
        item = item.strip()
        lo, dash, hi = item.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ConfigError(f"{option} {spec!r}: {item!r} is not a rank or a range a-b") from None
        if b < a:
            raise ConfigError(f"{option} {spec!r}: empty range {item!r}")
        for r in range(a, b + 1):
            if r not in known:
                lo_r, hi_r = min(ranks), max(ranks)
                if members == "workers":
                    which = (f"the only worker is rank {lo_r}" if lo_r == hi_r
                             else f"the workers are ranks {lo_r}..{hi_r}")
                    raise ConfigError(f"{option} {spec!r}: rank {r} is not a worker ({which})")
                raise ConfigError(f"{option} {spec!r}: no rank {r} in {members} (ranks {lo_r}..{hi_r})")
            out.append(r)
    return out


def per_rank(option, specs, ranks, parse_value, default, members="workers"):
    """``{rank: value}`` from repeatable ``[WHO@]VALUE`` specs; ranks not named get ``default``; ``members``:
    what ``ranks`` are, for the error line (:func:`parse_who`)."""
    ranks = tuple(ranks)
    out = dict.fromkeys(ranks, default)
    for spec in specs or []:
        text = str(spec).strip()
        who, at, value = text.rpartition("@")
        value = parse_value(value, option, text)
        for r in (parse_who(who, ranks, option, text, members) if at else ranks):
            out[r] = value
    return out


class ComputeModel:
    """``duration(worker, iteration)``: virtual seconds of that mini-batch (base draw x slowdown).

    ``specs``: the ``--compute-time`` values (default :data:`DEFAULT_COMPUTE_S` for every worker);
    ``slowdowns``: the ``--slowdown`` specs, applied with the real run's :class:`Emulator`."""

    def __init__(self, specs, workers, seed=0, slowdowns=None, default=DEFAULT_COMPUTE_S):
        self.workers = tuple(int(w) for w in workers)
        self.seed = int(seed)
        self.default_used = not specs
        self.dist = per_rank("--compute-time", specs, self.workers, parse_dist, Dist("const", value=default))
        self.emulators = None
        if slowdowns:
            self.emulators = {w: Emulator(slowdowns, w, self.workers, seed=seed) for w in self.workers}
            if not any(e.slowdowns for e in self.emulators.values()):
                self.emulators = None
        self._blocks = {}
        self._factors = {}
        self._cur = {}                       # worker -> (block, its base draws, its factors or None): step()

    def _base_block(self, w, b):
        """Worker ``w``'s base draws for iterations ``b * BLOCK ..`` (drawn once, seeded per block)."""
        key = (w, b)
        block = self._blocks.get(key)
        if block is None:
            d = self.dist[w]
            if d.kind == "const":
                block = [d.params["value"]] * BLOCK
            else:
                rng = np.random.default_rng([self.seed & 0xFFFFFFFF, w, b, _STREAM_COMPUTE])
                block = array("d", d.sample(rng, BLOCK).tolist())   # 8 bytes a draw, not a float object
            self._blocks[key] = block
            self._blocks.pop((w, b - 1), None)      # a worker's iterations only go up
        return block

    def _factor_block(self, w, b):
        """Worker ``w``'s slowdown factors for iterations ``b * BLOCK ..`` (the real Emulator's), or None
        without slowdowns."""
        if self.emulators is None:
            return None
        key = (w, b)
        block = self._factors.get(key)
        if block is None:
            start = b * BLOCK
            block = self._factors[key] = self.emulators[w].factors(range(start, start + BLOCK)).tolist()
            self._factors.pop((w, b - 1), None)
        return block

    def base(self, w, i):
        return self._base_block(w, i // BLOCK)[i % BLOCK]

    def factor(self, w, i):
        block = self._factor_block(w, i // BLOCK)
        return 1.0 if block is None else block[i % BLOCK]

    def duration(self, w, i):
        return self.base(w, i) * self.factor(w, i)

    def step(self, w, i):
        """(virtual seconds, slowdown factor) of worker ``w``'s mini-batch ``i``: ``base * factor``, read
        from the worker's current blocks, kept at hand (this runs once per simulated worker-iteration)."""
        b = i // BLOCK
        cur = self._cur.get(w)
        if cur is None or cur[0] != b:
            cur = self._cur[w] = (b, self._base_block(w, b), self._factor_block(w, b))
        off = i - b * BLOCK
        f = 1.0 if cur[2] is None else cur[2][off]
        return cur[1][off] * f, f

    def describe(self):
        by = {}
        for w, d in self.dist.items():
            by.setdefault(d, []).append(w)
        if len(by) == 1:
            comp = f"compute {next(iter(by)).describe()} per iteration"
        else:
            comp = "compute per iteration " + "; ".join(
                f"{_span(ws)}: {d.describe()}" for d, ws in sorted(by.items(), key=lambda x: x[1][0]))
        if self.default_used:
            comp += " (default: no --compute-time given)"
        if self.emulators:
            e = next(iter(self.emulators.values()))
            comp += "; " + "; ".join(s.describe(len(self.workers)) for s in e.slowdowns)
        return comp

    def as_dict(self):
        return dict(compute={str(w): d.describe() for w, d in self.dist.items()}
                    if len(set(self.dist.values())) > 1 else next(iter(self.dist.values())).describe(),
                    slowdown=[s.spec for s in next(iter(self.emulators.values())).slowdowns]
                    if self.emulators else [])


class RoundCompute:
    """``(seconds, slowdown)`` of a worker's round of local steps (``--local-steps``): the sum of its inner
    steps' mini-batch times, each drawn and slowed down as one iteration is (``step(w, s)`` of a
    :class:`ComputeModel`), so a round of H steps costs H per-step times. ``steps_of(k)``: round k's
    inner step indices; the slowdown reported is the largest of the round's."""

    def __init__(self, step, steps_of):
        self.step, self.steps_of = step, steps_of

    def __call__(self, w, k):
        total, factor = 0.0, 1.0
        for s in self.steps_of(k):
            t, f = self.step(w, s)
            total += t
            factor = max(factor, f)
        return total, factor


def _span(ws):
    ws = sorted(ws)
    if ws == list(range(ws[0], ws[-1] + 1)) and len(ws) > 2:
        return f"ranks {ws[0]}..{ws[-1]}"
    return ("rank " if len(ws) == 1 else "ranks ") + ",".join(map(str, ws))


def parse_bandwidth(text, option="--bandwidth", spec=None):
    """Gb/s -> bytes/s (``inf`` allowed: no transfer time)."""
    spec = text if spec is None else spec
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(f"{option} {spec!r}: expected Gb/s (a number > 0, or inf)") from None
    if not x >= MIN_BANDWIDTH_GBPS or math.isnan(x):
        raise ConfigError(f"{option} {spec!r}: must be at least {MIN_BANDWIDTH_GBPS:g} Gb/s (or inf)")
    return x * 1e9 / 8


def check_seconds(x, option):
    if x is None or not (math.isfinite(x) and x >= 0):
        raise ConfigError(f"{option} {x!r}: must be a finite number of seconds >= 0")
    return float(x)
