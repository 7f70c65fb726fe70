"""An all-reduce run on MPI: one worker per rank, the mean gradient by one nonblocking MPI all-reduce
per iteration (synchronous data parallelism, what PyTorch DDP does).

The run's assembly (:class:`hopdec.modes.AllReduceRun`: the core, the trainer, the header, the title,
what is evaluated and saved) on real processes: this rank's :class:`~hopdec.allreduce.Worker` core driven
by :func:`hopdec.runtime.allreduce_loop.worker_loop` over :class:`AllReduceIO` (``MPI_Iallreduce`` in place
on the flat gradient: one message per iteration, no copy on CPU, bounded by the peer timeout), with the
decentralized runner's checkpoints and stops (:class:`hopdec.runtime.resume.HopRank`: the core has the
same cut interface) and observers. No fault tolerance: a synchronous all-reduce cannot go on without a
worker (the settings refuse ``--fault-tolerance`` in this mode).
"""

import numpy as np

from hopdec.ml import transfers


class AllReduceIO:
    """The gradient's all-reduce on a communicator of its own (so the stop agreement's and the
    observers' messages never interleave with it)."""

    def __init__(self, comm, timeout):
        self.comm = comm.Dup()
        self.rank = comm.Get_rank()
        self.timeout = timeout
        self.req = None
        self.iteration = None
        self.reductions = 0
        self.bytes = 0

    def start(self, iteration, grad):
        from mpi4py import MPI
        self.iteration = iteration
        self.req = self.comm.Iallreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        self.reductions += 1
        self.bytes += grad.nbytes

    def wait(self, core, wait_action):
        """Block until this iteration's all-reduce completed (PeerTimeout after the peer timeout)."""
        from hopdec.transport.waiting import poll_until
        poll_until(self.req.Test, self.timeout, lambda: (       # (a collective does not say who is missing)
            f"rank {self.rank}: the all-reduce of iteration {self.iteration} did not complete within "
            f"{self.timeout:.0f} s; a peer may have died or hung"), on=wait_action.on, name_silent=True)
        core.on_reduced(self.iteration)

    def counters(self):
        return dict(reductions=self.reductions, bytes=self.bytes)


class AllReduceBackend:
    """:class:`hopdec.runtime.backend.TorchBackend` plus the gradient as a host array: a view of the flat
    gradient on CPU (reduced in place), a copy staged through host memory on a GPU."""

    def __init__(self, backend):
        self.b, self.t = backend, backend.t
        self.cpu = self.t.device.type == "cpu"

    def compute(self, iteration):
        return self.b.compute(iteration)

    def gradient(self):
        g = self.t.flat.grad
        if self.cpu:
            return g.numpy()
        transfers.to_host(g.numel() * 4, "gradient")
        return g.detach().cpu().numpy()

    def load_gradient(self, arr):
        if not self.cpu:
            import torch
            transfers.to_device(np.asarray(arr).nbytes, "gradient")
            self.t.flat.grad.copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(self.t.device))

    def apply(self, iteration):
        self.b.apply(iteration)


class Evaluations:
    """``--eval-interval``: rank 0 evaluates the model (every worker's: they are identical) at the first
    iteration boundary every SECONDS of wall time, and writes ``DIR/eval.jsonl`` (``time``, ``test_loss``,
    ``test_acc``, ``iter_min``/``iter_mean``: the iteration, ``eval_s``: what the evaluation took -- every
    worker waited that long in the next all-reduce, so a reader can take it out of the run's time)."""

    def __init__(self, run, trainer, interval, log_dir):
        import os
        self.run, self.trainer, self.interval = run, trainer, float(interval or 0.0)
        self.path = os.path.join(log_dir, "eval.jsonl") if log_dir and self.interval > 0 else None
        self.records, self.last = [], None
        self.done = -1                      # the last iteration evaluated: each one is evaluated once

    def start(self, k=0):
        """Training starts (or resumes) at iteration ``k``: the first evaluation."""
        import time
        self.last = time.time()
        if self.interval > 0:
            self._evaluate(k)

    def after(self, action):
        import time

        from hopdec.hop.actions import Enter
        if (self.interval > 0 and type(action) is Enter and action.iteration > self.done
                and time.time() - self.last >= self.interval):
            self._evaluate(action.iteration)

    def _evaluate(self, k):
        import time
        t0 = time.time()
        loss, acc = self.trainer.evaluate()
        self.last = time.time()
        self.done = k
        self._write(dict(time=t0, test_loss=loss, test_acc=acc, iter_min=k, iter_mean=k, eval_s=self.last - t0,
                         model=self.run.eval_model))

    def final(self, k, loss, acc):
        import time
        if self.interval > 0:
            self._write(dict(time=time.time(), test_loss=loss, test_acc=acc, iter_min=k, iter_mean=k,
                             model=self.run.eval_model, final=True))

    def _write(self, rec):
        import json

        from hopdec.files import writing
        self.records.append(rec)
        if self.path:
            with writing(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")


def run(ctx):
    """Train on this rank until the run's last iteration; print the summary on rank 0. Collective."""
    from hopdec.core import Wait
    from hopdec.modes.work import save_params
    from hopdec.observe import RunObserver
    from hopdec.runtime.allreduce_loop import worker_loop
    from hopdec.runtime.backend import TorchBackend
    from hopdec.runtime.metrics import RankLogger, log_path
    from hopdec.runtime.resume import HopRank, open_log
    from hopdec.runtime.summary import gather_summary
    from hopdec.transport.collectives import barrier, broadcast

    s, ar, rank = ctx.settings, ctx.run, ctx.rank
    comm = ctx.comm
    ctx.worker = rank
    trainer = ar.trainer(rank, ctx.device)
    # every replica starts from rank 0's parameters and buffers, as PyTorch DDP's constructor broadcasts them
    # (a factory that seeds by rank trained different replicas to the end, reported as "every worker's")
    trainer.load_replica_state(broadcast(comm, trainer.replica_state(), ctx.timeout, "the initial model"))
    emulator = ctx.make_emulator(rank, ctx.size)
    core = ar.core(rank)
    io = AllReduceIO(comm, ctx.timeout)
    bound = ar.bound()
    keep = HopRank(ctx, core, trainer, bound)      # checkpoints, resume, Ctrl-C (hopdec.runtime.resume)
    header = ar.header(trainer.numel, emulator.describe(), device=str(ctx.device),
                       message_bytes=ar.message_bytes(trainer.numel), **keep.header())
    continues = open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, rank))
    logger = RankLogger(ctx.log_dir, rank, header=header, append=continues)
    obs = RunObserver(s.observe, comm, ctx.timeout, logger.event, "worker", range(ctx.size), ctx.iterations,
                      header, bound=bound)
    keep.watched_by(obs, continues)                 # (eval.jsonl: cut back with the logs on a resume)

    def on_record(rec):
        logger.log(rec)
        obs.on_record(rec)

    backend = AllReduceBackend(TorchBackend(trainer, emulator, faults=ctx.faults))
    evals = Evaluations(ar, trainer, s.observe.eval_interval if rank == 0 else 0, ctx.log_dir)
    barrier(comm, ctx.timeout, "start")            # start together: iteration times are comparable
    obs.begin()
    evals.start(keep.start)
    with keep.running():                            # every wait notices a stop request (Ctrl-C)
        for a in worker_loop(core, io, backend, on_record=on_record, spans=obs.spans, step=True):
            if not isinstance(a, Wait):
                keep.after(a, logger)               # Enter(K): the periodic checkpoint; a stop request
                evals.after(a)                      # Enter(K): rank 0's evaluation, when one is due
                continue
            with keep.wakeable():                   # a stop agreed meanwhile ends the wait
                io.wait(core, a)
        keep.finish(logger)                         # the final checkpoint
        obs.finished(core.iteration)
        ctx.faults.at("shutdown")
    keep.close()
    obs.close()
    logger.event("messages", **io.counters())
    transfers.log_to(logger, ctx.device)
    if keep.stopped:                                # Ctrl-C: no summary; rank 0 says how to resume
        logger.close()
        return keep.report_stop()
    if ctx.rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)
    if ar.saves(rank):
        save_params(ctx.log_dir, rank, trainer.write_params())
    per_it = io.bytes / max(io.reductions, 1)
    notes = [f"traffic: every worker all-reduced {per_it:,.0f} bytes of gradient per iteration "
             f"({io.reductions} reductions, MPI_Iallreduce)"]
    out = gather_summary(ctx, logger, trainer, emulator, ar.title(),
                         eval_flat=trainer.write_params() if rank == 0 else None, bound=bound,
                         model_label=ar.model_label, bound_label=ar.bound_label, notes=notes)
    if out is not None:
        logger.event("summary", test_acc=out["avg_acc"], test_loss=out["avg_loss"], max_gap=out["max_gap"],
                     model=ar.eval_model)
        evals.final(core.iteration, out["avg_loss"], out["avg_acc"])
    logger.close()
    return out
