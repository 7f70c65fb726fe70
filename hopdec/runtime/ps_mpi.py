"""A parameter-server run on MPI: rank 0 runs the server core, ranks 1..n the worker cores.

The run's assembly (:class:`hopdec.modes.PSRun`: the cores, the trainers, the budget, the headers, the
title, what is evaluated and saved) on real processes: a thin driver that receives a message, feeds it to
the core, and carries out the core's actions with :func:`hopdec.runtime.ps_loop.server_loop` /
:func:`~hopdec.runtime.ps_loop.worker_loop` over :mod:`hopdec.transport.ps`. Every decision (who waits,
what is applied, when to stop, where to checkpoint) is the cores' (:mod:`hopdec.ps.server`,
:mod:`hopdec.ps.worker`).

Logs (``--log-dir``): workers write ``rank{r}.jsonl`` with one record per mini-batch (``rank``, ``iter``,
``time``, ``loss``, ``compute_s``, ``wait_s``, the weights ``version`` it computed on, the ``staleness``
of its gradient when applied (-1: dropped), the ``gap`` it had when sent the weights, ...). ``time`` is
the server's send time of the weights the iteration computed on (one machine clock, ``time.time()``), so
the summary's observed gap is the one the server enforced. The server writes ``rank0.jsonl``: a header,
then events (``apply``, ``drop``, ``release``, ``stop``, ``note``, ``eval``) without an ``iter`` key.
"""

import time

from hopdec.ml import transfers


def run(ctx):
    """Run the PS mode on this rank (collective); rank 0 prints the summary and returns it."""
    from hopdec.modes.work import save_params
    from hopdec.observe import RunObserver
    from hopdec.runtime.backend import ServerModel, TorchBackend, WorkerBackend
    from hopdec.runtime.failures import announce_ps_failure, how_failed
    from hopdec.runtime.metrics import EventLog, RankLogger, log_path
    from hopdec.runtime.ps_loop import server_loop, worker_loop
    from hopdec.runtime.resume import PSRank, open_log
    from hopdec.runtime.summary import gather_summary
    from hopdec.transport.collectives import barrier
    from hopdec.transport.ps import ServerIO, WorkerIO
    from hopdec.transport.ulfm import fault_tolerant
    from hopdec.transport.waiting import watching

    s, ps, rank = ctx.settings, ctx.run, ctx.rank
    ft = s.faults.fault_tolerance
    if ft:
        ctx.comm = fault_tolerant(ctx.comm)         # worker ids stay the first communicator's ranks
    comm = ctx.comm
    ctx.worker = rank
    policy, workers = ps.policy, ps.workers
    timeout = ctx.timeout
    trainer = ps.trainer(rank, ctx.device)
    keep = PSRank(ctx, trainer)                     # checkpoints, resume, Ctrl-C (hopdec.runtime.resume)
    if rank == 0:
        emulator = None
        header = ps.header(0, trainer.numel, device=str(ctx.device), **keep.header())
        events = EventLog(ctx.log_dir, header, append=open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, 0)))
        logger = RankLogger(None, 0)
        model = ServerModel(trainer)
        io = ServerIO(comm, workers, trainer.numel, timeout, fault_tolerant=ft)
        core = ps.server_core(checkpoints=keep.checkpoints)
        io.on_stop_notice = lambda w, signum: keep.on_stop_notice(core, signum)
        io.on_worker_failed = announce_ps_failure   # when it happens, not only in the summary
        obs = RunObserver(s.observe, comm, timeout, events, "ps-server", workers, ctx.iterations, header,
                          bound=ps.bound(), board_extra=lambda: f"server v{policy.version}, {core.dropped} dropped")

        def on_event(name, **data):
            events(name, **data)
            obs.event(name, **data)
        eval_interval = float(s.observe.eval_interval or 0.0)
        evals = []

        def evaluate(now):
            loss, acc = trainer.evaluate()
            rec = dict(time=now, elapsed=now - t0, version=policy.version, work=core.work,
                       test_loss=loss, test_acc=acc)
            evals.append(rec)
            events("eval", **rec)

        barrier(comm, timeout, "start")
        t0 = time.time()
        obs.begin(t0)
        resumed_at = None                   # the version a resume started from (the server line says so)
        if keep.resume_server(core, io):
            resumed_at = policy.version
        else:
            core.start(t0)
        if eval_interval > 0:               # (after a resume: labelled with the version and work it resumed at)
            evaluate(t0)
        last_eval = time.time()
        with watching(keep.server_watch(core)):
            for wait in server_loop(core, io, model, on_event=on_event,
                                    on_checkpoint=lambda a: keep.save_server(core, io, a, events)):
                io.wait(core, wait)
                ctx.faults.at("train", core.work)
                if eval_interval > 0 and time.time() - last_eval >= eval_interval:
                    evaluate(time.time())
                    last_eval = time.time()
        ctx.faults.at("shutdown")
        io.close()
        elapsed = time.time() - t0
        obs.close()
        end = keep.outcome(core) if not ft else _on_survivors(ctx, lambda: keep.outcome(core), "how the run ended")
        if end["stopped"]:
            events.close()
            return keep.report_stop(end)
        evaluate(time.time())
        final = evals[-1]
        events("summary", elapsed=elapsed, version=policy.version, applied=core.applied,
               dropped=core.dropped, discarded=core.discarded, unfinished=core.unfinished, work=core.work,
               test_loss=final["test_loss"], test_acc=final["test_acc"])
        events.close()
        if ps.saves(0):
            save_params(ctx.log_dir, 0, trainer.write_params())
        extra = dict(server_updates=policy.version, dropped=core.dropped, elapsed_server=elapsed)
        notes = ps.failure_notes(core)
    else:
        emulator = ctx.make_emulator(rank, workers)
        header = ps.header(rank, trainer.numel, emulator.describe(), device=str(ctx.device), **keep.header())
        logger = RankLogger(ctx.log_dir, rank, header=header,
                            append=open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, rank)))
        backend = WorkerBackend(TorchBackend(trainer, emulator, faults=ctx.faults))
        io = WorkerIO(comm, trainer.numel, timeout, fault_tolerant=ft)
        io.how_failed = how_failed                  # the line says what became of a failed server
        core = ps.worker_core(rank)
        keep.resume_worker(core)
        obs = RunObserver(s.observe, comm, timeout, logger.event, "ps-worker", workers, ctx.iterations, header,
                          bound=ps.bound())

        def on_record(rec):
            logger.log(rec)
            obs.on_record(rec)
        barrier(comm, timeout, "start")
        obs.begin()
        with watching(keep.worker_watch(io)):
            for wait in worker_loop(core, io, backend, on_record=on_record,
                                    on_checkpoint=lambda a: keep.save_worker(core, a, logger)):
                io.wait(core, wait)
        obs.finished(logger.last_iter)
        ctx.faults.at("shutdown")
        io.close()
        obs.close()
        transfers.log_to(logger, ctx.device)
        logger.close()
        end = keep.outcome() if not ft else _on_survivors(ctx, keep.outcome, "how the run ended")
        if end["stopped"]:
            return keep.report_stop(end)
        if ps.saves(rank):
            save_params(ctx.log_dir, rank, trainer.write_params())
        extra, notes = {}, []
    if rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)

    def summary():
        return gather_summary(ctx, logger, trainer, emulator, ps.title(),
                              eval_flat=trainer.write_params() if rank == 0 else None,
                              bound=ps.bound(), extra=extra, workers=set(workers), model_label=ps.model_label,
                              bound_label=ps.bound_label, notes=notes,
                              finished=[w for w in workers if w not in core.failed] if rank == 0 else None)
    out = summary() if not ft else _on_survivors(ctx, summary, "gathering the summary")
    if rank == 0:
        print(ps.server_line(core, f"{elapsed:.2f} s", resumed_at), flush=True)
    return out


def _on_survivors(ctx, collective, what):
    """Fault tolerant: run ``collective`` (how the run ended, the summary) on the survivors
    (:func:`hopdec.transport.ulfm.on_survivors`); ``ctx.comm`` becomes their communicator."""
    from hopdec.transport.ulfm import on_survivors

    def on(comm):
        ctx.comm = comm
        return collective()
    out, ctx.comm = on_survivors(ctx.comm, on, ctx.timeout, what)
    return out
