"""The Hop invariants, checkable at any instant of a run that holds every worker's core.

For in-process drivers (the property tests, the simulator): after any step, every ordered pair's
iteration gap is within Hop Table 1's bound for the setting, every update queue is within its capacity
(sec. 4.1-4.2), Theorem 2's token relation ``TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig`` holds
(and the size is >= 0; a receiver never counts more tokens than were granted), with notify-ack at most
one update per sender is outstanding (sec. 3.3), and no update is lost (each one sent is in flight, held,
used or dropped as late).
"""

import numpy as np

from hopdec.hop.config import setting_name


class InvariantError(AssertionError):
    """A Hop invariant does not hold: a protocol bug."""


def table1_setting(cfg, graph=None):
    """(setting, max_ig) of Hop Table 1 that bounds a run of ``cfg`` on ``graph`` (queue-only: no tokens)."""
    if cfg.protocol == "queue-only":
        return "standard", None
    if cfg.protocol == "notify-ack":
        return "notify-ack", None
    return setting_name(cfg, graph), cfg.max_ig


class Invariants:
    """Checks the invariants over a list of :class:`hopdec.hop.worker.Worker` cores; records the largest
    gap seen for every ordered pair in ``max_gap``."""

    def __init__(self, graph, cfg):
        from hopdec.topology.bounds import gap_bounds
        self.cfg = cfg
        setting, max_ig = table1_setting(cfg, graph)
        self.bounds = gap_bounds(graph, setting, max_ig=max_ig, staleness=cfg.staleness)
        n = graph.number_of_nodes()
        self.max_gap = np.zeros((n, n))
        self.checks = 0

    def check(self, cores, in_flight=None, sent_to=None):
        """``in_flight[r]``: updates on their way to worker r; ``sent_to[r]``: updates ever sent to r
        (both optional: without them the no-update-lost check is skipped)."""
        it = np.array([c.iteration for c in cores])
        gap = it[:, None] - it[None, :]
        self.max_gap = np.maximum(self.max_gap, gap)
        if not (gap <= self.bounds).all():
            i, j = np.argwhere(gap > self.bounds)[0]
            raise InvariantError(f"Iter({i}) - Iter({j}) = {gap[i, j]} exceeds Table 1's bound "
                                 f"{self.bounds[i, j]:g} (iterations {it.tolist()})")
        for c in cores:
            if c.held_updates > c.capacity():
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
                    out = c.acks.sent - cores[j].acks.consumed[c.rank]
                    if not 0 <= out <= 1:
                        raise InvariantError(f"worker {c.rank} has {out} updates outstanding at {j} "
                                             f"(notify-ack allows one)")
            led = c.ledger
            if led is None:
                continue
            for i in c.view.in_neighbors:
                size = led.issued[i] - cores[i].ledger.taken[c.rank]
                if size != c.iteration - cores[i].iteration + led.max_ig or size < 0:
                    raise InvariantError(f"TokenQ({c.rank}->{i}) holds {size} tokens; Theorem 2 says "
                                         f"{c.iteration - cores[i].iteration + led.max_ig}")
                if cores[i].ledger.granted[c.rank] > led.issued[i]:
                    raise InvariantError(f"worker {i} counts {cores[i].ledger.granted[c.rank]} tokens "
                                         f"from {c.rank}, which issued {led.issued[i]}")
        self.checks += 1
