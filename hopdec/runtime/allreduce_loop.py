"""The one all-reduce worker loop: carries out the all-reduce core's actions (:mod:`hopdec.allreduce`)
with a transport and a compute backend, under MPI (:mod:`hopdec.runtime.allreduce_mpi`) and in virtual
time (:mod:`hopdec.sim.allreduce`) alike.

A *transport* has ``start(iteration, grad)``: begin summing ``grad`` (a host float32 array, already
scaled by the core's weight) over every worker, in place; the driver answers the core's
:class:`~hopdec.core.Wait` by waiting for it and calling ``core.on_reduced``. A *backend* has
``compute(iteration) -> dict`` (``loss``, ``compute_s``, ...), ``gradient()`` (the gradient as a host
float32 array the transport may reduce in place; None for a timing-only simulation, which moves no
numbers), ``load_gradient(arr)`` (put the reduced gradient back
where the optimizer reads it; nothing to do when ``gradient()`` was a view) and ``apply(iteration)``.

Each record (one line of ``rank{r}.jsonl``) has ``rank``, ``iter``, ``time`` (when the worker entered
the iteration), ``loss``, ``compute_s``, ``wait_s`` (blocked in the all-reduce: waiting for the slowest
worker and moving the gradient; no ``waited_on``: it would list every other worker, n - 1 pairs in every
record), ``allreduce_s`` (from the start of
the reduction to its end) and ``apply_s``, as the decentralized loop's records do
(:mod:`hopdec.runtime.hop_loop`), so the report, plots and trace read them the same way.
"""

import time

import numpy as np

from hopdec.allreduce.worker import AllReduce
from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.actions import Enter
from hopdec.runtime.hop_loop import _timed, _waited


def worker_loop(core, io, backend, on_record=None, clock=time.time, step=False, spans=False):
    """Run ``core`` to the end; yields each :class:`Wait` (and, with ``step=True``, every other action
    after carrying it out, so a virtual-time driver can charge time for it)."""
    rec = grad = None
    started = None
    while True:
        a = core.next_action()
        kind = type(a)
        if kind is Wait:
            t0 = clock()
            yield a
            if rec is not None:
                _waited(rec, a, t0, clock() - t0, spans, detail=False)
            continue
        t0 = clock()
        if kind is Enter:
            if rec is not None and on_record:
                on_record(rec)
            rec = _RECORD.copy()              # (a copy of the template: twice as fast as keywords)
            rec["rank"], rec["iter"], rec["time"] = core.rank, a.iteration, t0
            if spans:
                rec["spans"] = []
        elif kind is ComputeGradient:
            rec.update(backend.compute(a.iteration))
            if spans:
                rec["spans"].append(["compute", t0 - rec["time"], rec["compute_s"], None])
        elif kind is AllReduce:
            grad = backend.gradient()
            if grad is not None and a.weight != 1.0:
                grad *= np.float32(a.weight)
            started = t0
            io.start(a.iteration, grad)
        elif kind is ApplyGradient:
            rec["allreduce_s"] = t0 - started
            backend.load_gradient(grad)
            backend.apply(a.iteration)
            _timed(rec, "apply", t0, clock(), spans)
        elif kind is Finished:
            if rec is not None and on_record:
                on_record(rec)
            return
        else:  # pragma: no cover - a new action without a handler is a programming error
            raise TypeError(f"unknown action {a!r}")
        if step:
            yield a


_RECORD = dict(rank=0, iter=0, time=0.0, loss=None, compute_s=0.0, wait_s=0.0, allreduce_s=0.0, apply_s=0.0)
"""A record's keys in their order, with the values an iteration starts from."""
