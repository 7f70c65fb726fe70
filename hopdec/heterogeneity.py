"""Emulated heterogeneity (Hop sec. 7.3): slow some iterations down by sleeping after compute.

Two kinds of slowdown, combinable: ``random:factor=6,prob=1/n`` (each worker, each iteration,
slowed ``factor``x with probability ``prob``) and ``rank=3,factor=4`` (one deterministic straggler).
Random draws depend only on (seed, rank, spec, iteration), never on timing, so runs are reproducible.
Ranks are MPI ranks in every mode: in the parameter-server mode the workers are ranks 1..n (rank 0
serves and is never slowed), and ``n`` in ``prob=1/n`` is the number of workers.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, List, Optional, Tuple, Union

import numpy as np

from hopdec.errors import ConfigError

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.Pow: operator.pow}
_KEYS = {"random": {"factor", "prob", "rank"}, "rank": {"factor", "rank"}}


def _eval_expr(node, n):
    """Evaluate a tiny arithmetic AST: numbers, the name ``n``, + - * / ** and unary minus."""
    if isinstance(node, ast.Expression):
        return _eval_expr(node.body, n)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id == "n":
        if n is None:
            raise LookupError("n")
        return float(n)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_expr(node.left, n), _eval_expr(node.right, n))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_expr(node.operand, n)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("only numbers, n, + - * / ** and parentheses are allowed")


_last_ranks: tuple = (None, None, frozenset())
"""The last tuple :func:`worker_ranks` was given, the ranks it made of it and their set: a simulator
builds one :class:`Emulator` per worker, each given the same tuple of all the workers, and normalising and
searching it each time made 10,000 workers cost 10^8 steps (20 s before the first event)."""


def worker_ranks(workers) -> Tuple[int, ...]:
    """The ranks that train: ``workers`` as a count n (ranks 0..n-1) or a sequence of ranks."""
    global _last_ranks
    if isinstance(workers, (int, np.integer)):
        return tuple(range(int(workers)))
    given, ranks, _ = _last_ranks
    if workers is given or workers is ranks:        # a tuple cannot change: the same ranks as before
        return ranks
    ranks = tuple(int(r) for r in workers)
    if type(workers) is tuple:
        _last_ranks = (workers, ranks, frozenset(ranks))
    return ranks


def _is_worker(rank, ranks) -> bool:
    """``rank in ranks`` (a tuple from :func:`worker_ranks`), in constant time for the last one made."""
    _, last, members = _last_ranks
    return rank in members if ranks is last else rank in ranks


def _span(ranks) -> str:
    if ranks == tuple(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _fmt_prob(p: float) -> str:
    """0.125 -> '1/8', 0.3 -> '0.3': a 1/k probability (the paper's 1/n) reads better as a fraction."""
    fr = Fraction(p).limit_denominator(1000)
    if fr.denominator > 1 and math.isclose(float(fr), p, rel_tol=1e-9) and fr.numerator == 1:
        return f"{fr.numerator}/{fr.denominator}"
    return f"{p:g}"


@dataclass(frozen=True)
class Slowdown:
    """One parsed slowdown. ``kind`` is "random" or "rank"; ``prob`` is the unevaluated text."""

    kind: str
    factor: float
    prob: Optional[str] = None
    rank: Optional[int] = None
    spec: str = ""

    def probability(self, n_workers: Optional[int] = None) -> float:
        """``prob`` as a number (``n`` = number of workers); ConfigError if outside [0, 1]."""
        if self.prob is None:
            return 1.0
        try:
            p = _eval_expr(ast.parse(self.prob, mode="eval"), n_workers)
        except LookupError:
            raise ConfigError(f"--slowdown {self.spec!r}: prob {self.prob!r} uses n, "
                              "which is only known with the number of workers") from None
        except (ValueError, ZeroDivisionError, OverflowError, SyntaxError) as err:
            raise ConfigError(f"--slowdown {self.spec!r}: prob {self.prob!r} is not a number "
                              f"({err or type(err).__name__})") from None
        if not 0.0 <= p <= 1.0 or math.isnan(p):
            raise ConfigError(f"--slowdown {self.spec!r}: prob {self.prob!r} = {p:g} is outside [0, 1]")
        return p

    def check(self, workers) -> None:
        """Validate what depends on the workers (a count or their ranks): the rank, prob in terms of n."""
        ranks = worker_ranks(workers)
        if self.rank is not None and not _is_worker(self.rank, ranks):
            server = " (rank 0 is the parameter server)" if ranks and ranks[0] == 1 else ""
            which = f"the only worker is rank {ranks[0]}" if len(ranks) == 1 else f"the workers are ranks {_span(ranks)}"
            raise ConfigError(f"--slowdown {self.spec!r}: rank {self.rank} is not a worker: {which}{server}")
        self.probability(len(ranks))

    def describe(self, n_workers: Optional[int] = None) -> str:
        f = f"{self.factor:g}x"
        if self.kind == "rank":
            return f"rank {self.rank} {f} slower"
        try:
            p = _fmt_prob(self.probability(n_workers))
        except ConfigError:
            p = self.prob
        where = f" on rank {self.rank}" if self.rank is not None else ""
        return f"random {f} slowdown with prob {p}{where}"


def parse_slowdown(spec: str, workers=None) -> Slowdown:
    """Parse ``random:factor=F,prob=P[,rank=R]`` or ``[rank:|straggler:]rank=R,factor=F``.

    ``prob`` may be a float, ``a/b`` or an expression in ``n`` (e.g. ``1/n``). With ``workers`` (a count
    or the ranks that train) the rank and ``prob`` are checked now; otherwise :meth:`Slowdown.check` later.
    """
    text = (spec or "").strip()
    body, kind = text, None
    if ":" in text:
        head, body = text.split(":", 1)
        head = head.strip().lower()
        if head == "random":
            kind = "random"
        elif head in ("rank", "straggler"):
            kind = "rank"
        else:
            raise ConfigError(f"--slowdown {spec!r}: unknown kind {head!r} (expected random: or "
                              "rank=R,factor=F)")
    fields = {}
    for item in filter(None, (s.strip() for s in body.split(","))):
        if "=" not in item:
            raise ConfigError(f"--slowdown {spec!r}: {item!r} is not key=value")
        k, v = (s.strip() for s in item.split("=", 1))
        k = k.lower()
        if k in fields:
            raise ConfigError(f"--slowdown {spec!r}: {k} given twice")
        fields[k] = v
    if kind is None:
        if "rank" in fields and "prob" not in fields:
            kind = "rank"
        else:
            raise ConfigError(f"--slowdown {spec!r}: expected random:factor=F,prob=P or rank=R,factor=F")
    unknown = sorted(set(fields) - _KEYS[kind])
    if unknown:
        raise ConfigError(f"--slowdown {spec!r}: unknown key {unknown[0]!r} for a {kind} slowdown "
                          f"(allowed: {', '.join(sorted(_KEYS[kind]))})")
    need = ["factor", "prob"] if kind == "random" else ["rank", "factor"]
    missing = [k for k in need if k not in fields]
    if missing:
        raise ConfigError(f"--slowdown {spec!r}: missing {missing[0]}=")
    try:
        factor = float(fields["factor"])
    except ValueError:
        raise ConfigError(f"--slowdown {spec!r}: factor {fields['factor']!r} is not a number") from None
    if not factor >= 1.0 or math.isinf(factor):
        raise ConfigError(f"--slowdown {spec!r}: factor must be a finite number >= 1, got {fields['factor']}")
    rank = None
    if "rank" in fields:
        try:
            rank = int(fields["rank"])
        except ValueError:
            raise ConfigError(f"--slowdown {spec!r}: rank {fields['rank']!r} is not an integer") from None
        if rank < 0:
            raise ConfigError(f"--slowdown {spec!r}: rank must be >= 0, got {rank}")
    sd = Slowdown(kind, factor, fields.get("prob"), rank, text)
    if sd.prob is not None:
        try:
            sd.probability(None if workers is None else len(worker_ranks(workers)))
        except ConfigError as err:
            if workers is not None or "uses n" not in str(err):
                raise
    if workers is not None:
        sd.check(workers)
    return sd


def parse_slowdowns(specs: Union[None, str, Slowdown, Iterable[Union[str, Slowdown]]],
                    workers=None) -> List[Slowdown]:
    """Several specs: a list, or one string with ``;`` between specs; None/""/"none" -> []."""
    if specs is None:
        return []
    if isinstance(specs, (str, Slowdown)):
        specs = [specs]
    out = []
    for s in specs:
        if isinstance(s, Slowdown):
            out.append(s)
            if workers is not None:
                s.check(workers)
            continue
        for part in str(s).split(";"):
            if part.strip() and part.strip().lower() != "none":
                out.append(parse_slowdown(part, workers))
    return out


class Emulator:
    """Per-rank slowdown emulation: ``factor(it)`` says how much slower, ``run`` sleeps the difference.

    With ``compute_time`` the nominal compute of an iteration is that many seconds (so results do not
    depend on how fast this machine is); if the measured compute exceeds it, the measured time is the
    base instead (and the slowdown factor multiplies it) and ``overruns`` counts it -- the emulation
    never pretends to be faster than reality, nor lets a slowdown vanish under load.
    """

    def __init__(self, specs, rank: int, workers, compute_time: Optional[float] = None,
                 seed: int = 0):
        ranks = worker_ranks(workers)
        if not _is_worker(rank, ranks):
            raise ConfigError(f"emulator: rank {rank} is not one of the workers {_span(ranks)}")
        n_workers = len(ranks)
        if compute_time is not None and not (compute_time > 0 and math.isfinite(compute_time)):
            raise ConfigError(f"--compute-time must be a positive number of seconds, got {compute_time}")
        self.slowdowns = parse_slowdowns(specs, ranks)
        self.rank, self.n_workers, self.seed = int(rank), int(n_workers), int(seed)
        self.compute_time = compute_time
        self._probs = [s.probability(n_workers) if s.kind == "random" else 1.0 for s in self.slowdowns]
        self.overruns = 0            # iterations whose measured compute exceeded compute_time
        self.max_overrun_s = 0.0     # the largest such measured compute

    @property
    def active(self) -> bool:
        """True when anything is emulated (otherwise ``run`` never sleeps)."""
        return bool(self.slowdowns) or self.compute_time is not None

    def _draw(self, index: int, iteration: int) -> float:
        """Uniform [0,1) from (seed, rank, spec index, iteration): reproducible, order-independent."""
        ss = np.random.SeedSequence([self.seed & 0xFFFFFFFF, self.rank, index, int(iteration)])
        return float(np.random.default_rng(ss).random())

    def factor(self, iteration: int) -> float:
        """The slowdown of this rank at ``iteration``: product of every applicable slowdown (>= 1)."""
        f = 1.0
        for i, s in enumerate(self.slowdowns):
            if s.rank is not None and s.rank != self.rank:
                continue
            if s.kind == "rank" or self._draw(i, iteration) < self._probs[i]:
                f *= s.factor
        return f

    def factors(self, iterations) -> np.ndarray:
        """:meth:`factor` of many iterations at once (bit-identical, for simulators): the uniform draws
        come from :func:`seeded_uniforms`, numpy's SeedSequence + PCG64 done on whole arrays."""
        its = np.asarray(iterations, dtype=np.int64)
        f = np.ones(its.shape)
        for i, s in enumerate(self.slowdowns):
            if s.rank is not None and s.rank != self.rank:
                continue
            if s.kind == "rank":
                f *= s.factor
            else:
                hit = seeded_uniforms(self.seed & 0xFFFFFFFF, self.rank, i, its) < self._probs[i]
                f[hit] *= s.factor
        return f

    def pad(self, iteration: int, measured_s: float) -> float:
        """Seconds to sleep after ``measured_s`` of compute: ``max(compute_time, measured) x factor - measured``.

        A slowdown of factor f makes the iteration f times the larger of the nominal and the measured
        compute, so a straggler stays f times slower on a loaded machine too (where real compute can
        exceed ``--compute-time``); such overruns are counted and reported.
        """
        measured_s = max(0.0, float(measured_s))
        base = measured_s
        if self.compute_time is not None:
            base = max(self.compute_time, measured_s)
            if measured_s > self.compute_time:
                self.overruns += 1
                self.max_overrun_s = max(self.max_overrun_s, measured_s)
        return max(0.0, base * self.factor(iteration) - measured_s)

    def run(self, iteration: int, measured_s: float) -> Tuple[float, float]:
        """Sleep the pad; return (measured + time actually slept, factor)."""
        f = self.factor(iteration)
        p = self.pad(iteration, measured_s)
        slept = 0.0
        if p > 0:
            t0 = time.perf_counter()
            time.sleep(p)
            slept = time.perf_counter() - t0
        return max(0.0, float(measured_s)) + slept, f

    def describe(self, overruns: bool = True) -> str:
        """One line: what is emulated, e.g. "compute padded to 0.05 s/iter; random 6x slowdown ..."."""
        parts = []
        if self.compute_time is not None:
            c = f"compute padded to {self.compute_time:g} s/iter"
            if overruns and self.overruns:
                c += (f" (measured compute exceeded it in {self.overruns} iterations, up to "
                      f"{self.max_overrun_s:.3g} s: slowdowns multiplied the measured time there)")
            parts.append(c)
        parts += [s.describe(self.n_workers) for s in self.slowdowns]
        return "; ".join(parts) if parts else "no emulation"


# ---- the draws of Emulator._draw for many iterations at once -----------------------------------------
# np.random.default_rng(SeedSequence([a, b, c, it])).random() costs ~9 us a call; a simulator needs it for
# every (worker, iteration). seeded_uniforms computes the same doubles for an array of `it`, with numpy's
# algorithms (SeedSequence's hash mixing, PCG64's seeding and first XSL-RR output) on uint64 arrays.
_M32 = np.uint64(0xFFFFFFFF)
_SS_INIT_A, _SS_MULT_A, _SS_INIT_B, _SS_MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_SS_MIX_L, _SS_MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341


def _u(x):
    return np.uint64(x)


def _ss_hashmix(value, hash_const):
    """SeedSequence's hashmix: (mixed value, next hash constant); the constant does not depend on data."""
    value = value ^ _u(hash_const)
    hash_const = (hash_const * _SS_MULT_A) & 0xFFFFFFFF
    value = (value * _u(hash_const)) & _M32
    return value ^ (value >> _u(16)), hash_const


def _ss_mix(x, y):
    r = (_SS_MIX_L * x - _SS_MIX_R * y) & _M32
    return r ^ (r >> _u(16))


def _mul128(hi, lo, c):
    """(hi, lo) * c mod 2**128 for uint64 arrays hi, lo and a Python int c."""
    ch, cl = _u(c >> 64), c & 0xFFFFFFFFFFFFFFFF
    a0, a1 = lo & _M32, lo >> _u(32)
    b0, b1 = _u(cl & 0xFFFFFFFF), _u(cl >> 32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _u(32)) + (p01 & _M32) + (p10 & _M32)
    low = (p00 & _M32) | ((mid & _M32) << _u(32))
    high = p11 + (p01 >> _u(32)) + (p10 >> _u(32)) + (mid >> _u(32)) + hi * _u(cl) + lo * ch
    return high, low


def _add128(hi, lo, c_hi, c_lo):
    low = lo + c_lo
    return hi + c_hi + (low < lo).astype(np.uint64), low


def seeded_uniforms(a, b, c, iterations):
    """``[np.random.default_rng(np.random.SeedSequence([a, b, c, it])).random() for it in iterations]`` as
    one array (``a, b, c`` and every ``it`` in 0..2**32-1), in O(len) numpy operations."""
    its = np.asarray(iterations, dtype=np.uint64)
    with np.errstate(over="ignore"):
        words = [np.full(its.shape, w, dtype=np.uint64) for w in (a, b, c)] + [its]
        hc = _SS_INIT_A
        pool = []
        for w in words:                              # SeedSequence.mix_entropy, pool size 4
            v, hc = _ss_hashmix(w, hc)
            pool.append(v)
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    v, hc = _ss_hashmix(pool[src], hc)
                    pool[dst] = _ss_mix(pool[dst], v)
        hc = _SS_INIT_B
        state = []
        for i in range(8):                           # generate_state(4, uint64): 8 uint32 words
            v = pool[i % 4] ^ _u(hc)
            hc = (hc * _SS_MULT_B) & 0xFFFFFFFF
            v = (v * _u(hc)) & _M32
            state.append(v ^ (v >> _u(16)))
        s = [state[2 * i] | (state[2 * i + 1] << _u(32)) for i in range(4)]
        init_hi, init_lo = s[0], s[1]                # PCG64: initstate, initseq
        inc_hi = (s[2] << _u(1)) | (s[3] >> _u(63))
        inc_lo = (s[3] << _u(1)) | _u(1)
        hi, lo = _add128(np.zeros_like(its), np.zeros_like(its), inc_hi, inc_lo)          # state 0, step
        hi, lo = _add128(hi, lo, init_hi, init_lo)
        for _ in range(2):                           # a step, then the first draw's step
            hi, lo = _mul128(hi, lo, _PCG_MULT)
            hi, lo = _add128(hi, lo, inc_hi, inc_lo)
        rot = hi >> _u(58)
        x = hi ^ lo
        out = (x >> rot) | (x << ((_u(64) - rot) & _u(63)))
        return (out >> _u(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
