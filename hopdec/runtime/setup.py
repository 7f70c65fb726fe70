"""Everything a real run checks and loads on each rank before any training message is sent.

:func:`setup` takes the run's settings (:class:`hopdec.settings.RunSettings`, valid already) and this
rank's communicator, and makes the :class:`~hopdec.runtime.context.RunContext`: what this host and its
files say (checkpoint directory, log directory, observers' files, fault tolerance under the launcher),
the run assembly of its mode (:mod:`hopdec.modes`: the topology or the sync model, checked before torch
is even imported, so a bad command line fails in about a second on every rank), then the workload
(model, presets, data, iterations), the device and the threads. Raises HopdecError with one line; the
caller exchanges what the ranks found (:mod:`hopdec.cli.train`).
"""

import os
import re
import sys

from hopdec.errors import ConfigError

PROG = "hopdec train"


def setup(settings, comm):
    """The :class:`RunContext` of this rank (see the module docstring)."""
    from hopdec.observe.options import check_observe_options
    from hopdec.runtime.resume import with_checkpoint_defaults

    rank, size = comm.Get_rank(), comm.Get_size()
    settings = with_checkpoint_defaults(settings, rank)     # a resume may fill --iterations
    check_observe_options(settings.observe, rank)
    if settings.faults.fault_tolerance and size > 1 and "OMPI_COMM_WORLD_SIZE" in os.environ and \
            os.environ.get("OMPI_MCA_mpi_ft_enable") != "1":
        raise ConfigError("--fault-tolerance needs mpirun --with-ft ulfm (launch/local.sh "
                          "--fault-tolerance adds it and the failure detector)")
    run = _assemble(settings, rank, size)
    ctx = _load(settings, comm, run)
    ctx.faults.at("setup")
    return ctx


def _assemble(settings, rank, size):
    """The run assembly of this mode over ``size`` ranks (cheap: no torch, no data)."""
    from hopdec.heterogeneity import Emulator
    if settings.mode == "allreduce":
        from hopdec.modes.allreduce import AllReduceRun
        run = AllReduceRun(settings, size)
    elif settings.mode == "ps":
        from hopdec.modes.ps import PSRun, check_size
        check_size(size)
        for die in settings.faults.die_rank:
            if not 0 <= die < size:
                raise ConfigError(f"--die-rank {die}: no such rank (0..{size - 1})")
        run = PSRun(settings, size - 1)
    else:
        from hopdec.modes.decentralized import HopRun, resolve_topology
        graph = resolve_topology(settings.protocol.topology, size)
        n = graph.number_of_nodes()
        if n != size:
            raise ConfigError(f"{settings.protocol.topology or 'default topology'}: has {n} workers but the run "
                              f"has {size} ranks (mpirun -n {n})")
        run = HopRun(settings, graph)
    # the slowdowns after the run's own checks, as hopdec sim makes them: a command line with two problems
    # got a different line from train and sim (train named --slowdown, sim --backup-workers)
    em, workers = settings.emulation, run.workers
    Emulator(list(em.slowdown), workers[0], workers, compute_time=em.compute_time, seed=settings.work.seed)
    if run.mode == "decentralized" and rank == 0:   # the topology file's notes, as sim and topo analyze print them
        for note in run.warnings:
            print(f"{PROG}: warning: {note}", file=sys.stderr, flush=True)
    return run


def _load(settings, comm, run):
    """The workload (model, data, iterations), the device and threads: the run's context on this rank."""
    import torch

    from hopdec.modes.fingerprint import fingerprint
    from hopdec.modes.work import resolve
    from hopdec.launcher import local_rank_and_size
    from hopdec.runtime.context import RunContext, pick_device, use_device

    run = run.with_work(resolve(settings.work, len(run.workers), trains=True))
    if settings.observe.log_dir:
        from hopdec.runtime.metrics import check_log_dir
        ob = settings.observe
        check_fresh_log_dir(ob.log_dir, comm.Get_rank(), comm.Get_size(), ob.overwrite,
                            resume_dir=settings.checkpoints.resume)
        check_log_dir(ob.log_dir, comm.Get_rank())
    local_rank, local_size = local_rank_and_size()
    device = pick_device(settings.work.device, local_rank)
    use_device(device)
    torch.set_num_threads(settings.work.threads or max(1, (os.cpu_count() or 1) // max(local_size, 1)))
    if run.mode == "decentralized":
        from hopdec.runtime.buffers import check_buffers
        check_buffers(run.cfg, run.views, run.work.numel(), local_size)
    return RunContext(settings=settings, comm=comm, run=run, device=device, fingerprint=fingerprint(run))


def shared_by_every_rank(ctx):
    """What every rank must agree on before a training message is sent (JSON-ready): its model's trainable
    parameters (:func:`~hopdec.ml.models.tensor_layout`) and what the run computes (its fingerprint: the
    topology's hash, the dataset's size and shape, the settings) and the data itself
    (:func:`~hopdec.modes.fingerprint.samples_digest`), read by each rank from its own files."""
    from hopdec.modes.fingerprint import samples_digest
    return {**ctx.fingerprint, "parameters": ctx.run.work.layout(), "iterations": ctx.run.work.iterations,
            "samples_sha256": samples_digest(ctx.run.work.dataset)}


def first_disagreement(shared):
    """``(rank, one line)`` for the lowest rank whose :func:`shared_by_every_rank` differs from rank 0's;
    None when all agree. Without it a rank whose model was built differently (a factory that depends on
    the rank) sent messages of another length and the job ended on ``MPI_ERR_IN_STATUS``; one whose
    topology or data file differed on its host ran another graph or shard and hung or silently diverged."""
    from hopdec.ml.models import layout_difference
    from hopdec.transport.collectives import first_difference
    found = first_difference(shared)
    if found is None:
        return None
    r, key = found
    mine, ref = shared[r], shared[0]
    if mine.get("parameters") != ref.get("parameters"):
        return r, layout_difference(r, mine["parameters"], ref["parameters"])
    name = {"topology": "the topology (its graph's sha256)",
            "samples_sha256": "the dataset's contents (a sha256 of its samples)"}.get(key, key)
    return r, (f"rank {r} and rank 0 would run different settings: {name} is {mine.get(key)!r} on rank {r}, "
               f"{ref.get(key)!r} on rank 0; every rank must read the same files (a topology or data file "
               f"that differs between hosts?)")


LOG_FILES = re.compile(r"(rank|params_rank)(\d+)\.(jsonl|npy)|eval\.jsonl")
"""What a run writes into its --log-dir (``rank{r}.jsonl``, ``params_rank{r}.npy``, ``eval.jsonl``)."""


def check_fresh_log_dir(log_dir, rank, size, overwrite=False, resume_dir=None):
    """A ``--log-dir`` must not hold another run's logs: their rank files would be overwritten, or (a run
    with more ranks) merged with this run's by ``hopdec report``. ``--overwrite`` replaces them (rank 0
    removes what this run may not rewrite: the logs of ranks >= ``size``, saved models, ``eval.jsonl``); a
    run resumed from ``resume_dir`` (``--resume``) continues its own logs, in the folder its checkpoints'
    manifest names (resumed into any other folder holding logs, it wrote over them without --overwrite and
    left the rest of that run's rank files beside its own). ConfigError naming the option otherwise."""
    if not os.path.isdir(log_dir) or _continues_logs_in(resume_dir, rank, log_dir):
        return
    try:
        names = os.listdir(log_dir)
    except OSError as err:
        raise ConfigError(f"--log-dir {log_dir}: cannot list it ({err.strerror or err})") from None
    found = []
    for name in names:
        m = LOG_FILES.fullmatch(name)
        path = os.path.join(log_dir, name)
        try:
            if m is None or not os.path.isfile(path) or os.path.getsize(path) == 0:
                continue                    # (another rank of this run may have created its empty file)
        except FileNotFoundError:
            continue                        # ... and removed it again (check_log_dir) after the listing
        found.append((name, m))
    if not found:
        return
    if not overwrite:
        if rank == 0 or any(m.group(2) == str(rank) for _, m in found):
            shown = ", ".join(sorted(n for n, _ in found)[:3]) + (", ..." if len(found) > 3 else "")
            raise ConfigError(f"--log-dir {log_dir}: holds the logs of an earlier run ({shown}); give a new "
                              f"directory, or --overwrite to replace them")
        return
    if rank == 0:
        for name, m in found:
            if m.group(2) is None or m.group(1) == "params_rank" or int(m.group(2)) >= size:
                try:
                    os.unlink(os.path.join(log_dir, name))
                except OSError as err:
                    raise ConfigError(f"--log-dir {log_dir}: --overwrite cannot remove {name} "
                                      f"({err.strerror or err})") from None


def _continues_logs_in(resume_dir, rank, log_dir):
    """Whether the checkpoints in ``resume_dir`` (None: not a resume) recorded this rank's log in ``log_dir``:
    a resume there continues that run's own logs."""
    if resume_dir is None:
        return False
    from hopdec.runtime import checkpoint as C
    man = C.read_manifest(resume_dir, rank)
    logs = [e.get("log") for e in (man or {}).get("complete", {}).values()]
    here = os.path.realpath(log_dir)
    return any(isinstance(p, str) and os.path.realpath(os.path.dirname(p)) == here for p in logs)


def check_resume_target(ctx):
    """A resumed run must have something left to do (with ``--local-steps``: inner steps; a checkpoint
    that ends a short last round has fewer than its rounds of H, see :func:`continue_run`)."""
    from hopdec.ps.server import work_budget
    res, run = ctx.resume, ctx.run
    asked = ctx.iterations
    if run.mode == "ps":
        done = res["info"]["work"].get(str(res["key"]))
        left = done is None or done < work_budget(ctx.iterations, run.n)
        what = f"{done} mini-batches ({ctx.iterations} iterations per worker)"
    else:
        key, cfg = res["key"], getattr(run, "cfg", None)
        left = key < ctx.iterations
        what = f"iteration {key}"
        if getattr(cfg, "rounds", False):       # --local-steps: the core's iterations are rounds
            h = cfg.local_steps
            done = checkpoint_inner_steps(res, h)
            left = done < run.work.iterations
            what = f"round {key} ({done} inner steps)"
            # (its rounds of H, unless an earlier round was short: then they do not add up to it)
            asked = f"{run.work.iterations}" + (f" ({ctx.iterations} rounds of --local-steps {h})"
                                                if done == key * h else "")
    if not left:
        raise ConfigError(f"--resume {res['dir']}: the checkpoint is at {what}, which is --iterations "
                          f"{asked} already; raise --iterations to train longer")


def checkpoint_inner_steps(res, local_steps):
    """The inner steps a ``--local-steps`` run had taken at the checkpoint ``res`` resumes (its ``work``;
    one written without it: its rounds of H)."""
    done = (res["info"].get("work") or {}).get(str(res["key"]))
    return res["key"] * local_steps if done is None else int(done)


def continue_run(ctx):
    """After :func:`check_resume_target`: the run as it goes on from the checkpoint ``ctx.resume``. With
    ``--local-steps`` its rounds go on from the inner step the checkpoint ends at
    (:meth:`hopdec.modes.decentralized.HopRun.continued_from`): a run of 10 inner steps in rounds of 4 ended
    with a round of 2 whose exchange and outer step were taken, so resumed to 24 its rounds are 10-13,
    14-17, 18-21, 22-23 -- every inner step once, as the summary, logs and checkpoints count them."""
    run, cfg = ctx.run, getattr(ctx.run, "cfg", None)
    if ctx.resume is not None and getattr(cfg, "rounds", False):
        ctx.run = run.continued_from(ctx.resume["key"], checkpoint_inner_steps(ctx.resume, cfg.local_steps))
    return ctx
