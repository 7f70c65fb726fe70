"""Update queues of one worker (Hop sec. 4.1 and 6.1): where received parameters wait to be reduced.

Entries are tagged ``(iteration, sender)`` and carry an opaque ``handle`` that the transport resolves to
the received buffer; the queue never touches parameter data. Two layouts, as in the paper:

* :class:`IterationSlots` -- the rotating per-iteration queues of sec. 6.1 (``slots`` of them, indexed by
  ``iteration % slots``), for standard training and backup workers: updates are taken by iteration.
* :class:`NewestPerSender` -- the ``w_id``-tagged queue of bounded staleness (sec. 4.4/6.1): only the
  newest update of each sender is kept, older ones are dropped at once.

Both raise :class:`QueueOverflow` instead of silently overwriting: an overflow means the protocol let a
sender run further ahead than the queue was sized for, which is a bug the tests must see.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Callable, Optional

from hopdec.core import Record, action


class QueueOverflow(RuntimeError):
    """An update arrived for which the queue has no room (the protocol's bound was broken)."""


@action
class Entry(Record):
    """One received update: parameters of ``sender`` at ``iteration``, stored under ``handle``."""

    sender: int
    iteration: int
    handle: object


class IterationSlots:
    """Rotating per-iteration queues: slot ``it % slots`` holds at most one update per sender.

    >>> q = IterationSlots(slots=3)
    >>> q.put(Entry(sender=1, iteration=4, handle="h"))
    >>> q.count(4), q.count(5)
    (1, 0)
    >>> [e.handle for e in q.take(4)]
    ['h']
    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("an update queue needs at least one slot")
        self.slots = slots
        self._slot: list[dict[int, Entry]] = [dict() for _ in range(slots)]  # sender -> Entry
        self.size: int = 0
        self._low: int = -1                               # no entry held is older than this
        self.floor: float = -math.inf       # receive() refuses updates older than this: late (sec. 6.2 a);
                                            # the receive policy keeps it at its Recv's floor
        self.refused: int = 0               # late updates receive() refused

    def put(self, entry: Entry) -> None:
        """File ``entry`` (:meth:`receive`; one older than ``floor`` is an error here)."""
        late: list = []
        self.receive(late, entry.sender, entry.iteration, entry.handle)
        if late:
            raise ValueError(f"update of iteration {entry.iteration} is older than the floor {self.floor}")

    def receive(self, late: list, sender: int, iteration: int, handle: Any) -> None:
        """An update as it arrives: filed, or -- older than ``floor`` -- counted in ``refused`` and appended
        to ``late`` (its buffer is to be freed). The receive policy's own (``Standard.receive``): one call
        per update, the simulator's most frequent."""
        if iteration < self.floor:
            self.refused += 1
            late.append(Entry.make((sender, iteration, handle)))
            return
        slot = self._slot[iteration % self.slots]
        if sender in slot:
            raise QueueOverflow(
                f"update of iteration {iteration} from {sender} would overwrite iteration "
                f"{slot[sender].iteration} in a queue of {self.slots} slots")
        slot[sender] = Entry.make((sender, iteration, handle))
        self.size += 1
        if iteration < self._low:
            self._low = iteration

    def slot(self, iteration: int) -> dict[int, Entry]:
        """The slot of ``iteration``: sender -> Entry (an entry may be of another iteration; read only)."""
        return self._slot[iteration % self.slots]

    def count(self, iteration: int) -> int:
        """Number of updates of ``iteration`` held."""
        return sum(1 for e in self._slot[iteration % self.slots].values() if e.iteration == iteration)

    def senders(self, iteration: int) -> list[int]:
        return sorted(s for s, e in self._slot[iteration % self.slots].items() if e.iteration == iteration)

    def take(self, iteration: int) -> list[Entry]:
        """Remove and return every update of ``iteration`` (sorted by sender)."""
        slot = self._slot[iteration % self.slots]
        got = [e for e in slot.values() if e.iteration == iteration]
        if len(got) > 1:
            got.sort(key=_by_sender)
        for e in got:
            del slot[e.sender]
        self.size -= len(got)
        return got

    def take_exactly(self, iteration: int, senders: list[int]) -> Optional[list[Entry]]:
        """Remove and return the updates of ``iteration`` from ``senders``, in that order, when the slot
        holds exactly those (one each, nothing else); else None, taking nothing. (The usual Recv: a
        :meth:`take` without its scan and sort.)"""
        slot = self._slot[iteration % self.slots]
        if len(slot) != len(senders):
            return None
        for s in senders:
            e = slot.get(s)
            if e is None or e.iteration != iteration:
                return None
        self.size -= len(senders)
        return list(map(slot.pop, senders))

    def drop_older(self, iteration: int) -> Any:
        """Remove and return every update older than ``iteration`` (late updates, sec. 6.2)."""
        if iteration <= self._low or not self.size:  # nothing held is older (no scan)
            if not self.size and iteration > self._low:
                self._low = iteration
            return _NONE
        # every entry held is of an iteration >= _low, so only the slots of _low .. iteration - 1 can hold
        # older ones (usually one slot, emptied by the Recv just taken), scanned in slot order
        slots, n, low = self._slot, self.slots, self._low
        scan: Any = slots
        if iteration - low == 1:                    # the usual case: the slot of the Recv just taken
            scan = (slots[low % n],)
        elif iteration - low < n:
            scan = [slots[i] for i in sorted({it % n for it in range(low, iteration)})]
        out = []
        for slot in scan:
            if slot:
                for s in [s for s, e in slot.items() if e.iteration < iteration]:
                    out.append(slot.pop(s))
        self.size -= len(out)
        self._low = iteration
        return out

    def entries(self) -> list[Entry]:
        return [e for slot in self._slot for e in slot.values()]

    def remove(self, which: Callable[[Entry], Any]) -> list[Entry]:
        """Remove and return every entry for which ``which(entry)`` is true."""
        out = []
        for slot in self._slot:
            for s in [s for s, e in slot.items() if which(e)]:
                out.append(slot.pop(s))
        self.size -= len(out)
        return out


_by_sender = attrgetter("sender")

_NONE = ()
"""Nothing dropped (read only: one object, not a new list per call)."""


class NewestPerSender:
    """The ``w_id``-tagged queue for bounded staleness: keeps only each sender's newest update.

    ``put`` returns the entries it dropped (the older of the two), so the caller can free their buffers.

    >>> q = NewestPerSender()
    >>> q.put(Entry(2, 5, "a"))
    []
    >>> [e.handle for e in q.put(Entry(2, 7, "b"))]
    ['a']
    >>> q.newest(2).iteration
    7
    """

    def __init__(self) -> None:
        self._by_sender: dict[int, Entry] = {}
        self.size: int = 0

    def put(self, entry: Entry) -> list[Entry]:
        old = self._by_sender.get(entry.sender)
        if old is not None and old.iteration >= entry.iteration:
            return [entry]  # an older (or duplicate) update arriving late: drop the newcomer
        self._by_sender[entry.sender] = entry
        if old is None:
            self.size += 1
            return []
        return [old]

    def newest(self, sender: int) -> Optional[Entry]:
        return self._by_sender.get(sender)

    def take(self, sender: int) -> Optional[Entry]:
        e = self._by_sender.pop(sender, None)
        if e is not None:
            self.size -= 1
        return e

    def drop_older(self, iteration: int) -> list[Entry]:
        out = [e for e in self._by_sender.values() if e.iteration < iteration]
        for e in out:
            del self._by_sender[e.sender]
        self.size -= len(out)
        return out

    def entries(self) -> list[Entry]:
        return list(self._by_sender.values())

    def remove(self, which: Callable[[Entry], Any]) -> list[Entry]:
        """Remove and return every entry for which ``which(entry)`` is true."""
        out = [e for e in self._by_sender.values() if which(e)]
        for e in out:
            del self._by_sender[e.sender]
        self.size -= len(out)
        return out
