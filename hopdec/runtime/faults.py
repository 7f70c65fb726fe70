"""Fault injection for the tests (hidden options ``--die-rank R --die-at K --die-how H --die-phase P``).

Rank R fails in phase P (setup, train at iteration >= K, evaluate, shutdown) the way H says (R, K and P
may be comma-separated lists, pairwise: ``--die-rank 3,6 --die-at 10,20`` kills two ranks,
``--die-rank 3,6 --die-phase train,shutdown`` one while training and one at shutdown): ``exit``
(the process dies, as a crashed node), ``hang`` (alive but silent, as a hung node) or ``raise`` (an
exception, as a bug or a failed device). The options are :class:`hopdec.settings.Faults`.
"""

import os
import time


class Faults:
    """What this rank should fail, and where; :meth:`at` is called at each phase's point."""

    def __init__(self, settings, rank):
        """``settings``: :class:`hopdec.settings.Faults`."""
        ranks = list(settings.die_rank)
        at = list(settings.die_at) or [0]
        phases = list(settings.die_phase) or ["train"]
        self.armed = rank in ranks
        i = ranks.index(rank) if self.armed else 0
        self.phase = phases[i] if i < len(phases) else phases[0]
        self.iteration = at[i] if i < len(at) else at[0]
        self.how = settings.die_how

    def at(self, phase, iteration=None):
        if not self.armed or phase != self.phase or (iteration is not None and iteration < self.iteration):
            return
        if self.how == "hang":
            time.sleep(10 ** 6)
        if self.how == "raise":
            raise RuntimeError(f"injected failure in {phase}")
        os._exit(17)
