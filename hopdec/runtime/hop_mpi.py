"""A decentralized (Hop) run on MPI: one worker per rank, parameters only to neighbours.

The run's assembly (:class:`hopdec.modes.HopRun`: the core, the trainer, the header, the title, what is
evaluated and saved) on real processes: this rank's :class:`~hopdec.hop.worker.Worker` core driven by
:func:`hopdec.runtime.hop_loop.worker_loop` over the :class:`~hopdec.transport.mpi.MPITransport`,
computing with a :class:`~hopdec.ml.trainer.LocalTrainer`, with checkpoints and stops
(:class:`hopdec.runtime.resume.HopRank`), healing (:class:`hopdec.runtime.heal.Healer`) and observers.
"""

import sys

from hopdec.ml import transfers
from hopdec.transport.waiting import PeerFailed


def mpi_buffers_on(cuda_aware, device):
    """The device for MPI buffers (no host staging), or None to stage through host memory.

    ``auto``: the model's CUDA device when the MPI says it is CUDA-aware; ``yes``: the model's device
    whatever it is (on CPU: torch tensors instead of numpy arrays, the same code path), refused for a GPU
    model when the MPI says it cannot take device memory (it would crash on the first send); ``no``: host.
    """
    from hopdec.transport.mpi import cuda_aware_mpi
    if cuda_aware == "yes":
        if device.type == "cuda" and cuda_aware_mpi() is False:
            from hopdec.errors import ConfigError
            raise ConfigError("--cuda-aware-mpi yes: this MPI says it cannot take CUDA device buffers "
                              "(MPIX_Query_cuda_support() is 0); use --cuda-aware-mpi auto or no to stage "
                              "through host memory, or an MPI built with CUDA")
        return device
    if cuda_aware == "auto" and device.type == "cuda" and cuda_aware_mpi():
        return device
    return None


def run(ctx):
    """Train on this rank until the run's last iteration; print the summary on rank 0. Collective.

    With ``--fault-tolerance`` (ULFM) a peer's failure during training, shutdown or the summary makes the
    survivors heal (:class:`hopdec.runtime.heal.Healer`) and go on; ``ctx.healed`` then lists the heals
    (the caller must not call MPI_Finalize afterwards: it would wait for the dead).
    """
    from hopdec.core import Wait
    from hopdec.modes.work import save_params
    from hopdec.observe import RunObserver
    from hopdec.runtime.backend import TorchBackend
    from hopdec.runtime.hop_loop import worker_loop
    from hopdec.runtime.metrics import RankLogger, log_path
    from hopdec.runtime.resume import HopRank, open_log
    from hopdec.runtime.summary import gather_summary
    from hopdec.transport.collectives import barrier
    from hopdec.transport.mpi import MPITransport
    from hopdec.transport.ulfm import fault_tolerant

    s, hop, rank = ctx.settings, ctx.run, ctx.rank
    ft = s.faults.fault_tolerance
    if ft:
        ctx.comm = fault_tolerant(ctx.comm)         # ranks stay the worker ids
    comm = ctx.comm
    ctx.worker = rank
    trainer = hop.trainer(rank, ctx.device)
    emulator = ctx.make_emulator(rank, ctx.size)
    core = hop.core(rank)
    if hop.cfg.compress != "none":                  # coded per-edge streams, on host buffers
        from hopdec.transport.coded_mpi import CodedMPITransport
        io = CodedMPITransport(comm, core.view, trainer.numel, core.slots, hop.cfg.compress,
                               peer_timeout=ctx.timeout, host_pinned=ctx.device.type == "cuda")
    else:
        io = MPITransport(comm, core.view, trainer.numel, core.slots, peer_timeout=ctx.timeout,
                          device_buffers=mpi_buffers_on(s.work.cuda_aware_mpi, ctx.device),
                          host_pinned=ctx.device.type == "cuda", fault_tolerant=ft)
    # Send straight from the parameters' own storage: host arrays on CPU, device tensors for a
    # CUDA-aware MPI; a GPU model without one is staged once each way through pinned host buffers.
    trainer.use_send_storage(io.message_floats(), on_device=io.device_buffers is not None)
    bound = hop.bound()
    keep = HopRank(ctx, core, trainer, bound)      # checkpoints, resume, Ctrl-C (hopdec.runtime.resume)
    header = hop.header(trainer.numel, emulator.describe(), bound, device=str(ctx.device),
                        mpi_buffers="device" if io.device_buffers is not None else "host",
                        message_bytes=hop.message_bytes(trainer.numel), consensus_every=s.observe.consensus_every,
                        fault_tolerance=ft, **keep.header())
    continues = open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, rank))
    logger = RankLogger(ctx.log_dir, rank, header=header, append=continues)
    obs = RunObserver(s.observe, comm, ctx.timeout, logger.event, "worker", range(ctx.size), hop.cfg.iterations,
                      header, bound=bound, write_params=trainer.write_params, numel=trainer.numel,
                      evaluate=lambda: hop.work.evaluator(trainer, rank, hop.n, ctx.device))
    keep.watched_by(obs, continues)
    if rank == 0:
        for note in hop.notes:
            print(f"hopdec train: note: {note}", file=sys.stderr, flush=True)

    def on_record(rec):
        logger.log(rec)
        obs.on_record(rec)

    backend = TorchBackend(trainer, emulator, faults=ctx.faults)
    healer = None
    if ft:
        from hopdec.runtime.heal import Healer
        healer = Healer(comm, hop.graph, core, io, ctx.timeout)

    def heal():
        event = healer.heal()
        ctx.comm = healer.comm
        keep.rehome(healer.comm)                    # a stop is agreed among the survivors from now on
        logger.event("heal", **{k: v for k, v in event.items() if k != "event"})
        obs.on_failure(event, healer.comm)
        ctx.healed = healer.events
        return event

    def drive(loop):
        for a in loop:
            if not isinstance(a, Wait):
                keep.after(a, logger)               # Enter(K): the periodic checkpoint; a stop request
                continue
            try:
                with keep.wakeable():               # a stop agreed meanwhile ends the wait
                    io.wait(core, a)
            except PeerFailed:
                if healer is None:
                    raise
                heal()

    barrier(comm, ctx.timeout, "start")            # start together: iteration times are comparable
    obs.begin()
    with keep.running():                            # every wait notices a stop request (Ctrl-C)
        drive(worker_loop(core, io, backend, on_record=on_record, spans=obs.spans, step=True))
        keep.finish(logger)                         # the final checkpoint
        obs.finished(core.iteration)
        ctx.faults.at("shutdown")
        while True:                                 # a failure at shutdown: heal, send what was lost, again
            try:
                io.close()
                break
            except PeerFailed:
                if healer is None:
                    raise
                heal()
                drive(worker_loop(core, io, backend, step=True))
    keep.close()
    obs.close()
    logger.event("messages", **io.counters(),      # what this rank sent (grants: carried or not)
                 send_stores=trainer.stores)        # and the stores its values lived in (zero-copy: a pool)
    transfers.log_to(logger, ctx.device, "device" if getattr(io, "device_buffers", None) is not None else "host")
    if keep.stopped:                                # Ctrl-C: no summary; rank 0 says how to resume
        logger.close()
        return keep.report_stop()
    if ctx.rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)
    if hop.saves(rank):
        save_params(ctx.log_dir, rank, trainer.write_params())
    c = core.counts()
    extra = dict(dropped=c["dropped"], used=c["used"], sends_skipped=c["sends_skipped"])
    if trainer.send_storage() is not None and hop.cfg.compress == "none":   # zero-copy: the pool's memory
        from hopdec.runtime.hop_loop import store_cap
        extra.update(send_stores=trainer.stores, store_bytes=trainer.store_bytes(), store_cap=store_cap(core))
    while True:                                     # a failure during the summary: heal, summarise again
        try:
            out = gather_summary(ctx, logger, trainer, emulator, hop.title(), bound=bound, extra=extra,
                                 model_label=hop.model_label, bound_label=hop.bound_label,
                                 notes=(hop.heal_notes(healer.events, healer.graph, bound) if healer else [])
                                 + hop.traffic_notes(io.counters(), logger.iterations, rank)
                                 + hop.round_notes(bound),
                                 mpi_buffers="device" if getattr(io, "device_buffers", None) is not None else "host",
                                 unit=hop.unit)
            break
        except Exception as err:
            if healer is None or not _is_failure(err, healer.comm):
                raise
            heal()
    if out is not None:                 # the reporting rank: the run's outcome goes into its log too
        logger.event("summary", test_acc=out["avg_acc"], test_loss=out["avg_loss"], max_gap=out["max_gap"],
                     model=hop.eval_model, each_test_acc={r["rank"]: r["test_acc"] for r in out["ranks"]})
    logger.close()
    return out


def _is_failure(err, comm=None):
    from hopdec.transport.mpi import is_peer_failure
    return is_peer_failure(err, comm)
