"""Progress lines of a long simulation, by the wall clock: where the simulated workers are, and how long
the user still waits.

A simulation of 10,000 workers x 1000 iterations runs for minutes; without a line it looks hung.
:class:`WallProgress` is the event queue's watch hook (:meth:`hopdec.sim.events.EventQueue.watch`): every
``interval`` seconds of wall time it prints one line on stderr::

    progress  12 s  at 61.2 virtual s  iter 240..243 of 1000 (slowest rank 17, fastest rank 5)  20.1 it/s  ETA 38 s

The iterations are every worker's *now* (one process holds them all: a consistent snapshot, unlike a
real run's reports); ``it/s`` and the ETA are the slowest unfinished worker's progress per wall second
since the start, which is what the user waits for; the virtual time is labelled as such. Nothing is printed before the
first interval, so short simulations stay silent.
"""

import sys
import time


class WallProgress:
    """``iterations()``: the current iteration of every worker still running, ``{rank: iteration}``
    (the simulator's cores; finished and dead workers left out); ``total``: the iterations of the run;
    ``now()``: the virtual time; ``what``: what an iteration is (``round`` with --local-steps)."""

    def __init__(self, iterations, total, now, interval=3.0, stream=None, clock=time.monotonic, what="iter"):
        self.iterations, self.total, self.now, self.what = iterations, int(total), now, what
        self.interval, self.clock = float(interval), clock
        self.stream = stream or sys.stderr
        self.t0 = clock()
        self._next = self.t0 + self.interval
        start = iterations()
        self._low0 = min(start.values()) if start else 0        # where the slowest starts (a resume: > 0)
        self.lines = 0

    def __call__(self):
        t = self.clock()
        if t < self._next:
            return None
        its = self.iterations()
        self._next = t + self.interval
        if not its:
            return None
        slow = min(its, key=lambda w: (its[w], w))
        fast = max(its, key=lambda w: (its[w], -w))
        low = its[slow]
        rate = (low - self._low0) / (t - self.t0) if low > self._low0 and t > self.t0 else None
        if its[fast] > low:
            where = f"{self.what} {low}..{its[fast]} of {self.total} (slowest rank {slow}, fastest rank {fast})"
        else:
            where = f"{self.what} {low} of {self.total}" + (" (every worker)" if len(its) > 1 else "")
        parts = [f"progress  {t - self.t0:.0f} s  at {self.now():.6g} virtual s", where]
        if rate is not None:                # since the start: the slowest worker's pace
            parts.append(f"{rate:.3g} {'rounds' if self.what == 'round' else 'it'}/s")
            parts.append(f"ETA {max(self.total - 1 - low, 0) / rate:.0f} s")
        line = "  ".join(parts)
        print(line, file=self.stream, flush=True)
        self.lines += 1
        return line


WATCH_EVENTS = 4096
"""Events between two looks at the wall clock (a simulation runs 25,000-60,000 events per second here)."""


def running(sim):
    """``{rank: iteration}`` of the workers of ``sim`` still running (a :class:`~hopdec.sim.hop.HopSim`,
    :class:`~hopdec.sim.ps.PSSim` or :class:`~hopdec.sim.allreduce.AllReduceSim`: cores and ``done``)."""
    cores = sim.cores.items() if isinstance(sim.cores, dict) else ((c.rank, c) for c in sim.cores)
    done = sim.done
    return {w: c.iteration for w, c in cores if not done[w]}


def attach(sim, total, settings, stream=None, what="iter"):
    """Print progress lines while ``sim`` runs, unless ``--no-progress``: every ``--progress-interval``
    seconds of wall time (default 3); ``what``: what ``total`` counts (``round``: rounds of local steps)."""
    if not settings.observe.progress:
        return None
    q = sim.q
    p = WallProgress(lambda: running(sim), total, lambda: q.now, interval=settings.observe.every_s,
                     stream=stream, what=what)
    q.watch(WATCH_EVENTS, p)
    return p
