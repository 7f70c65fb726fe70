"""The Hop invariants, checkable at any instant of a run that holds every worker's core.

For in-process drivers (the property tests, the simulator): after any step, every ordered pair's
iteration gap is within Hop Table 1's bound for the setting, every update queue is within its capacity
(sec. 4.1-4.2), Theorem 2's token relation ``TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig`` holds
(and the size is >= 0; a receiver never counts more tokens than were granted), with notify-ack at most
one update per sender is outstanding (sec. 3.3), and no update is lost (each one sent is in flight, held,
used or dropped as late).

On a time-varying topology (a schedule, :mod:`hopdec.hop.time_varying`) the token relation is checked on
every union edge and the gaps against Table 1 with activation gaps. With local steps (``--local-steps H``)
every iteration is a round of H inner steps and every bound is in rounds (a gap of B rounds is B*H inner
steps between the workers' round starts): the messages say so.

After a heal (workers failed, :meth:`Invariants.rebase`), newly connected workers may be further apart than
the healed graph allows: the ahead one then waits (for updates, or with a token deficit). The token relation
still holds as an equality; sizes may be negative by at most the deficit at the heal, and every gap may
exceed the healed graph's Table 1 bound by at most what the heal left, plus the one iteration a worker past
its Recv may still enter (then the ahead workers wait).
"""

import numpy as np

from hopdec.hop.config import in_steps, setting_name
from hopdec.hop.protocols import PROTOCOLS


class InvariantError(AssertionError):
    """A Hop invariant does not hold: a protocol bug."""


def table1_setting(cfg, graph=None):
    """(setting, max_ig) of Hop Table 1 that bounds a run of ``cfg`` on ``graph`` (queue-only: no tokens)."""
    return PROTOCOLS[cfg.protocol].table1(cfg, setting_name(cfg, graph))


class Invariants:
    """Checks the invariants over the workers' cores; records the largest gap seen for every ordered
    pair in ``max_gap`` (indexed by position in the sorted worker ids)."""

    def __init__(self, graph, cfg):
        self.cfg = cfg
        # with local steps an iteration is a round of them: the core, and so every bound here, counts
        # rounds (the inner steps run inside a round's ComputeGradient and never reach the protocol)
        self.unit = f"rounds of {cfg.local_steps} local steps" if cfg.local_steps > 1 else "iterations"
        self.deficit = 0
        self.healed = False                 # after a heal a catch-up update may sit beside the others
        self.checks = 0
        self._bounds_for(graph)
        n = len(self.ids)
        self.max_gap = np.zeros((n, n))

    def _bounds_for(self, graph):
        from hopdec.topology.bounds import gap_bounds
        from hopdec.topology.heal import relabelled
        self.ids = sorted(graph.nodes)
        if graph.graph.get("schedule") is not None:     # time-varying (hopdec.hop.time_varying)
            from hopdec.hop.time_varying import gap_bounds as time_varying_bounds
            self.bounds = time_varying_bounds(graph, self.cfg)
            return
        setting, max_ig = table1_setting(self.cfg, graph)
        self.bounds = gap_bounds(relabelled(graph), setting, max_ig=max_ig, staleness=self.cfg.staleness)

    def rebase(self, graph, cores):
        """The graph was healed: check against its bounds from now on, allowing what the heal left beyond
        them -- the gaps in excess of the healed graph's Table 1 bounds at that moment and the token
        deficit (the sum over edges of how far a size is below 0). Neither grows: the ahead workers wait."""
        self._bounds_for(graph)
        self.healed = True
        self.max_gap = np.zeros((len(self.ids), len(self.ids)))
        by_id = self._by_id(cores)
        it = np.array([by_id[r].iteration for r in self.ids])
        over = it[:, None] - it[None, :] - self.bounds
        np.fill_diagonal(over, -np.inf)                 # a worker is never apart from itself
        excess = float(over.max())
        self.deficit = max(0.0, excess)
        for c in by_id.values():
            if c.ledger is not None:
                for i in c.view.in_neighbors:
                    self.deficit += max(0, -(c.ledger.issued[i] - by_id[i].ledger.taken[c.rank]))
        if self.deficit or excess >= 0:
            # a worker already past its Recv when the heal came may still enter one more iteration: beyond
            # the healed bound when its gap was at the bound already (a directed cycle that lost a node)
            self.deficit += 1

    @staticmethod
    def _by_id(cores):
        return dict(cores) if isinstance(cores, dict) else {c.rank: c for c in cores}

    def check(self, cores, in_flight=None, sent_to=None):
        """``cores``: the live workers' cores (a list indexed by id, or a dict id -> core);
        ``in_flight[r]``: updates on their way to worker r; ``sent_to[r]``: updates ever sent to r (both
        optional: without them the no-update-lost check is skipped)."""
        by_id = self._by_id(cores)
        it = np.array([by_id[r].iteration for r in self.ids])
        gap = it[:, None] - it[None, :]
        self.max_gap = np.maximum(self.max_gap, gap)
        if not (gap <= self.bounds + self.deficit).all():
            a, b = np.argwhere(gap > self.bounds + self.deficit)[0]
            raise InvariantError(f"Iter({self.ids[a]}) - Iter({self.ids[b]}) = {in_steps(gap[a, b], self.cfg)} "
                                 f"exceeds Table 1's bound {in_steps(self.bounds[a, b], self.cfg)}"
                                 + (f" + the heal's deficit {self.deficit}" if self.deficit else "")
                                 + f" ({self.unit} {dict(zip(self.ids, it.tolist()))})")
        for c in by_id.values():
            if c.held_updates > c.capacity() + (len(c.view.in_neighbors) if self.healed else 0):
                raise InvariantError(f"worker {c.rank} holds {c.held_updates} updates, capacity "
                                     f"{c.capacity()}")
            if in_flight is not None:
                p = c.policy
                if sent_to[c.rank] != in_flight[c.rank] + c.held_updates + p.used + p.dropped:
                    raise InvariantError(f"worker {c.rank}: {sent_to[c.rank]} updates sent to it, but "
                                         f"{in_flight[c.rank]} in flight + {c.held_updates} held + "
                                         f"{p.used} used + {p.dropped} dropped")
            if c.acks is not None:                    # notify-ack: one outstanding update per sender
                for j in c.view.out_neighbors:
                    out = c.acks.sent - by_id[j].acks.consumed[c.rank]
                    if not 0 <= out <= 1:
                        raise InvariantError(f"worker {c.rank} has {out} updates outstanding at {j} "
                                             f"(notify-ack allows one)")
            led = c.ledger
            if led is None:
                continue
            for i in c.view.in_neighbors:
                size = led.issued[i] - by_id[i].ledger.taken[c.rank]
                if size != c.iteration - by_id[i].iteration + led.max_ig or size < -self.deficit:
                    raise InvariantError(f"TokenQ({c.rank}->{i}) holds {size} tokens; Theorem 2 says "
                                         f"{c.iteration - by_id[i].iteration + led.max_ig} (Iter counts "
                                         f"{self.unit})")
                if by_id[i].ledger.granted[c.rank] > led.issued[i]:
                    raise InvariantError(f"worker {i} counts {by_id[i].ledger.granted[c.rank]} tokens "
                                         f"from {c.rank}, which issued {led.issued[i]}")
        self.checks += 1
