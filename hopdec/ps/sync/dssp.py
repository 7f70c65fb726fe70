"""Dynamic SSP (DSSP paper, Algorithms 1 and 2): a staleness threshold chosen at run time in [s_L, s_U]."""

from hopdec.errors import ConfigError
from hopdec.ps.actions import Note
from hopdec.ps.sync.base import Policy, option_int

DEFAULT_STALENESS_RANGE = (3, 15)
"""``--staleness-range`` when not given: DSSP Table I's s_L = 3, r = 12, i.e. (s_L, s_U) = (3, 15)."""


def parse_staleness_range(text):
    """``"sL,sU"`` -> (sL, sU); a tuple/list passes through; None gives the default. The range itself is
    checked by :class:`DSSPPolicy` (one place)."""
    if text is None:
        return DEFAULT_STALENESS_RANGE
    parts = list(text) if isinstance(text, (tuple, list)) else str(text).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return tuple(option_int("--staleness-range", x.strip() if isinstance(x, str) else x, None)
                     for x in parts)
    except (ConfigError, ValueError):
        raise ConfigError(f"--staleness-range must be two integers sL,sU (e.g. 3,15), got {text!r}") from None


class DSSPPolicy(Policy):
    """Algorithm 1 (server) with Algorithm 2 (synchronization controller).

    Decisions (seeds README, and where the extracted pseudocode is ambiguous):

    * s_U is enforced: a worker is never sent weights while more than s_U pushes ahead of the slowest,
      whatever its remaining extra-iteration credit r_p says (README).
    * The push-time table A (two latest push times per worker) is updated on every push, not only
      when the controller runs; before a worker (the pusher or the slowest) has two pushes the
      controller returns r* = 0 (README).
    * "Slowest" = fewest pushes, ties to the first worker id; "fastest" = most pushes (any worker tied
      for the most counts). Ties in Algorithm 2's argmin go to the smallest r (README: the earliest
      stop point, fewer stale gradients).
    * r* is the number of releases granted beyond s_L *including the current one*: the worker then
      stops exactly at the push the controller simulated (Sim_p[r*]), so its threshold is
      s_L + r* <= s_U (Theorem 2's s_L + r). Read literally, Algorithm 1 (OK now, then r* more
      OKs while r_p > 0) would grant one push more than the controller chose.
    * A worker that waits is released as soon as it is within s_L of the slowest (line 17).
    """

    sync = "dssp"
    usage = "dssp (--staleness-range)"
    options = ("staleness_range",)

    @classmethod
    def from_options(cls, workers, staleness_range=None, **_):
        return cls(workers, *parse_staleness_range(staleness_range))

    def __init__(self, workers, s_lower, s_upper):
        super().__init__(workers)
        if s_lower < 0 or s_upper < 0:
            raise ConfigError(f"--staleness-range must be >= 0, got {s_lower},{s_upper}")
        if s_lower > s_upper:
            raise ConfigError(f"--staleness-range: sL ({s_lower}) must not exceed sU ({s_upper})")
        self.s_lower, self.s_upper = s_lower, s_upper
        self.r_max = s_upper - s_lower
        self.credit = dict.fromkeys(self.workers, 0)                     # r_p
        self.table = {w: [None, None] for w in self.workers}             # A[p]: latest, previous push

    def settings(self):
        return {"staleness_range": [self.s_lower, self.s_upper]}

    def gap_bound(self):
        return self.s_upper

    def _shift_times(self, dt):
        self.table = {w: [None if t is None else t + dt for t in ts] for w, ts in self.table.items()}

    def slowest(self):
        low = self.slowest_pushes()
        return next(w for w in self.workers if self.pushes[w] == low)

    def controller(self, p):
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

    def _removed(self, worker, now):
        del self.credit[worker], self.table[worker]
        slowest = self.slowest_pushes()          # line 17 with the new slowest
        ready = [w for w in self.workers if w in self.waiting and self.pushes[w] - slowest <= self.s_lower]
        return [self._release(ready)] if ready else []

    def _push(self, p, step, now, local_steps):
        self.table[p] = [now, self.table[p][0]]
        actions = [self._apply([(p, self.push_weight)], staleness=[self.version - step])]
        slowest = self.slowest_pushes()
        gap = self.pushes[p] - slowest
        release_p = False
        if self.credit[p] > 0:                                   # lines 3-5
            self.credit[p] -= 1
            release_p = gap <= self.s_upper                      # README: s_U enforced
        elif gap <= self.s_lower:                                # lines 8-9
            release_p = True
        elif self.pushes[p] == max(self.pushes.values()):        # lines 11-15
            r = min(self.controller(p), self.r_max)
            actions.append(Note("dssp_controller", {"worker": p, "r": r, "gap": gap}))
            if r > 0 and gap <= self.s_upper:
                self.credit[p] = r - 1                           # this release uses one
                release_p = True
        # line 17: waiting workers (p included when not released) go once within s_L
        ready = [w for w in self.workers if w in self.waiting
                 and ((w == p and release_p) or (w != p and self.pushes[w] - slowest <= self.s_lower))]
        if ready:
            actions.append(self._release(ready))
        return actions
