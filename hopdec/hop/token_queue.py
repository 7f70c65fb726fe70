"""Token queues of one worker (Hop sec. 4.2, Figure 7): they bound how far a sender runs ahead.

TokenQ(j->i) lives at worker j and holds the tokens its in-neighbour i may take. Over a network, "taking a
token from j's queue" means j has told i how many tokens it ever inserted (a *grant*, one small message
carrying a cumulative count, so grants may be coalesced or overtaken), and i counts what it has taken.
The invariant of Theorem 2, ``TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig``, is then
``ledger_j.issued[i] - ledger_i.taken[j]`` and stays >= 0 because i never takes more than j granted.

Notify-ack (sec. 3.3), the baseline token queues generalise, is :class:`AckLedger`: ACKs are cumulative
counts on the same kind of message, sent by a receiver right after its Reduce.
"""

from __future__ import annotations

from typing import Any, Iterable

from hopdec.hop.config import check_max_ig


class TokenLedger:
    """Both sides of the token queues one worker takes part in.

    ``issued[i]``: tokens this worker put into TokenQ(self->i) for in-neighbour i (max_ig at start).
    ``taken[j]``: tokens it took from out-neighbour j; ``granted[j]``: what j has told it j issued.

    A worker inserts a token into every local queue at once (entering an iteration, Figure 7) and takes one
    from every out-neighbour at once, so ``issued`` and ``taken`` hold one count each for all neighbours
    (``issued_each``, ``taken_each``; the dicts are views of them): taking is one comparison with the
    smallest grant, not a pass over the neighbours (this runs once per worker-iteration of a simulation).

    >>> led = TokenLedger(in_neighbors=[1], out_neighbors=[1], max_ig=2)
    >>> led.available(1), led.can_take(3)
    (2, False)
    >>> led.take(2); led.available(1)
    0
    >>> led.on_grant(1, 3); led.available(1)
    1
    """

    ins: tuple[int, ...]            # in-neighbours, sorted (the order of the grants)
    issued_each: int                # tokens put into each in-neighbour's queue
    taken_each: int                 # tokens taken from each out-neighbour
    granted: dict[int, int]         # out-neighbour -> what it has told this worker it issued

    def __init__(self, in_neighbors: Iterable[int], out_neighbors: Iterable[int], max_ig: int) -> None:
        check_max_ig(max_ig, "max_ig")
        self.max_ig = max_ig
        self.reset(in_neighbors, out_neighbors, 0, dict.fromkeys(out_neighbors, 0))

    @property
    def issued(self) -> dict[int, int]:
        """In-neighbour -> tokens put into its queue (a new dict, in in-neighbour order)."""
        return dict.fromkeys(self.ins, self.issued_each)

    @property
    def taken(self) -> dict[int, int]:
        """Out-neighbour -> tokens taken from it (a new dict)."""
        return dict.fromkeys(self.granted, self.taken_each)

    def available(self, j: int) -> int:
        """Tokens this worker may still take from out-neighbour j (its local view; never too many)."""
        return self.granted[j] - self.taken_each

    def can_take(self, n: int = 1) -> bool:
        return not self.granted or min(self.granted.values()) - self.taken_each >= n

    def take(self, n: int = 1) -> None:
        if not self.take_if(n):
            j = min(self.granted, key=self.available)
            raise RuntimeError(f"took {n} tokens from {j} with only {self.available(j)} granted")

    def take_if(self, n: int = 1) -> bool:
        """:meth:`take` n tokens from every out-neighbour if :meth:`can_take`; returns whether it did."""
        granted = self.granted
        if granted and min(granted.values()) - self.taken_each < n:
            return False
        self.taken_each += n
        return True

    def issue(self, n: int = 1) -> tuple[tuple[int, int], ...]:
        """Insert n tokens into every local token queue; returns the grants ``((i, cumulative), ...)`` to
        send, sorted by in-neighbour."""
        c = self.issued_each = self.issued_each + n
        return tuple([(i, c) for i in self.ins])

    def on_grant(self, j: int, cumulative: int) -> None:
        granted = self.granted
        if cumulative > granted.get(j, cumulative):     # (a grant from a worker no longer an out-neighbour: none)
            granted[j] = cumulative

    def reset(self, in_neighbors: Iterable[int], out_neighbors: Iterable[int], my_iteration: int,
              their_iterations: Any) -> None:
        """Re-establish the token queues on a changed set of edges (a heal, or a resume) from the workers'
        iterations alone: with no message in flight, Theorem 2's relation fixes every count --
        ``issued[i] = Iter(me) + max_ig``, ``taken[j] = Iter(me)``, ``granted[j] = Iter(j) + max_ig``. A new
        out-neighbour more than max_ig behind leaves this worker short of tokens (it waits for it)."""
        k = int(my_iteration)
        self.ins = tuple(sorted(in_neighbors))
        self.issued_each = k + self.max_ig
        self.taken_each = k
        self.granted = {j: int(their_iterations[j]) + self.max_ig for j in out_neighbors}

    def lead_of(self, j: int) -> int:
        """How many iterations out-neighbour j is known to be ahead of this worker (sec. 5)."""
        return self.available(j) - self.max_ig


class AckLedger:
    """Notify-ack (Hop sec. 3.3, Figure 2 (a)): both sides of the ACKs one worker takes part in.

    A worker sends an ACK to all its in-neighbours right after Reduce(k): the updates of iteration k they
    sent have been consumed (:meth:`consume`, counts are cumulative). It may not Send(k) before every
    out-neighbour has ACKed update k - 1 (:meth:`may_send`), so at most one update per sender is ever
    outstanding, and Iter(j) - Iter(i) <= 2 for an edge j -> i (sec. 3.3; Table 1's notify-ack row).

    >>> a = AckLedger(in_neighbors=[2], out_neighbors=[1])
    >>> a.may_send(0), a.may_send(1)
    (True, False)
    >>> a.on_ack(1, 1); a.may_send(1), a.missing(2)
    (True, [1])
    >>> a.consume(0)
    [(2, 1)]
    """

    def __init__(self, in_neighbors: Iterable[int], out_neighbors: Iterable[int]) -> None:
        self.acked: dict[int, int] = {j: 0 for j in out_neighbors}     # my updates out-neighbour j has consumed
        self.consumed: dict[int, int] = {i: 0 for i in in_neighbors}   # updates of in-neighbour i I have consumed
        self.sent: int = 0                                  # updates I have sent (to every out-neighbour)

    def may_send(self, k: int) -> bool:
        """Update k may go out once every out-neighbour consumed update k - 1."""
        return all(c >= k for c in self.acked.values())

    def missing(self, k: int) -> list[int]:
        return [j for j, c in sorted(self.acked.items()) if c < k]

    def consume(self, k: int) -> list[tuple[int, int]]:
        """Reduce(k) consumed iteration k's updates: the ACKs ``[(in-neighbour, cumulative)]`` to send."""
        for i in self.consumed:
            self.consumed[i] = k + 1
        return sorted(self.consumed.items())

    def on_ack(self, j: int, cumulative: int) -> None:
        if j in self.acked and cumulative > self.acked[j]:
            self.acked[j] = cumulative
