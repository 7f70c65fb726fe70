"""Decentralized training over MPI (the Hop engine): one worker per rank, parameters only to neighbours.

Puts together the pieces: topology -> :func:`hopdec.hop.worker.node_views` -> one protocol
:class:`~hopdec.hop.worker.Worker` per rank, driven by :func:`hopdec.runtime.hop_loop.worker_loop` over the
:class:`~hopdec.transport.mpi.MPITransport`, computing with a :class:`~hopdec.ml.trainer.LocalTrainer`.
"""

import sys

from hopdec.hop.config import (ProtocolConfig, check_config, describe, gap_bound, parse_skip,
                               setting_name)
from hopdec.hop.worker import Worker, node_views
from hopdec.transport.waiting import PeerFailed


def prepare(args, graph, iterations):
    """Validate everything that can be validated before any message is sent. Raises ConfigError."""
    max_jump, trigger = parse_skip(args.skip)
    from hopdec.transport.codec import check_options as check_compress          # gossip: --compress
    spec = check_compress(args)
    cfg = ProtocolConfig(iterations=iterations, protocol=args.protocol, max_ig=args.max_ig,
                         compute_graph=args.compute_graph, backup_workers=args.backup_workers or 0,
                         staleness=args.staleness, stale_reduce=args.stale_reduce,
                         skip_max_jump=max_jump, skip_trigger=trigger,
                         checkpoint_every=getattr(args, "checkpoint_every", None) or 0,
                         compress=str(spec), consensus_step=spec.gamma)
    views = node_views(graph)
    check_config(cfg, views)
    from hopdec.hop.time_varying import check_options as check_time_varying     # gossip: schedules
    check_time_varying(args, graph)
    return cfg, views


def mpi_buffers_on(cuda_aware, device):
    """The device for MPI buffers (no host staging), or None to stage through host memory.

    ``auto``: the model's CUDA device when the MPI says it is CUDA-aware; ``yes``: the model's device
    whatever it is (on CPU: torch tensors instead of numpy arrays, the same code path); ``no``: host.
    """
    from hopdec.transport.mpi import cuda_aware_mpi
    if cuda_aware == "yes" or (cuda_aware == "auto" and device.type == "cuda" and cuda_aware_mpi()):
        return device
    return None


def run(ctx, graph, cfg, views):
    """Train on this rank until ``cfg.iterations``; print the summary on rank 0. Collective.

    With ``--fault-tolerance`` (ULFM) a peer's failure during training, shutdown or the summary makes the
    survivors heal (:class:`hopdec.runtime.heal.Healer`) and go on; ``ctx.extra["healed"]`` then lists
    the heals (the caller must not call MPI_Finalize afterwards: it would wait for the dead).
    """
    from hopdec.core import Wait
    from hopdec.observe import RunObserver
    from hopdec.runtime.backend import TorchBackend
    from hopdec.runtime.hop_loop import worker_loop
    from hopdec.runtime.metrics import RankLogger, log_path
    from hopdec.runtime.report import report
    from hopdec.runtime.resume import HopRank, open_log
    from hopdec.hop.time_varying import describe as describe_schedule
    from hopdec.transport.codec import message_bytes
    from hopdec.transport.collectives import barrier
    from hopdec.transport.mpi import MPITransport

    args, rank = ctx.args, ctx.rank
    ft = bool(getattr(args, "fault_tolerance", False))
    if ft:
        from mpi4py import MPI
        ctx.comm = ctx.comm.Dup()                   # errors return (ULFM); ranks stay the worker ids
        ctx.comm.Set_errhandler(MPI.ERRORS_RETURN)
    comm = ctx.comm
    ctx.extra["worker"] = rank
    trainer = ctx.make_trainer(rank, ctx.size)
    emulator = ctx.make_emulator(rank, ctx.size)
    core = Worker(views[rank], cfg)
    if cfg.compress != "none":                      # gossip: coded per-edge streams, host buffers
        from hopdec.transport.coded_mpi import CodedMPITransport
        io = CodedMPITransport(comm, views[rank], trainer.numel, core.slots, cfg.compress,
                               peer_timeout=ctx.timeout, host_pinned=ctx.device.type == "cuda")
    else:
        io = MPITransport(comm, views[rank], trainer.numel, core.slots, peer_timeout=ctx.timeout,
                          device_buffers=mpi_buffers_on(args.cuda_aware_mpi, ctx.device),
                          host_pinned=ctx.device.type == "cuda", fault_tolerant=ft)
    # Send straight from the parameters' own storage: host arrays on CPU, device tensors for a
    # CUDA-aware MPI; a GPU model without one is staged once each way through pinned host buffers.
    trainer.use_send_storage(io.message_floats(), on_device=io.device_buffers is not None)
    bound = gap_bound(graph, cfg)
    keep = HopRank(ctx, core, trainer, bound)      # checkpoints, resume, Ctrl-C (hopdec.runtime.resume)
    header = dict(mode="decentralized", topology=graph.graph.get("source"), protocol=cfg.protocol,
                  setting=setting_name(cfg, graph), max_ig=cfg.max_ig, staleness=cfg.staleness,
                  backup_workers=cfg.backup_workers, skip=args.skip, compute_graph=cfg.compute_graph,
                  iterations=cfg.iterations, model=ctx.model_name, params=trainer.numel,
                  hparams=ctx.hparams, device=str(ctx.device), emulation=emulator.describe(),
                  mpi_buffers="device" if io.device_buffers is not None else "host",
                  gap_bound=bound, seed=args.seed, message_bytes=message_bytes(cfg.compress, trainer.numel),
                  compress=cfg.compress, consensus_step=cfg.consensus_step, schedule=describe_schedule(graph),
                  consensus_every=getattr(args, "consensus_every", None), fault_tolerance=ft,
                  **keep.header())
    logger = RankLogger(ctx.log_dir, rank, header=header,
                        append=open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, rank)))
    obs = RunObserver(ctx, logger.event, "worker", range(ctx.size), cfg.iterations, header, bound=bound,
                      write_params=trainer.write_params, numel=trainer.numel,
                      evaluate=lambda: ctx.make_trainer(rank, ctx.size).evaluate)
    if rank == 0 and cfg.skip_max_jump > cfg.max_ig:
        print(f"note: --skip max-jump={cfg.skip_max_jump} > --max-ig {cfg.max_ig}: a jump never passes the "
              f"slowest out-neighbour, which tokens keep within max_ig of it when it also sends to this "
              f"worker, so jumps are at most {cfg.max_ig} on symmetric graphs", file=sys.stderr, flush=True)

    def on_record(rec):
        logger.log(rec)
        obs.on_record(rec)

    backend = TorchBackend(trainer, emulator, faults=ctx.faults)
    healer = None
    if ft:
        from hopdec.runtime.heal import Healer
        healer = Healer(comm, graph, core, io, ctx.timeout)

    def heal():
        event = healer.heal()
        ctx.comm = healer.comm
        keep.rehome(healer.comm)                    # a stop is agreed among the survivors from now on
        logger.event("heal", **{k: v for k, v in event.items() if k != "event"})
        obs.on_failure(event)
        ctx.extra["healed"] = healer.events
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
    logger.event("messages", **io.counters())      # what this rank sent (grants: carried or not)
    if keep.stopped:                                # Ctrl-C: no summary; rank 0 says how to resume
        logger.close()
        return keep.report_stop()
    if ctx.rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)
    if args.save_models and ctx.log_dir:
        import numpy as np
        np.save(f"{ctx.log_dir}/params_rank{rank}.npy", trainer.write_params())
    title = (f"decentralized {describe(cfg, graph)} on {graph.graph.get('source')} "
             f"({graph.number_of_nodes()} workers, protocol {cfg.protocol}, max_ig {cfg.max_ig})")
    extra = dict(dropped=core.policy.dropped, used=core.policy.used, sends_skipped=core.sends_skipped)
    while True:                                     # a failure during the summary: heal, summarise again
        try:
            out = report(ctx, logger, trainer, emulator, title, bound=bound, extra=extra,
                         notes=heal_notes(healer, bound, cfg, graph) + traffic_notes(io, logger, cfg))
            break
        except Exception as err:
            if healer is None or not _is_failure(err, healer.comm):
                raise
            heal()
    if out is not None:                 # the reporting rank: the run's outcome goes into its log too
        logger.event("summary", test_acc=out["avg_acc"], test_loss=out["avg_loss"], max_gap=out["max_gap"],
                     model="average of every worker's parameters",
                     each_test_acc={r["rank"]: r["test_acc"] for r in out["ranks"]})
    logger.close()
    return out


def heal_notes(healer, bound, cfg, graph):
    """The summary's lines about failures: who failed, when, the healed graph, what it cost."""
    if healer is None or not healer.events:
        return []
    lines = []
    for e in healer.events:
        lines.append(f"failure: rank(s) {', '.join(map(str, e['failed']))} died near iteration {e['iteration']}; "
                     f"{len(e['survivors'])} survivors healed the graph in {e['stall_s']:.3f} s "
                     f"(spectral gap now {e['spectral_gap']})")
    from hopdec.topology.heal import relabelled
    healed_bound = gap_bound(relabelled(healer.graph), cfg)
    lines.append(f"after the failures the gap bound is {healed_bound:g} on the healed graph "
                 f"({healer.graph.number_of_nodes()} workers; it was {bound:g})")
    return lines


def traffic_notes(io, logger, cfg):
    """The summary's line on what this rank's updates put on the wire (gossip: --compress)."""
    c = io.counters()
    its = max(logger.iterations, 1)
    line = (f"traffic: rank {io.rank} sent {c['bytes'] / its:,.0f} bytes of updates per iteration "
            f"({c['updates']} messages, {c['bytes']:,} bytes in all")
    if cfg.compress != "none":
        line += f"; --compress {cfg.compress}, of which {c['key_messages']} full-size keys"
    return [line + ")"]


def _is_failure(err, comm=None):
    from hopdec.transport.mpi import is_peer_failure
    return is_peer_failure(err, comm)
