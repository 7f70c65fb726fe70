"""The parameter-server loops: carry out the server core's and a worker core's actions.

Like :mod:`hopdec.runtime.hop_loop` for Hop, each loop is a generator that yields every
:class:`~hopdec.core.Wait` of its core; the driver answers by waiting for a message and feeding it to the
core (the MPI runner :mod:`hopdec.runtime.ps_mpi` blocks on MPI, the in-process driver :mod:`hopdec.sim.ps` runs
other cores). With ``step=True`` a loop also yields every other action after carrying it out, so a
virtual-time driver can charge time for it. No protocol decision is taken here.

Server side: ``io`` has ``pushed(worker)`` (the received buffer), ``send_weights(worker, version, gap,
staleness, model, now)`` (``now``: one time for every worker of the send), ``answer(worker, ready)`` and ``stop(worker, staleness)``; ``model`` has
``apply_gradients(pairs)`` and ``add_deltas(pairs)`` with ``pairs = [(buffer, weight)]``.

Worker side: ``io`` has ``weights()`` (the received buffer), ``push_gradient(step, iteration, grad)``,
``push_delta(round, local_steps, iteration, delta)`` and ``query(round, k, c, iteration)``; ``backend``
has ``compute(iteration) -> dict``, ``apply(iteration)``, ``load_params(buf)``, ``keep_params()``,
``gradient()`` and ``delta()`` (current parameters minus the kept ones).
"""

import time

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.ps.actions import (AnswerQuery, ApplyDeltas, ApplyGradients, Checkpoint, DropGradient, LoadWeights,
                               Note, PushDelta, PushGradient, QueryState, SaveCheckpoint, SendWeights,
                               StopWorkers)


def server_loop(core, io, model, on_event=None, clock=time.time, step=False, on_checkpoint=None):
    """Run the server core to the end (call ``core.start`` first); yields each Wait.

    ``on_event(name, **data)`` gets the server's log events: ``apply``, ``drop``, ``release``, ``stop``,
    ``note`` (with the time each was carried out); ``on_checkpoint(action)`` saves the server's state at a
    :class:`~hopdec.ps.actions.Checkpoint`. Weights and stops carry the latest cut to ``io`` as keyword
    arguments ``cut``/``keep_from`` (only when there is one) and ``pin`` (only when there is one)."""
    log = on_event or (lambda *a, **k: None)
    while True:
        a = core.next_action()
        if isinstance(a, Wait):
            yield a
            continue
        if isinstance(a, Finished):
            return
        now = clock()
        if isinstance(a, ApplyGradients):
            model.apply_gradients([(io.pushed(w), wt) for w, wt in a.parts])
            log("apply", time=now, version=a.version, kind="grad", workers=[w for w, _ in a.parts],
                weights=[wt for _, wt in a.parts], steps=list(a.steps), staleness=list(a.staleness),
                dur=clock() - now)
        elif isinstance(a, ApplyDeltas):
            model.add_deltas([(io.pushed(w), wt) for w, wt in a.parts])
            log("apply", time=now, version=a.version, kind="delta", workers=[w for w, _ in a.parts],
                weights=[wt for _, wt in a.parts], steps=list(a.steps), staleness=[0] * len(a.parts))
        elif isinstance(a, DropGradient):
            log("drop", time=now, worker=a.worker, step=a.step, version=a.version)
        elif isinstance(a, SendWeights):
            marks = _marks(a)
            for w, g, s in zip(a.workers, a.gaps, a.staleness):
                io.send_weights(w, a.version, g, s, model, now, **marks)
            log("release", time=now, workers=list(a.workers), version=a.version, gaps=list(a.gaps),
                reason=a.reason)
        elif isinstance(a, AnswerQuery):
            io.answer(a.worker, a.ready)
        elif isinstance(a, StopWorkers):
            marks = _marks(a)
            for w, s in zip(a.workers, a.staleness):   # DISCARDED: its last gradient came after the stop
                io.stop(w, s, **marks)
        elif isinstance(a, Checkpoint):
            log("checkpoint", time=now, cut=a.cut, version=a.version, work=a.work, final=a.final)
            if on_checkpoint:
                on_checkpoint(a)
        elif isinstance(a, Note):
            log("stop" if a.event == "stop" else "note", time=now,
                **({} if a.event == "stop" else {"what": a.event}), **a.data)
        else:  # pragma: no cover - a new action without a handler is a programming error
            raise TypeError(f"unknown server action {a!r}")
        if step:
            yield a


def _marks(a):
    """The checkpoint marks a release or stop carries to the worker (none before the first cut)."""
    if not a.cut:
        return {}
    return {"cut": a.cut, "keep_from": a.keep_from, **({"pin": a.pin} if a.pin else {})}


def worker_loop(core, io, backend, on_record=None, clock=time.time, step=False, on_checkpoint=None):
    """Run a PS worker core to the end; yields each Wait. ``on_checkpoint(action)`` saves the worker's
    state at a :class:`~hopdec.ps.actions.SaveCheckpoint` (its last record is written first).
    ``on_record(rec)`` gets one dict per mini-batch:
    ``iter``, ``time`` (SGD: the server's send time of the weights it computed on, so the observed gap is
    the one the server enforced; ESync: when the local step began), ``loss``, ``compute_s``, ``wait_s``,
    ``version``, ``gap``, ``staleness`` (of its gradient when applied; -1: dropped), ``t_released`` (SGD:
    the server's send time of the next weights, the instant the server let it go on), ...
    """
    rec = None
    step_start = c = None

    def close():
        nonlocal rec
        if rec is not None:
            if not core.pushes_differences:
                rec["staleness"] = core.staleness
            if on_record:
                on_record(rec)
        rec = None

    carry = 0.0                                     # waiting before the first record of a round
    while True:
        a = core.next_action()
        if isinstance(a, Wait):
            t0 = clock()
            yield a
            waited = clock() - t0
            if rec is not None:
                rec["wait_s"] += waited
            else:
                carry += waited
            continue
        if isinstance(a, Finished):
            close()
            return
        if isinstance(a, LoadWeights):
            if not core.pushes_differences:
                if rec is not None and core.sent_at is not None:
                    rec["t_released"] = core.sent_at    # the server ended this mini-batch then (its clock)
                close()
                rec = dict(rank=core.worker, iter=core.iteration, time=core.sent_at, version=a.version,
                           gap=core.gap, t_recv=clock(), wait_s=carry)
                carry = 0.0
            backend.load_params(io.weights())
            if a.keep:
                backend.keep_params()
        elif isinstance(a, ComputeGradient):
            if core.pushes_differences:
                close()
                step_start = clock()
                rec = dict(rank=core.worker, iter=a.iteration, time=step_start, round=core.version,
                           local_step=core.local_steps + 1, version=core.version, wait_s=carry)
                carry = 0.0
            rec.update(backend.compute(a.iteration))
        elif isinstance(a, ApplyGradient):
            backend.apply(a.iteration)
            c = clock() - step_start                # the device's capability (ESync sec. 4.1)
        elif isinstance(a, PushGradient):
            rec["t_push"] = clock()
            io.push_gradient(a.step, a.iteration, backend.gradient())
            rec["push_s"] = clock() - rec["t_push"]
        elif isinstance(a, QueryState):
            io.query(a.round, a.k, c, a.iteration)
        elif isinstance(a, PushDelta):
            rec["round_steps"] = a.local_steps
            io.push_delta(a.round, a.local_steps, a.iteration, backend.delta())
        elif isinstance(a, SaveCheckpoint):
            close()                                 # the log the checkpoint records ends with it
            if on_checkpoint:
                on_checkpoint(a)
        else:  # pragma: no cover
            raise TypeError(f"unknown worker action {a!r}")
        if step:
            yield a
