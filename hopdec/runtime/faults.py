"""Fault injection for the tests (hidden options ``--die-rank R --die-at K --die-how H --die-phase P``).

Rank R fails in phase P (setup, train at iteration >= K, evaluate, shutdown) the way H says: ``exit``
(the process dies, as a crashed node), ``hang`` (alive but silent, as a hung node) or ``raise`` (an
exception, as a bug or a failed device).
"""

import os
import time


class Faults:
    """What this rank should fail, and where; :meth:`at` is called at each phase's point."""

    def __init__(self, args, rank):
        self.armed = getattr(args, "die_rank", None) == rank
        self.phase = getattr(args, "die_phase", "train")
        self.iteration = getattr(args, "die_at", None) or 0
        self.how = getattr(args, "die_how", "exit")

    def at(self, phase, iteration=None):
        if not self.armed or phase != self.phase or (iteration is not None and iteration < self.iteration):
            return
        if self.how == "hang":
            time.sleep(10 ** 6)
        if self.how == "raise":
            raise RuntimeError(f"injected failure in {phase}")
        os._exit(17)
