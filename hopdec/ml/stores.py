"""The order of a zero-copy worker's pool of send stores: which store holds the values, and which the next
Reduce may write. One bookkeeping for the trainer's real stores (``FlatModel``) and the simulator's
(:mod:`hopdec.sim.hop`), so that both pick the same store; *which* spare is free to write is the worker
loop's decision (:func:`hopdec.runtime.hop_loop.writable_store`)."""


class StoreOrder:
    """Stores by index: ``cur`` holds the values; ``spares`` are the others, the one that stopped being
    current longest ago (its sends are the oldest) first. Two stores to begin with."""

    __slots__ = ("cur", "spares")

    def __init__(self):
        self.cur, self.spares = 0, [1]

    @property
    def count(self):
        return len(self.spares) + 1

    def add(self):
        """A new store's index, last among the spares."""
        i = self.count
        self.spares.append(i)
        return i

    def switch(self, into=None):
        """Make spare ``into`` (default: the oldest) current, the current one the newest spare; its index."""
        if into is None:
            into = self.spares[0]
        elif into == self.cur:
            raise ValueError("Reduce cannot write the store it reads (the current values)")
        self.spares.remove(into)
        self.spares.append(self.cur)
        self.cur = into
        return into
