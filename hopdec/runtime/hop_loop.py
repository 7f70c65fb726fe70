"""The one Hop worker loop: carries out the protocol core's actions with a transport and a compute backend.

:func:`worker_loop` is a generator that yields whenever the core must wait for messages. The MPI runner
answers each yield by blocking on its transport; the in-process scheduler answers it by running another
worker. Either way the same loop and the same core run, so nothing of the protocol is forked per
transport.

A *transport* has an optional ``poll(core)`` (deliver what has arrived; called at the start and after
every action that takes time -- send, compute, reduce, apply -- not after bookkeeping actions nor after a
wait, which polled itself), ``send_update(iteration, dests, fill)``, ``send_grants(grants)``,
``payload(handle)`` and ``release(handles)``, and an optional ``wait_over()`` (called when the worker acts
again after one or more Waits: a transport that times its waits times that whole wait, see
:class:`hopdec.transport.waiting.WaitClock`); ``fill(out)`` writes the parameters into the transport's
send buffer (the one copy a send needs), or, for backends that keep their parameters in a pool of
message-sized stores (``send_storage()``, ``spare_stores()``, ``add_store()``, ``reduce(pairs, into=)``),
``send_from(iteration, dests, storage)``, ``sends_done(storage)`` and ``wait_sent(storage)`` with no copy
at all: Reduce writes a store whose sends all completed (``sends_done`` tests without blocking), or a new
one, up to :func:`store_cap`; only at the cap does it ``wait_sent`` (which blocks until the sends from a
store completed, or, in virtual time, returns something for the loop to yield: the driver resumes the
loop once they have -- see :mod:`hopdec.sim.sends`; a transport that codes its messages reads the
storage and sends its own smaller buffers). A transport with a ``bytes_sent`` counter gets each record's
``sent_bytes``: what the iteration's sends put on the wire. A transport with ``carries_grants = True`` takes the
``grants`` of an :class:`Enter` that is directly followed by a :class:`SendParams` as the fourth
argument of that send (``send_from``/``send_update(..., grants)``; every transport takes it, None when
there are none) and carries them in the update's header where
it can, sending the others as grant messages; a grant is never held past the next action. A *backend* has ``write_params(out=None)`` (into ``out``, or a new array),
``compute(iteration) -> dict`` (at least ``loss`` and ``compute_s``), ``reduce(pairs)`` with
``pairs = [(array or None for self, weight)]`` and ``apply(iteration)``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.actions import Enter, Jump, Reduce, ReleaseUpdates, SendAcks, SendParams
from hopdec.hop.receive import SELF


IterationRecord = dict
"""One line of ``rank{r}.jsonl``: what the worker did and measured in one iteration -- a plain dict (a
subclass misses the interpreter's fast paths for ``rec[key]``, read and written a dozen times per iteration)."""


def wait_kind(what: str) -> str:
    """``Wait.what`` of the Hop core as a short name: ``updates``, ``tokens``, ``acks`` (or ``other``)."""
    w = what.lower()
    for kind in ("updates", "tokens", "acks"):
        if w.startswith(kind):
            return kind
    return "other"


def worker_loop(core: Any, io: Any, backend: Any, on_record: Optional[Callable[[Any], Any]] = None,
                clock: Callable[[], float] = time.time, step: Any = False, spans: bool = False,
                detail: bool = True, instant: bool = False) -> Iterator[Any]:
    """Run ``core`` to the end; yields each :class:`Wait`. ``on_record(rec)`` gets one dict per iteration.

    With ``step=True`` it also yields every other action after carrying it out, so a scheduler can
    interleave workers action by action; ``step`` may instead be a set of action kinds to yield (a
    virtual-time driver needs only those it charges time for or watches, e.g.
    ``{ComputeGradient, Enter}``: resuming the generator for the others is work for nothing).

    Every record splits the iteration's time: ``compute_s``, ``send_s``, ``reduce_s``, ``apply_s``,
    ``poll_s`` (a transport with ``poll``: handing over what arrived between actions -- on a host with more
    ranks than cores, MPI's progress yields the core to other ranks there) and ``wait_s`` (of which ``wait_updates_s``, ``wait_tokens_s``, ``wait_acks_s`` by what the core waited
    for; ``waited_on``: ``[[rank, seconds], ...]`` for the ranks it waited on), and ``wait_sends_s``: before
    a Reduce overwrites a store it sent from (zero-copy sends, with every store of the pool busy and the
    pool at :func:`store_cap`), the wait for those sends to complete -- a slow receiver shows up here;
    ``send_stores``: in an iteration whose Reduce grew the pool, how many stores it has now. With
    ``spans=True`` it also
    has ``spans``: ``[[kind, start, seconds, detail], ...]`` in clock time, for a timeline trace
    (:mod:`hopdec.report.trace`).

    ``detail=False`` leaves out of the records what only a log file reads -- ``reduced``, ``sent_to``,
    ``sent_bytes``, ``waited_on``, ``tokens``, ``held``, ``used_total``, ``dropped_total`` -- and keeps
    the time split, iteration, loss and jumps (what a summary reads): a simulator that writes no logs
    does not build them for 10 million worker-iterations.

    ``instant=True``: ``clock`` does not move while a send, a Reduce or an Apply runs (virtual time: only
    computing and waiting take time), so their times are 0 without reading it (with ``spans`` it is read
    as always). A transport whose updates carry no parameters (``io.carries_data`` False: a timing-only
    simulation) gets no payloads to look up or release, and the backend's Reduce no pairs.
    """
    rec: Any = None
    t0: Any = 0.0
    poll: Any = getattr(io, "poll", None)
    carry = getattr(io, "carries_grants", False)
    deferred: Any = None        # grants to carry on the SendParams that follows them (``carries_grants``)
    send_storage = getattr(backend, "send_storage", None)
    spare_stores = getattr(backend, "spare_stores", None)
    cap = store_cap(core)
    # nothing can have arrived since the last poll worth another one (always, without a poll)
    fresh = poll is None
    every = step is True        # else the kinds to yield (none when False)
    stepped = frozenset() if every or not step else frozenset(step)
    timed = spans or not instant    # read the clock around actions (else they take no time on it)
    data = getattr(io, "carries_data", True)
    wait_over = getattr(io, "wait_over", None)  # told when the worker acts after waiting (its wait's clock)
    waited = False
    next_action = core.next_action
    while True:
        if not fresh:
            if rec is None:
                poll(core)      # hand over whatever arrived, so every decision sees the latest tokens
            else:               # timed: on an oversubscribed host MPI yields the core to other ranks here
                tp = clock()
                poll(core)
                rec["poll_s"] += clock() - tp
        a = next_action()
        kind = type(a)
        if deferred is not None and kind is not SendParams:
            io.send_grants(deferred)
            deferred = None
        if kind is Wait:
            t0 = clock()
            yield a
            fresh = waited = True       # (the driver's wait delivered what arrived: no poll needed)
            if rec is not None:
                _waited(rec, a, t0, clock() - t0, spans, detail)
            continue
        if waited:                      # the core repeats a Wait until it can act: the wait ended here
            waited = False
            if wait_over is not None:
                wait_over()
        # after bookkeeping actions (microseconds) another poll would find nothing new: only actions
        # that take time -- send, compute, reduce, apply -- are followed by one (``fresh`` False)
        if kind is Enter:
            if rec is not None and on_record:
                on_record(_close(rec, core) if detail else rec)
            rec = _RECORD.copy()              # (a copy of the template: twice as fast as keywords)
            rec["rank"], rec["iter"], rec["time"] = core.rank, a.iteration, clock()
            if poll is not None:
                rec["poll_s"] = 0.0
            if spans:
                rec["spans"] = []
            if a.jumped_from is not None:
                rec["jumped_from"] = a.jumped_from
            if detail and core.ledger is not None:
                rec["tokens"] = core.tokens()
            if a.grants:
                if carry:
                    deferred = a.grants     # sent with the update right behind it (or before the next action)
                else:
                    io.send_grants(a.grants)
        elif kind is SendParams:
            t0 = clock() if timed and rec is not None else 0.0
            dests = a.dests
            if dests:
                store = send_storage() if send_storage is not None else None
                before = getattr(io, "bytes_sent", None) if detail else None
                if store is not None:           # zero-copy: send from the parameters' own storage
                    io.send_from(a.iteration, dests, store, deferred)
                else:
                    io.send_update(a.iteration, dests, backend.write_params, deferred)
                if before is not None and rec is not None:      # what this send put on the wire
                    rec["sent_bytes"] = rec.get("sent_bytes", 0) + io.bytes_sent - before
            elif deferred is not None:
                io.send_grants(deferred)
            deferred = None
            if rec is not None:                 # (a catch-up send after a heal may come after the end)
                rec["sent"] += len(dests)
                if dests and detail:
                    rec.setdefault("sent_to", []).extend(dests)
                if a.skipped:
                    rec["send_skipped"] += len(a.skipped)
                if timed:
                    _timed(rec, "send", t0, clock(), spans, dests)
        elif kind is ComputeGradient:
            if spans:
                t0 = clock()
            rec.update(backend.compute(a.iteration))
            if spans:
                rec["spans"].append(["compute", t0 - rec["time"], rec["compute_s"], None])  # virtual time too
        elif kind is Reduce:
            t0 = clock() if timed and rec is not None else 0.0
            spares = spare_stores() if spare_stores is not None else None
            pairs = ([(None if t.handle is SELF else io.payload(t.handle), t.weight) for t in a.terms]
                     if data else _NO_PAIRS)
            if spares:                          # zero-copy: Reduce overwrites a store none of whose sends
                stores = len(spares) + 1
                into, added = writable_store(spares, backend, io, cap)  # is in flight, a new one, or
                t1 = t0                                                 # (at the cap) the oldest, once
                if into is None:                                        # it is free
                    into = spares[0]
                    pending = io.wait_sent(into)
                    if pending is not None:     # a virtual-time driver resumes us once it is
                        if not timed:
                            t0 = clock()
                        yield pending
                        t1 = clock()
                elif added:
                    rec["send_stores"] = stores + 1
                if timed:
                    t1 = clock()
                rec["wait_sends_s"] = rec.get("wait_sends_s", 0.0) + t1 - t0
                if spans and t1 - t0 > 1e-4:
                    rec["spans"].append(["wait", t0 - rec["time"], t1 - t0, ["sends to complete", []]])
                t0 = t1
                backend.reduce(pairs, into=into)
            else:
                backend.reduce(pairs)
            if data:
                io.release([t.handle for t in a.terms if t.handle is not SELF])
            if detail:
                rec.setdefault("reduced", []).append(
                    [[t.sender, t.iteration, _ROUND6[t.weight]] for t in a.terms])
            if timed:
                _timed(rec, "reduce", t0, clock(), spans, a.iteration)
        elif kind is ApplyGradient:
            if timed:
                t0 = clock()
            backend.apply(a.iteration)
            if timed:
                _timed(rec, "apply", t0, clock(), spans)
        elif kind is SendAcks:
            io.send_grants(a.acks)          # the same cumulative-count message, other meaning
        elif kind is ReleaseUpdates:
            io.release(a.handles)
        elif kind is Jump:
            rec["jump"] = [a.frm, a.to]
            if spans:
                rec["spans"].append(["jump", clock() - rec["time"], 0.0, [a.frm, a.to]])
        elif kind is Finished:
            if rec is not None and on_record:
                on_record(_close(rec, core) if detail else rec)
            return
        else:  # pragma: no cover - a new action without a handler is a programming error
            raise TypeError(f"unknown action {a!r}")
        if poll is not None:
            fresh = kind in _BOOKKEEPING
        if every or kind in stepped:
            yield a


def store_cap(core: Any) -> int:
    """How many message-sized stores a zero-copy worker may keep: one per update of its own that an
    out-neighbour can leave untaken while the protocol still lets this worker advance, plus the one its
    Reduce writes.

    A store is busy while a send from it has not completed, and a send above the eager limit completes
    only when the receiver takes it, which it does whenever it is in MPI -- not while it computes. A
    receiver posts ``slots`` receives per sender (``core.slots``; Hop sec. 6.1's update queue): ``max_ig
    + 1`` with token queues (sec. 4.2), one per iteration a sender can be ahead of it or level with it.
    When a straggler j starts computing iteration t it has taken this worker's update of t - 1 (its
    Reduce(t - 1) used it, or it was in MPI after it arrived); its tokens let this worker enter up to
    t + max_ig, so the updates of iterations t .. t + max_ig -- ``slots`` stores, the current one among
    them -- can be untaken at once, and Reduce(t + max_ig) needs one more to write: ``slots + 1``. With
    that many a fast worker runs as far ahead as the tokens allow (backup workers, staleness, skipping:
    secs. 5-6) without waiting for its sends; only beyond (a receiver that stalled after skipping this
    worker's update, say) does a Reduce wait, for the store whose sends are oldest. Notify-ack (sec. 3.3):
    one slot, two stores, never a wait (update k goes out once k - 1 was consumed). Queue-only (sec. 4.1):
    this worker's own path bound (``ahead_bound + 1`` slots) stands in for its out-neighbours'.
    """
    slots = getattr(core, "slots", None)
    return 2 if not slots else int(slots) + 1


def stores_line(counts: list[int], store_bytes: int, cap: int) -> str:
    """The summary's line on the zero-copy send stores: ``counts`` per worker (2 unless a slow receiver
    grew the pool), each of ``store_bytes`` (a message), at most ``cap`` (:func:`store_cap`)."""
    lo, hi = min(counts), max(counts)
    grew = sum(1 for c in counts if c > 2)
    return (f"send stores (zero-copy): {lo if lo == hi else f'{lo}-{hi}'} per worker of at most {cap} "
            f"({store_bytes:,} bytes each: up to {hi * store_bytes / 2 ** 20:.3g} MiB per worker; the pool grew "
            f"on {grew} of {len(counts)} workers, where a receiver was slow)")


def writable_store(spares: list[int], backend: Any, io: Any, cap: int) -> tuple[Optional[int], bool]:
    """``(store, added)``: a store that can be written now without waiting -- the first of ``spares`` (the
    backend's spare stores, oldest first) whose sends all completed (``io.sends_done`` tests without
    blocking), else a new one (``backend.add_store()``, ``added``) while the pool is below ``cap``
    stores; ``(None, False)`` at the cap."""
    done = io.sends_done
    for store in spares:
        if done(store):
            return store, False
    if len(spares) + 1 < cap:
        return backend.add_store(), True
    return None, False


_BOOKKEEPING = frozenset({Enter, SendAcks, ReleaseUpdates, Jump})
"""Actions that take no time worth polling after (the next action runs microseconds later)."""

_RECORD = dict(rank=0, iter=0, time=0.0, loss=None, compute_s=0.0, wait_s=0.0, reduce_s=0.0, send_s=0.0,
               apply_s=0.0, sent=0, send_skipped=0)
"""Every record's first fields, in their order in the log (read only: each record is a copy)."""

_NO_PAIRS: tuple = ()
"""What a Reduce hands a backend whose transport carries no parameters (read only)."""


class _Rounded(dict):
    """``round(w, 6)`` of Reduce weights for the log, remembered: a worker's weights repeat every iteration,
    and ``round`` to digits formats the number (microseconds, 4 terms per iteration). Zero is not kept (0.0
    and -0.0 are one key but print differently); at most 4096 weights are."""

    def __missing__(self, w: float) -> float:
        r = round(w, 6)
        if w:
            if len(self) >= 4096:
                self.clear()
            self[w] = r
        return r


_ROUND6 = _Rounded()


def _timed(rec: Any, kind: str, t0: float, t1: float, spans: bool, detail: Any = None) -> None:
    rec[kind + "_s"] += t1 - t0
    if spans:
        rec["spans"].append([kind, t0 - rec["time"], t1 - t0,
                             list(detail) if isinstance(detail, tuple) else detail])


def _waited(rec: Any, a: Any, t0: float, dt: float, spans: bool, detail: bool = True) -> None:
    """Book one wait of ``dt`` seconds for ``a.what`` on ``a.on``; consecutive waits for the same thing
    (the core repeats its Wait until what it needs is there) make one span."""
    kind = wait_kind(a.what)
    rec["wait_s"] += dt
    key = f"wait_{kind}_s"
    rec[key] = rec.get(key, 0.0) + dt
    if detail:
        on = rec.setdefault("waited_on", [])
        for j in a.on:
            for pair in on:
                if pair[0] == j:
                    pair[1] += dt
                    break
            else:
                on.append([j, dt])
    if spans:
        start = t0 - rec["time"]
        last = rec["spans"][-1] if rec["spans"] else None
        if last and last[0] == "wait" and last[3][0] == a.what and start - (last[1] + last[2]) < 1e-3:
            last[2] = start + dt - last[1]
            last[3][1] = sorted(set(last[3][1]) | set(a.on))
        else:
            rec["spans"].append(["wait", start, dt, [a.what, list(a.on)]])


def _close(rec: Any, core: Any) -> Any:
    c = core.counts()
    rec["held"], rec["used_total"], rec["dropped_total"] = c["held"], c["used"], c["dropped"]
    return rec
