"""Receive-and-reduce policies of one worker: which updates Recv(k) waits for and how Reduce weighs them.

* :class:`Standard` -- one update of iteration k from every in-neighbour (Hop Figures 4 and 7); weights W
  (eq. (1) unless the topology file gives its own).
* :class:`Backup` -- backup workers (sec. 4.3, Figure 8): at least |N_in(i)| - B updates of iteration k,
  plus any extra ones already there; Reduce averages what it took (W renormalised over the taken set,
  which is the paper's plain average under eq. (1)).
* :class:`Stale` -- bounded staleness (sec. 4.4, Figure 9), and with ``backup > 0`` the hybrid setting:
  Recv(k) waits until the newest update ever received from every in-neighbour (all but B of them for
  hybrid) is no older than k - s; Reduce uses the *fresh* satisfactory updates (newest per neighbour, each
  used at most once) with the iteration weights of eq. (2) (``weighted``) or equal weights (``plain``),
  multiplied by W and renormalised (exactly eq. (2) under eq. (1) weights).

Here |N_in(i)| counts the in-neighbours other than i itself: the worker's own parameters are always
available and always part of Reduce. A policy never blocks: ``plan(k)`` returns None until it can go.
No MPI, no torch: parameters are opaque handles.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Optional, Union

from hopdec.core import Record, action
from hopdec.hop.config import check_backup
from hopdec.hop.update_queue import Entry, IterationSlots, NewestPerSender

SELF: None = None  # handle of the worker's own parameters in a Reduce term


@action
class Term(Record):
    """One summand of Reduce: ``weight`` times the parameters of ``sender`` at ``iteration``."""

    sender: int
    iteration: int
    handle: object
    weight: float


def _normalise(terms: Any) -> tuple:
    """Weights summing to 1, terms in sender order (self included): every worker of a complete graph
    then adds the same numbers in the same order and holds bit-identical parameters."""
    return _normalised([(t.sender, t.iteration, t.handle, t.weight) for t in terms])


def _normalised(raw: list[tuple[int, int, Any, float]]) -> tuple:
    """:func:`_normalise` of ``raw`` = ``[(sender, iteration, handle, weight)]`` (the self term first;
    sorted in place): the policies build plain tuples and make each :class:`Term` once.

    A worker whose file gives its self-loop weight 0 can have nothing of positive weight to reduce (bounded
    staleness with no fresh update left, a sender no longer waited for after a heal): it then keeps its own
    parameters, the local update that is always available (Hop sec. 3.1)."""
    total = sum([r[3] for r in raw])                # the order (and the sum) of the Term version
    if total <= 0.0:
        raw[0] = raw[0][:3] + (1.0,)
        total = 1.0
    raw.sort(key=_first)
    make = Term.make
    return tuple([make((s, it, h, w / total)) for s, it, h, w in raw])


_first = itemgetter(0)

_NONE = ()
"""What a policy returns when nothing is to be freed (read only: one object, not a new list per call)."""


class _Policy:
    queue: Any                                      # the subclass's update queue
    backup: int

    def __init__(self, rank: int, in_weights: dict, steps: Any = None) -> None:
        """``steps``: a time-varying topology's per-step in-weights (Recv(k) and Reduce(k) use step
        k mod P, :mod:`hopdec.hop.time_varying`); ``in_weights`` are then the union's senders."""
        self.rank = rank
        self.in_weights: dict = dict(in_weights)    # sender -> W[sender, rank], self included
        self.senders: list[int] = sorted(s for s in in_weights if s != rank)
        self._set_steps(steps)
        self.required_from: dict[int, int] = {}     # sender -> first iteration it is waited for (default 0)
        self.used: int = 0                          # updates that went into a Reduce
        self._dropped: int = 0                      # late or superseded updates thrown away (see dropped)

    def _set_steps(self, steps: Any) -> None:
        self.step_weights: tuple[dict, ...] = tuple(dict(w) for w in steps) if steps else (self.in_weights,)
        self.period: int = len(self.step_weights)
        self.step_senders: list[list[int]] = ([self.senders] if not steps else
                             [sorted(s for s in w if s != self.rank) for w in self.step_weights])
        self._full: list[Any] = [None] * self.period    # per step, once computed: _full_weights

    def _full_weights(self, step: int) -> tuple:
        """The normalised weights of a Reduce that has an update from every sender of ``step`` -- the same
        every iteration, so computed once: ``(own position, own weight, the others' in sender order)``,
        each exactly what :func:`_normalised` gives (the same sum, in the same order); ``()`` where the
        self-loop rule of :func:`_normalised` applies (nothing of positive weight)."""
        w = self.step_weights[step]
        raw = [(self.rank, 0, SELF, w[self.rank])] + [(s, 0, None, w[s]) for s in self.step_senders[step]]
        full: tuple = ()
        if sum([r[3] for r in raw]) > 0.0:
            terms = _normalised(raw)
            pos = [t.sender for t in terms].index(self.rank)
            full = (pos, terms[pos].weight, tuple(t.weight for t in terms if t.sender != self.rank))
        self._full[step] = full
        return full

    def weights_at(self, k: int) -> dict:
        """Sender -> W[sender, rank] of iteration k's step (self included)."""
        return self.step_weights[k % self.period]

    def required(self, k: int) -> list[int]:
        """The senders Recv(k) waits for (do not modify the list): on a time-varying topology, the
        in-neighbours of step k mod P. After a heal or a resume a sender's updates older than the iteration
        it was at are used if they are here, never waited for (they will not come)."""
        senders = self.step_senders[k % self.period]
        if not self.required_from:
            return senders
        return [s for s in senders if self.required_from.get(s, 0) <= k]

    def reconfigure(self, in_weights: dict, required_from: dict, backup: int = 0) -> list:
        """The graph around this worker changed (a heal after failures, or a resume): new senders and
        weights; ``required_from[s]`` is the iteration sender s is at (it sends that update again, so a held
        copy is dropped). Returns the held entries to free (senders gone, or about to be sent again)."""
        self.in_weights = dict(in_weights)
        self.senders = sorted(s for s in in_weights if s != self.rank)
        self._set_steps(None)
        self.required_from = dict(required_from)
        self.backup = min(backup, max(len(self.senders) - 1, 0))
        gone = self.queue.remove(lambda e: e.sender not in self.in_weights
                                 or e.iteration == required_from.get(e.sender))
        self._dropped += len(gone)
        return gone

    def receive(self, late: list, sender: int, iteration: int, handle: Any) -> None:
        """:meth:`on_update` of an update as the worker gets it (``Worker.on_update``): what must be freed is
        appended to ``late``."""
        gone = self.on_update(Entry(sender, iteration, handle))  # type: ignore[attr-defined]
        if gone:
            late += gone

    @property
    def dropped(self) -> int:
        """Late or superseded updates thrown away."""
        return self._dropped

    def _self_term(self, k: int, factor: float = 1.0) -> tuple[int, int, Any, float]:
        return (self.rank, k, SELF, self.step_weights[k % self.period][self.rank] * factor)

    @property
    def held(self) -> int:
        return self.queue.size


class Standard(_Policy):
    """Recv(k) needs the iteration-k update of every in-neighbour."""

    backup = 0

    def __init__(self, rank: int, in_weights: dict, slots: int, steps: Any = None) -> None:
        super().__init__(rank, in_weights, steps)
        self.queue = IterationSlots(slots)
        self.queue.floor = 0                        # oldest iteration that can still be used
        # an arriving update goes straight to the queue, which refuses late ones (sec. 6.2 a): one call
        self.receive = self.queue.receive           # type: ignore[method-assign]

    @property
    def floor(self) -> int:
        """The oldest iteration that can still be used (the queue's: it refuses older arrivals)."""
        return int(self.queue.floor)

    @property
    def dropped(self) -> int:
        return self._dropped + self.queue.refused

    def on_update(self, entry: Entry) -> Any:
        """File an arriving update; returns entries to free (late ones, sec. 6.2 a)."""
        late: list = []
        self.receive(late, entry.sender, entry.iteration, entry.handle)
        return late or _NONE

    def set_floor(self, k: int) -> Any:
        """Updates older than k can no longer be used: drop them (sec. 6.2 a). Nothing older than the floor
        is ever held (the queue refuses it), so a floor that does not rise drops nothing."""
        q = self.queue
        if k <= q.floor:
            return _NONE
        q.floor = k
        late = q.drop_older(k)
        if late:
            self._dropped += len(late)
        return late

    def waiting_for(self, k: int) -> list[int]:
        slot = self.queue.slot(k)
        out = []
        for s in self.required(k):
            e = slot.get(s)
            if e is None or e.iteration != k:
                out.append(s)
        return out

    def ready(self, k: int) -> bool:
        """Whether Recv(k) could complete now, with the updates already held (nothing is taken): every
        sender's update of iteration k is here (with backup workers, all but B of them)."""
        if k < self.floor:
            return False
        if not self.backup:
            slot = self.queue.slot(k)
            for s in self.required(k):
                e = slot.get(s)
                if e is None or e.iteration != k:
                    return False
            return True
        return self.queue.count(k) >= len(self.required(k)) - self.backup

    def plan(self, k: int) -> Optional[tuple]:
        """The Reduce terms for iteration k, or None while Recv(k) must still wait."""
        step = k % self.period
        got = None
        if not self.backup and not self.required_from and k >= self.floor:   # the usual case, at once
            got = self.queue.take_exactly(k, self.step_senders[step])
        if got is None:
            if not self.ready(k):
                return None
            got = self.queue.take(k)
        self.used += len(got)
        if len(got) == len(self.step_senders[step]):    # everyone's update (got is in sender order)
            full = self._full[step]
            if full is None:
                full = self._full_weights(step)
            if full:
                pos, own, ws = full
                make = Term.make
                terms: list = []
                add = terms.append                      # (a loop, not a comprehension: no frame of its own)
                for e, x in zip(got, ws):
                    add(make((e.sender, k, e.handle, x)))
                terms.insert(pos, make((self.rank, k, SELF, own)))
                return tuple(terms)
        w = self.step_weights[step]
        raw = [self._self_term(k)]
        for e in got:
            raw.append((e.sender, k, e.handle, w[e.sender]))
        return _normalised(raw)


class Backup(Standard):
    """Recv(k) needs |N_in(i)| - B updates of iteration k and takes any extra ones there (Figure 8)."""

    def __init__(self, rank: int, in_weights: dict, slots: int, backup: int, steps: Any = None) -> None:
        super().__init__(rank, in_weights, slots, steps)
        self.backup = check_backup(backup, rank, backup_limit(self.step_senders))


class Stale(_Policy):
    """Bounded staleness s (and the hybrid with B backup workers): newest update per neighbour."""

    def __init__(self, rank: int, in_weights: dict, staleness: int, weighted: bool = True, backup: int = 0,
                 steps: Any = None) -> None:
        super().__init__(rank, in_weights, steps)
        check_backup(backup, rank, backup_limit(self.step_senders))
        self.s: int = staleness
        self.weighted: bool = weighted
        self.backup = backup
        self.queue = NewestPerSender()
        self.newest_seen: dict[int, int] = {j: -1 for j in self.senders}   # iter_rcv of Figure 9
        self.floor = 0

    def reconfigure(self, in_weights: dict, required_from: dict, backup: int = 0) -> list:
        gone = super().reconfigure(in_weights, required_from, backup)
        self.newest_seen = {j: self.newest_seen.get(j, -1) for j in self.senders}
        return gone

    def on_update(self, entry: Entry) -> Any:
        if entry.iteration < self.floor:
            self._dropped += 1
            return [entry]
        if entry.iteration > self.newest_seen[entry.sender]:
            self.newest_seen[entry.sender] = entry.iteration
        gone = self.queue.put(entry)
        self._dropped += len(gone)
        return gone

    def set_floor(self, k: int) -> Any:
        """Recv(k) accepts nothing older than k - s: drop what fell out of the window."""
        self.floor = max(self.floor, k - self.s)
        late = self.queue.drop_older(self.floor)
        self._dropped += len(late)
        return late

    def waiting_for(self, k: int) -> list[int]:
        return [j for j in self.required(k) if self.newest_seen[j] < k - self.s]

    def ready(self, k: int) -> bool:
        """Whether Recv(k) could complete now (nothing is taken)."""
        required = self.required(k)
        fresh_enough = sum(1 for j in required if self.newest_seen[j] >= k - self.s)
        return fresh_enough >= len(required) - self.backup

    def plan(self, k: int) -> Optional[tuple]:
        min_iter = k - self.s
        if not self.ready(k):
            return None
        terms = [self._self_term(k, self._factor(k, k))]
        steps, period = self.step_weights, self.period
        for j in self.senders:
            e = self.queue.newest(j)
            if e is not None and e.iteration >= min_iter:
                self.queue.take(j)
                self.used += 1
                # an update weighs what its edge weighed at the step it was sent in
                w = steps[e.iteration % period][j]
                terms.append((j, e.iteration, e.handle, w * self._factor(e.iteration, k)))
        return _normalised(terms)

    def _factor(self, it: int, k: int) -> float:
        """Eq. (2): an update of iteration ``it`` weighs it - (k - s) + 1; ``plain`` weighs all alike."""
        return float(it - (k - self.s) + 1) if self.weighted else 1.0


def damped(terms: tuple, gamma: float) -> tuple:
    """Choco-SGD's consensus step (Koloskova et al. 2019) on a Reduce: move ``gamma`` of the way from the own
    parameters to the weighted average, ``x <- x + gamma * (sum_t w_t x_t - x)``, i.e. the own term's weight
    becomes ``1 - gamma + gamma * w_self`` and every other ``gamma * w``. With compressed exchanges the
    neighbours' terms are copies lagging their senders by what compression left out; the own term is the
    exact parameters (a worker has no single public copy of itself when its edges get different messages),
    so the copies' lag can move the workers' mean a little (a few % of their spread with top-k), and
    gamma < 1 moves it less at the price of slower mixing. gamma = 1 is the plain Reduce.

    >>> [t.weight for t in damped((Term(0, 3, SELF, 0.5), Term(1, 3, 7, 0.5)), 0.2)]
    [0.9, 0.1]
    """
    if gamma == 1.0:
        return terms
    return tuple(Term(t.sender, t.iteration, t.handle,
                      1.0 - gamma + gamma * t.weight if t.handle is SELF else gamma * t.weight) for t in terms)


def backup_limit(step_senders: Any) -> int:
    """Backup workers must be fewer than this: the in-degree (without self), the smallest over the steps
    of a time-varying topology where the node has any in-neighbour at all."""
    return min((len(s) for s in step_senders if s), default=0)


def make_policy(rank: int, in_weights: dict, slots: int, backup: int = 0, staleness: Optional[int] = None,
                weighted: bool = True, steps: Any = None) -> Union[Standard, Stale]:
    """The receive policy for a setting of Table 1: standard, backup, staleness or hybrid; ``steps``: the
    per-step in-weights of a time-varying topology (None: static)."""
    if staleness is not None:
        return Stale(rank, in_weights, staleness, weighted=weighted, backup=backup, steps=steps)
    if backup:
        return Backup(rank, in_weights, slots, backup, steps=steps)
    return Standard(rank, in_weights, slots, steps=steps)


__all__ = ["Entry", "SELF", "Term", "Standard", "Backup", "Stale", "make_policy", "damped"]
