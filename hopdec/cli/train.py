"""``hopdec train``: one worker per MPI rank (``mpirun -n 8 hopdec train --topology FILE``).

Every rank parses and checks the whole configuration (topology size against the number of ranks, model,
data, log directory, protocol settings) *before* any training message is sent; the ranks then exchange
what they found (a bounded allgather) and a problem is printed once, by the lowest rank that found it,
and every rank exits 2. Anything that goes wrong later ends every rank with one line naming the rank and
the cause (:mod:`hopdec.runtime.failures`). ``--mode ps`` (implied by ``--sync``) hands the run to
:func:`hopdec.ps.mpi.run` (its options come from :mod:`hopdec.ps.options`).
"""

import argparse
import os
import sys
import time

from hopdec.errors import ConfigError, HopdecError

PROG = "hopdec train"


def launcher_rank():
    """This process's rank as the MPI launcher set it (Open MPI, MPICH/PMI, PMIx, Slurm), else 0."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def under_launcher():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "SLURM_NTASKS"))


class _Parser(argparse.ArgumentParser):
    """argparse that says a bad option in one line (ConfigError), and prints --help on rank 0 only."""

    def error(self, message):
        raise ConfigError(f"{message} (see {self.prog} --help)")

    def print_help(self, file=None):
        if launcher_rank() == 0:
            super().print_help(file)


def build_parser():
    from hopdec.cli.helpfmt import HelpFormatter
    p = _Parser(prog=PROG, description="Train one worker per MPI rank: mpirun -n 8 hopdec train --topology "
                "FILE (add --oversubscribe with fewer cores than ranks, --allow-run-as-root as root).",
                formatter_class=HelpFormatter)
    add_run_arguments(p)
    return p


def add_run_arguments(p, mpi=True):
    """The options of a run, shared by ``hopdec train`` and ``hopdec sim``; returns the argument groups
    by name. ``mpi=False`` leaves out what only a real run has: the device and CUDA-aware MPI, the peer
    timeout, fault tolerance and injection, the observers that talk between ranks, and ``--compute-time``
    (the simulator's takes distributions)."""
    p.add_argument("--mode", choices=["decentralized", "ps"], default=None,
                   help="decentralized (Hop) or a central parameter server on rank 0 (--sync implies ps; "
                        "default: decentralized)")
    g = p.add_argument_group("topology and protocol (decentralized mode)")
    g.add_argument("--topology", metavar="FILE|KIND",
                   help="topology file (node-link JSON or edge list), or a generator kind "
                   "(ring, ring-based, double-ring, exponential, torus, complete, ...) built over all "
                   "ranks; default: ring-based")
    g.add_argument("--protocol", choices=["tokens", "queue-only", "notify-ack"], default="tokens",
                   help="how workers bound their gap: token queues (Hop sec. 4.2, with --max-ig), update "
                        "queues only (sec. 4.1), or notify-ack (sec. 3.3)")
    g.add_argument("--max-ig", type=int, default=2, metavar="K",
                   help="largest iteration gap between neighbours (token queues)")
    g.add_argument("--compute-graph", choices=["parallel", "serial"], default="parallel",
                   help="send the parameters before computing the gradient (parallel) or after applying "
                        "it (serial), Hop sec. 3.2")
    g.add_argument("--backup-workers", type=int, default=None, metavar="B",
                   help="decentralized: updates each worker may go without (default 0); --sync backup: "
                        "backup workers b, N = workers - b gradients per step (default 1)")
    g.add_argument("--staleness", type=int, default=None, metavar="S",
                   help="bounded staleness: use updates up to S iterations old (Hop sec. 4.4; --sync ssp: "
                        "the gap bound, default 3); default: off")
    g.add_argument("--stale-reduce", choices=["weighted", "plain"], default="weighted",
                   help="reduce stale updates with eq. (2) weights or a plain average")
    g.add_argument("--skip", default=None, metavar="max-jump=J,trigger=G",
                   help="iteration skipping for stragglers (Hop sec. 5); default: off")
    d = p.add_argument_group("model and data")
    d.add_argument("--dataset", choices=["digits", "cifar10", "libsvm"], default="digits",
                   help="digits ships with scikit-learn (no download)")
    d.add_argument("--data-dir", metavar="DIR", help="cifar10: folder with the python batches")
    d.add_argument("--data-path", metavar="FILE", help="libsvm: training file")
    d.add_argument("--test-path", metavar="FILE", help="libsvm: test file (default: 20%% held out)")
    d.add_argument("--model", choices=["cnn", "vgg11", "svm", "mlp"], default=None,
                   help="default: cnn for digits, vgg11 for cifar10, svm for libsvm")
    d.add_argument("--norm", choices=["batch", "running", "group", "none"], default="batch",
                   help="vgg11 normalisation (batch: batch statistics only, no buffers to keep apart)")
    d.add_argument("--partition", choices=["iid", "noniid"], default="iid",
                   help="how the training set is split over the workers: iid (random shards) or noniid "
                        "(sorted by label, each worker sees few classes)")
    d.add_argument("--lr", type=float, default=None, help="learning rate (default: the model's preset)")
    d.add_argument("--momentum", type=float, default=None,
                   help="SGD momentum in [0, 1) (default: the model's preset)")
    d.add_argument("--weight-decay", type=float, default=None,
                   help="L2 weight decay (default: the model's preset)")
    d.add_argument("--batch-size", type=int, default=None,
                   help="mini-batch size per worker (default: the model's preset)")
    d.add_argument("--iterations", type=int, default=None, metavar="K",
                   help="iterations per worker (default 200)")
    d.add_argument("--epochs", type=float, default=None, metavar="E",
                   help="instead of --iterations: passes over each worker's shard")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the model's initial weights, the data order and the emulated slowdowns")
    if mpi:
        d.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:N, or auto: cuda:(local rank mod #GPUs) if CUDA, else cpu")
        d.add_argument("--cuda-aware-mpi", choices=["auto", "yes", "no"], default="auto",
                       help="hand device buffers to MPI (no host staging): auto when the MPI says it is "
                       "CUDA-aware and the model is on a GPU")
    h = p.add_argument_group("emulated heterogeneity (Hop sec. 7.3)")
    if mpi:
        h.add_argument("--compute-time", type=float, default=None, metavar="SECONDS",
                       help="pad each iteration's compute to this many seconds (default: as measured)")
    h.add_argument("--slowdown", action="append", default=None, metavar="SPEC",
                   help="random:factor=6,prob=1/n or rank=3,factor=4 (repeatable); default: none")
    o = p.add_argument_group("output")
    o.add_argument("--log-dir", metavar="DIR", help="write DIR/rank{r}.jsonl, one JSON object per iteration "
                   "(hopdec report DIR makes a page of it)")
    o.add_argument("--save-models", action="store_true", help="save each rank's final flat parameters "
                   "as DIR/params_rank{r}.npy (needs --log-dir)")
    o.add_argument("--no-progress", action="store_true",
                   help="no live progress (by default rank 0 prints a progress line every few seconds "
                        "under mpirun, or draws a bar on a terminal)")
    o.add_argument("--progress-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress lines (default 3)")
    if mpi:
        o.add_argument("--consensus-every", type=int, default=None, metavar="K",
                       help="decentralized: measure the consensus distance ||x_i - mean x|| every K iterations "
                            "and at the end, without stalling training (nonblocking reductions); logged by "
                            "rank 0 (default: off)")
        o.add_argument("--tensorboard", default=None, metavar="DIR",
                       help="also write TensorBoard scalars, DIR/rank{r} per rank (needs the tensorboard "
                            "package: pip install 'hopdec[tensorboard]')")
        o.add_argument("--trace", default=None, metavar="FILE",
                       help="write a timeline of every rank (compute, send, waits and for whom, reduce, "
                            "jumps) as Chrome/Perfetto trace JSON; open it in ui.perfetto.dev")
    o.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads per rank (default: cores / ranks on this host, at least 1)")
    if mpi:
        o.add_argument("--fault-tolerance", action="store_true",
                       help="survive dead workers: the survivors heal the graph and go on (needs mpirun "
                            "--with-ft ulfm: launch/local.sh --fault-tolerance adds what it needs)")
        o.add_argument("--peer-timeout", type=float, default=120.0, metavar="SECONDS",
                       help="seconds a worker waits for a neighbour before giving up on the run")
        c = p.add_argument_group("checkpoints (D must be at the same path for every rank: a shared "
                                 "filesystem, or each host's disk when the ranks restart where they ran)")
        c.add_argument("--checkpoint-dir", metavar="D", default=None,
                       help="write each rank's state to D/rank{r}/ (atomically) at the end, at a stop "
                            "(Ctrl-C), and every --checkpoint-every iterations")
        c.add_argument("--checkpoint-every", type=int, metavar="K", default=None,
                       help="iterations per worker between checkpoints; without it, only at the end or a stop")
        c.add_argument("--resume", metavar="D", default=None,
                       help="continue from the latest checkpoint in D that every rank has (same ranks and "
                            "settings; --iterations may be raised) and go on checkpointing there")
        p.add_argument("--die-rank", default=None, help=argparse.SUPPRESS)   # fault injection: R or R1,R2
        p.add_argument("--die-at", default=None, help=argparse.SUPPRESS)
        p.add_argument("--die-how", choices=["exit", "hang", "raise"], default="exit", help=argparse.SUPPRESS)
        p.add_argument("--die-phase", default="train",
                       help=argparse.SUPPRESS)
    from hopdec.ps.options import add_arguments
    add_arguments(p)
    return dict(topology=g, data=d, heterogeneity=h, output=o)


def resolve_topology(spec, size):
    """A topology file, or a generator kind of ``hopdec topo generate`` built over all ranks."""
    from hopdec import topology as T
    if spec is None:
        return T.default_topology(size)
    if not os.path.exists(spec) and spec in T.GENERATORS:
        try:
            g = T.GENERATORS[spec](size)
        except ValueError as err:
            raise ConfigError(f"--topology {spec}: {err}") from None
        g.graph["source"] = f"{spec}({size})"
        return g
    return T.load(spec)


def setup(args, comm):
    """Everything checked and loaded before training; raises HopdecError with one line.

    The cheap checks (options, topology, protocol, slowdowns) come first, before torch is even
    imported, so a bad command line fails in about a second on every rank.
    """
    from hopdec.cli.options import check_numbers
    from hopdec.runtime.heterogeneity import Emulator

    resolve_mode(args)
    check_numbers(args)                             # every number finite and in range, first
    from hopdec.runtime.resume import check_options
    check_options(args, comm.Get_rank())            # --checkpoint-dir, --resume (may fill --iterations)
    size = comm.Get_size()
    if args.save_models and not args.log_dir:
        raise ConfigError("--save-models needs --log-dir")
    from hopdec.observe.options import check_observe_options
    check_observe_options(args, comm.Get_rank())
    n_workers = size - 1 if args.mode == "ps" else size
    policy = None
    if args.mode == "ps":
        from hopdec.ps.options import check_args
        policy = check_args(args, size)         # cheap: options and ranks only
    if args.fault_tolerance:
        if args.mode == "decentralized" and args.protocol != "tokens":
            raise ConfigError(f"--fault-tolerance needs --protocol tokens (healing re-establishes the "
                              f"token queues), got --protocol {args.protocol}")
        if size > 1 and "OMPI_COMM_WORLD_SIZE" in os.environ and \
                os.environ.get("OMPI_MCA_mpi_ft_enable") != "1":
            raise ConfigError("--fault-tolerance needs mpirun --with-ft ulfm (launch/local.sh "
                              "--fault-tolerance adds it and the failure detector)")
    workers = policy.workers if policy is not None else range(size)
    Emulator(args.slowdown or [], workers[0], workers, compute_time=args.compute_time, seed=args.seed)
    graph = None
    if args.mode == "decentralized":
        from hopdec.runtime.decentralized import prepare
        graph = resolve_topology(args.topology, size)
        if comm.Get_rank() == 0:                    # the same notes as hopdec topo analyze prints
            for note in graph.graph.get("notes", []):
                print(f"hopdec train: warning: {note}", file=sys.stderr, flush=True)
        n = graph.number_of_nodes()
        if n != size:
            raise ConfigError(f"{args.topology or 'default topology'}: has {n} workers but the run has "
                              f"{size} ranks (mpirun -n {n})")
        prepare(args, graph, args.iterations or 1)

    import torch

    from hopdec.ml.data import load_dataset, steps_per_epoch
    from hopdec.ml.models import PRESETS, default_model_for
    from hopdec.runtime.context import RunContext, local_rank_and_size, pick_device

    model = args.model or default_model_for(args.dataset)
    preset = dict(PRESETS[model])
    for key in ("lr", "momentum", "weight_decay", "batch_size"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    dataset = load_dataset(args.dataset, data_dir=args.data_dir, path=args.data_path,
                           test_path=args.test_path, seed=args.seed)
    shard = len(dataset.train_y) // n_workers
    if shard < 1:
        raise ConfigError(f"--dataset {args.dataset}: {len(dataset.train_y)} training samples cannot give "
                          f"each of the {n_workers} workers a shard (at least one sample each)")
    if args.iterations is None and args.epochs is not None:
        iterations = max(1, int(round(args.epochs * steps_per_epoch(shard, preset["batch_size"]))))
    else:
        iterations = args.iterations or 200
    if args.log_dir:
        from hopdec.runtime.metrics import check_log_dir
        check_log_dir(args.log_dir, comm.Get_rank())
    local_rank, local_size = local_rank_and_size()
    device = pick_device(args.device, local_rank)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // max(local_size, 1)))
    ctx = RunContext(args=args, comm=comm, dataset=dataset, model_name=model, hparams=preset,
                     iterations=iterations, device=device, log_dir=args.log_dir,
                     progress=not args.no_progress)
    from hopdec.runtime.checkpoint import run_settings
    if graph is not None:
        cfg, views = prepare(args, graph, iterations)
        from hopdec.cli.options import check_buffers
        from hopdec.ml.models import parameter_count
        check_buffers(cfg, views, parameter_count(model, dataset.input_shape, dataset.num_classes,
                                                  getattr(args, "norm", "batch")), local_size)
        ctx.extra.update(graph=graph, cfg=cfg, views=views, settings=run_settings(ctx, graph=graph, cfg=cfg))
    else:
        ctx.extra.update(ps_policy=policy, settings=run_settings(ctx, policy=policy))
    ctx.faults.at("setup")
    return ctx


def resolve_mode(args):
    """``--sync`` implies ``--mode ps``; with ``--mode decentralized`` it is an error, not ignored. Idempotent
    (``--mode ps`` without ``--sync`` runs bsp, see :func:`hopdec.ps.options.policy_from`)."""
    if args.mode is None:
        args.mode = "ps" if args.sync is not None else "decentralized"
    elif args.mode == "decentralized" and args.sync is not None:
        raise ConfigError(f"--sync {args.sync} is a parameter-server option: use it with --mode ps "
                          f"(or drop --mode, --sync implies it)")
    return args


def check_resume_target(ctx):
    """A resumed run must have something left to do."""
    res = ctx.extra["resume"]
    if ctx.args.mode == "ps":
        done = res["info"]["work"].get(str(res["key"]))
        budget = ctx.iterations * (ctx.size - 1)
        left = done is None or done < budget
        what = f"{done} mini-batches ({ctx.iterations} iterations per worker)"
    else:
        left = res["key"] < ctx.iterations
        what = f"iteration {res['key']}"
    if not left:
        raise ConfigError(f"--resume {res['dir']}: the checkpoint is at {what}, which is --iterations "
                          f"{ctx.iterations} already; raise --iterations to train longer")


def peer_timeout(args):
    """The seconds every wait may last (a sane value even before --peer-timeout is checked)."""
    t = getattr(args, "peer_timeout", None)
    return t if isinstance(t, (int, float)) and 0 < t < float("inf") else 120.0


def main(argv):
    """Parse, set up on every rank, exchange setup errors (printed once), then run under a guard that
    turns any failure on any rank into one line and an abort of the whole job."""
    ft = "--fault-tolerance" in argv
    from hopdec.runtime import interrupt
    interrupt.install()                     # Ctrl-C / SIGTERM / SIGUSR1: a clean stop, never a traceback
    try:
        args = resolve_mode(build_parser().parse_args(argv))
    except ConfigError as err:              # every rank parses the same argv: say it once
        if launcher_rank() == 0:
            print(f"{PROG}: error: {err}", file=sys.stderr, flush=True)
        return _finish(2, ft)
    args.argv = list(argv)                  # for the resume command a stopped run prints
    from hopdec.runtime.failures import abort, cause, first_error
    from hopdec.runtime.resume import plan
    from hopdec.runtime.startup import setup_done, start
    from hopdec.transport.collectives import allgather_json

    comm = start(args, PROG)                # MPI_Init and a roll call, each bounded: one line names who is missing
    rank = comm.Get_rank()
    err = None
    try:
        ctx = setup(args, comm)
    except Exception as e:                  # bad input (one line), or a bug: still one line
        err = cause(e)
    try:
        setup_done(comm, peer_timeout(args))   # one line names a rank still in setup
        found = first_error(allgather_json(comm, err, peer_timeout(args), "setup"))
    except Exception as e:
        abort(comm, e, PROG)
    if found is None and args.resume is not None:  # which checkpoint: the ranks compare their manifests
        try:
            ctx.extra["resume"] = plan(ctx, ctx.extra["settings"], peer_timeout(args))
            check_resume_target(ctx)
        except HopdecError as e:            # the same on every rank: printed once, below
            found = (0, cause(e))
        except Exception as e:
            abort(comm, e, PROG)
    if found is not None:
        if rank == found[0]:
            print(f"{PROG}: error: {found[1]}", file=sys.stderr, flush=True)
        if ft:                              # the reporter's abort must not cut the exchange short elsewhere
            try:
                from hopdec.transport.collectives import barrier
                barrier(comm, peer_timeout(args), "setup")
            except Exception:
                pass
        return _finish(2, ft, reporter=rank == found[0])
    if args.mode == "decentralized" and comm.Get_size() == 1 and not under_launcher():
        print(f"{PROG}: note: running 1 worker; start N workers with `mpirun -n N hopdec train ...` "
              f"or `launch/local.sh -n N ...`", file=sys.stderr, flush=True)
    try:
        if args.mode == "ps":
            from hopdec.ps.mpi import run
            run(ctx)
        else:
            from hopdec.runtime.decentralized import run
            run(ctx, ctx.extra["graph"], ctx.extra["cfg"], ctx.extra["views"])
    except BaseException as e:              # training, evaluation or shutdown, on any rank
        abort(comm, e, PROG)
    from hopdec.runtime.failures import stop_exit_code
    return _finish(stop_exit_code(), ft, stopped=True)     # a stopped run must not look completed


def _finish(code, fault_tolerant, reporter=True, stopped=False):
    """The process's exit. Without fault tolerance: return ``code`` (MPI_Finalize follows). With it, the
    process never calls MPI_Finalize -- it waits for dead ranks forever, and with Open MPI 5.0's threaded
    failure detector it hangs even when nobody died -- and since a fault-tolerant launch counts only
    aborts as failures (a dead worker must not fail a job its survivors finished), an error exit
    aborts with its code."""
    if not fault_tolerant:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    if code and not stopped:
        from mpi4py import MPI
        if reporter:
            from hopdec.runtime.failures import record_exit
            record_exit(code)
            MPI.COMM_WORLD.Abort(code)
        time.sleep(5)                       # the reporting rank's abort ends this one
    else:
        from hopdec.runtime.failures import end_dead_ranks, record_exit
        end_dead_ranks()                    # a stopped dead rank would keep mpirun waiting forever
        if code:
            record_exit(code)               # a clean stop: 128 + signal, which mpirun does not pass on here
    os._exit(code)
