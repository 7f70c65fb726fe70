"""Token queues of one worker (Hop sec. 4.2, Figure 7): they bound how far a sender runs ahead.

TokenQ(j->i) lives at worker j and holds the tokens its in-neighbour i may take. Over a network, "taking a
token from j's queue" means j has told i how many tokens it ever inserted (a *grant*, one small message
carrying a cumulative count, so grants may be coalesced or overtaken), and i counts what it has taken.
The invariant of Theorem 2, ``TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig``, is then
``ledger_j.issued[i] - ledger_i.taken[j]`` and stays >= 0 because i never takes more than j granted.

Notify-ack (sec. 3.3) is the special case ``max_ig = 1``: the ACK that i sends after Reduce(k) is exactly
the token it inserts when entering k + 1.
"""

from hopdec.hop.config import check_max_ig


class TokenLedger:
    """Both sides of the token queues one worker takes part in.

    ``issued[i]``: tokens this worker put into TokenQ(self->i) for in-neighbour i (max_ig at start).
    ``taken[j]``: tokens it took from out-neighbour j; ``granted[j]``: what j has told it j issued.

    >>> led = TokenLedger(in_neighbors=[1], out_neighbors=[1], max_ig=2)
    >>> led.available(1), led.can_take(3)
    (2, False)
    >>> led.take(2); led.available(1)
    0
    >>> led.on_grant(1, 3); led.available(1)
    1
    """

    def __init__(self, in_neighbors, out_neighbors, max_ig):
        check_max_ig(max_ig, "max_ig")
        self.max_ig = max_ig
        self.issued = {i: max_ig for i in in_neighbors}
        self.taken = {j: 0 for j in out_neighbors}
        self.granted = {j: max_ig for j in out_neighbors}

    def available(self, j):
        """Tokens this worker may still take from out-neighbour j (its local view; never too many)."""
        return self.granted[j] - self.taken[j]

    def can_take(self, n=1):
        return all(self.available(j) >= n for j in self.taken)

    def take(self, n=1):
        for j in self.taken:
            if self.available(j) < n:
                raise RuntimeError(f"took {n} tokens from {j} with only {self.available(j)} granted")
        for j in self.taken:
            self.taken[j] += n

    def issue(self, n=1):
        """Insert n tokens into every local token queue; returns the grants ``[(i, cumulative)]`` to send."""
        for i in self.issued:
            self.issued[i] += n
        return sorted(self.issued.items())

    def on_grant(self, j, cumulative):
        if j in self.granted and cumulative > self.granted[j]:
            self.granted[j] = cumulative

    def lead_of(self, j):
        """How many iterations out-neighbour j is known to be ahead of this worker (sec. 5)."""
        return self.available(j) - self.max_ig

    def known_iteration(self, j, my_iteration):
        """Out-neighbour j's iteration as far as this worker knows (a lower bound)."""
        return my_iteration + self.lead_of(j)
