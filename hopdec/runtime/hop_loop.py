"""The one Hop worker loop: carries out the protocol core's actions with a transport and a compute backend.

:func:`worker_loop` is a generator that yields whenever the core must wait for messages. The MPI runner
answers each yield by blocking on its transport; the in-process scheduler answers it by running another
worker. Either way the same loop and the same core run, so nothing of the protocol is forked per
transport.

A *transport* has an optional ``poll(core)`` (deliver what has arrived; called before every action),
``send_update(iteration, dests, fill)``, ``send_grants(grants)``, ``payload(handle)``
and ``release(handles)``; ``fill(out)`` writes the parameters into the transport's send buffer (the one
copy a send needs), or, for backends that keep their parameters in message-sized storage
(``send_storage()``/``spare_storage()``), ``send_from(iteration, dests, storage)`` and
``wait_sent(storage)`` with no copy at all. A *backend* has ``write_params(out=None)`` (into ``out``, or a new array),
``compute(iteration) -> dict`` (at least ``loss`` and ``compute_s``), ``reduce(pairs)`` with
``pairs = [(array or None for self, weight)]`` and ``apply(iteration)``.
"""

import time

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.actions import Enter, GrantTokens, Jump, Reduce, ReleaseUpdates, SendAcks, SendParams
from hopdec.hop.receive import SELF


class IterationRecord(dict):
    """One line of ``rank{r}.jsonl``: what the worker did and measured in one iteration."""


def worker_loop(core, io, backend, on_record=None, clock=time.time, step=False):
    """Run ``core`` to the end; yields each :class:`Wait`. ``on_record(rec)`` gets one dict per iteration.

    With ``step=True`` it also yields every other action after carrying it out, so a scheduler can
    interleave workers action by action, and a virtual-time driver can charge time for it.
    """
    rec = None
    poll = getattr(io, "poll", None)
    while True:
        if poll is not None:
            poll(core)          # hand over whatever arrived, so every decision sees the latest tokens
        a = core.next_action()
        if isinstance(a, Wait):
            t0 = clock()
            yield a
            if rec is not None:
                rec["wait_s"] += clock() - t0
            continue
        if isinstance(a, Enter):
            if rec is not None and on_record:
                on_record(_close(rec, core))
            rec = IterationRecord(rank=core.rank, iter=a.iteration, time=clock(), loss=None,
                                  compute_s=0.0, wait_s=0.0, reduce_s=0.0, sent=0, send_skipped=0)
            if a.jumped_from is not None:
                rec["jumped_from"] = a.jumped_from
            if core.ledger is not None:
                rec["tokens"] = min((core.ledger.available(j) for j in core.view.out_neighbors),
                                    default=None)
        elif isinstance(a, SendParams):
            if a.dests:
                store = getattr(backend, "send_storage", None)
                store = store() if store is not None else None
                if store is not None:           # zero-copy: send from the parameters' own storage
                    io.send_from(a.iteration, a.dests, store)
                else:
                    io.send_update(a.iteration, a.dests, backend.write_params)
            if rec is not None:                 # (a catch-up send after a heal may come after the end)
                rec["sent"] += len(a.dests)
                rec["send_skipped"] += len(a.skipped)
        elif isinstance(a, GrantTokens):
            io.send_grants(a.grants)
        elif isinstance(a, SendAcks):
            io.send_grants(a.acks)          # the same cumulative-count message, other meaning
        elif isinstance(a, ComputeGradient):
            rec.update(backend.compute(a.iteration))
        elif isinstance(a, Reduce):
            t0 = clock()
            spare = getattr(backend, "spare_storage", None)
            spare = spare() if spare is not None else None
            if spare is not None:
                io.wait_sent(spare)             # Reduce overwrites it: its sends must be done
            backend.reduce([(None if t.handle is SELF else io.payload(t.handle), t.weight)
                            for t in a.terms])
            io.release(tuple(t.handle for t in a.terms if t.handle is not SELF))
            rec["reduce_s"] += clock() - t0
            rec.setdefault("reduced", []).append(
                [[t.sender, t.iteration, round(t.weight, 6)] for t in a.terms])
        elif isinstance(a, ApplyGradient):
            backend.apply(a.iteration)
        elif isinstance(a, ReleaseUpdates):
            io.release(a.handles)
        elif isinstance(a, Jump):
            rec["jump"] = [a.frm, a.to]
        elif isinstance(a, Finished):
            if rec is not None and on_record:
                on_record(_close(rec, core))
            return
        else:  # pragma: no cover - a new action without a handler is a programming error
            raise TypeError(f"unknown action {a!r}")
        if step:
            yield a


def _close(rec, core):
    rec["held"] = core.held_updates
    rec["used_total"] = core.policy.used
    rec["dropped_total"] = core.policy.dropped
    return rec
