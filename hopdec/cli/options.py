"""The options of a run -- what ``hopdec train`` and ``hopdec sim`` share -- and their translation into
settings (:class:`hopdec.settings.RunSettings`).

This is the only place that reads an ``argparse.Namespace``: :func:`settings_from` maps every option onto
the field of the settings group that holds it, and the groups check the values (ranges, choices, the
rules between options) as they are built, naming the option in one line. Nothing below the command line
sees the parser.
"""

import argparse

from hopdec.hop.config import COMPUTE_GRAPHS
from hopdec.hop.protocols import PROTOCOLS, protocol_usage
from hopdec.ps.sync import POLICIES, sync_usage
from hopdec.settings import (MODES, PS, Checkpoints, Cost, Emulation, Faults, Observe, Protocol, RunSettings,
                             Work)
from hopdec.settings.faults import deaths, ints


def add_run_arguments(p, mpi=True):
    """The options of a run, shared by ``hopdec train`` and ``hopdec sim``; returns the argument groups
    by name. ``mpi=False`` leaves out what only a real run has: the device and CUDA-aware MPI, the peer
    timeout, fault tolerance and injection, the observers that talk between ranks, and ``--compute-time``
    (the simulator's takes distributions)."""
    p.add_argument("--mode", choices=list(MODES), default=None,
                   help="decentralized (Hop), a central parameter server on rank 0 (--sync implies ps), or "
                        "allreduce: synchronous data parallelism, the mean gradient by one all-reduce per "
                        "iteration (what PyTorch DDP does); default: decentralized")
    g = p.add_argument_group("topology and protocol (decentralized mode)")
    g.add_argument("--topology", metavar="FILE|KIND",
                   help="topology file (node-link JSON, edge list or schedule), or a generator kind "
                   "(ring, ring-based, double-ring, exponential, torus, complete, one-peer-exponential, ...) "
                   "built over all ranks; default: ring-based")
    g.add_argument("--protocol", choices=list(PROTOCOLS), default="tokens",
                   help=f"how workers bound their gap: {protocol_usage()}")
    g.add_argument("--max-ig", type=int, default=2, metavar="K",
                   help="largest iteration gap between neighbours (token queues)")
    g.add_argument("--compute-graph", choices=list(COMPUTE_GRAPHS), default="parallel",
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
                   help="iteration skipping for stragglers (Hop sec. 5), with --backup-workers or --staleness "
                        ">= 1; default: off")
    g.add_argument("--compress", default="none", metavar="CODEC",
                   help="code the exchanges: fp16, bf16, int8 or topk:F (the largest fraction F), with error "
                        "feedback per edge (Choco-SGD); ,gamma=G: the consensus step (Reduce moves G of the way to "
                        "the average; default 1); default none (float32)")
    g.add_argument("--local-steps", type=int, default=1, metavar="H",
                   help="local steps: each iteration (a round of the protocol) takes H inner steps of the "
                        "model's optimizer, then exchanges and takes the outer step (DiLoCo); --iterations "
                        "counts inner steps; default 1")
    g.add_argument("--outer-optimizer", choices=["sgd", "nesterov"], default=None,
                   help="the outer step on a round's pseudo-gradient (default: nesterov with --local-steps "
                        "> 1, as DiLoCo; else sgd with lr 1: the plain step, Hop's own)")
    g.add_argument("--outer-lr", type=float, default=None, metavar="LR",
                   help="the outer step's learning rate (default: 0.7 nesterov, 1 sgd)")
    g.add_argument("--outer-momentum", type=float, default=None, metavar="M",
                   help="the outer step's momentum in [0, 1) (default: 0.9 nesterov, 0 sgd)")
    d = p.add_argument_group("model and data")
    from hopdec.ml.registry import DATASETS, MODELS
    d.add_argument("--dataset", default="digits", metavar="{" + ",".join(DATASETS) + "}|MODULE:FACTORY",
                   help="digits ships with scikit-learn, kjv (the King James Bible, bytes) with hopdec: no "
                        "download; pkg.module:factory or file.py:factory: a dataset of your own (see the README)")
    d.add_argument("--data-dir", metavar="DIR", help="cifar10: folder with the python batches")
    d.add_argument("--data-path", metavar="FILE", help="libsvm: training file")
    d.add_argument("--test-path", metavar="FILE", help="libsvm: test file (default: 20%% held out)")
    d.add_argument("--model", default=None, metavar="{" + ",".join(MODELS) + "}|MODULE:FACTORY",
                   help="default: cnn for digits, vgg11 for cifar10, svm for libsvm, transformer for kjv; "
                        "pkg.module:factory or file.py:factory: a model of your own (see the README)")
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
                   help="iterations (mini-batches) per worker (default 200); with --local-steps H they make "
                        "ceil(K/H) rounds")
    d.add_argument("--epochs", type=float, default=None, metavar="E",
                   help="instead of --iterations: passes over each worker's shard")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the model's initial weights, the data order and the emulated slowdowns")
    if mpi:
        d.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:N, or auto: cuda:(local rank mod #GPUs) if CUDA, else cpu "
                            "(cuda: the same GPU, refused where there is none)")
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
    o.add_argument("--overwrite", action="store_true",
                   help="replace the logs an earlier run left in --log-dir (without it such a directory is "
                        "refused: its rank files would be overwritten or mixed with this run's)")
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
                            "(rounds with --local-steps) and at the end, without stalling training (nonblocking reductions); logged by "
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
                       help="iterations per worker between checkpoints (rounds with --local-steps); without it, "
                            "only at the end or a stop")
        c.add_argument("--resume", metavar="D", default=None,
                       help="continue from the latest checkpoint in D that every rank has (same ranks and "
                            "settings; --iterations may be raised) and go on checkpointing there")
        c.add_argument("--resume-at", type=int, metavar="K", default=None,
                       help="with --resume: start from checkpoint K (one every rank has; the iteration, the "
                            "server's cut with --mode ps) instead of the latest -- when the latest is damaged")
        p.add_argument("--die-rank", default=None, help=argparse.SUPPRESS)   # fault injection: R or R1,R2
        p.add_argument("--die-at", default=None, help=argparse.SUPPRESS)
        p.add_argument("--die-how", choices=["exit", "hang", "raise"], default="exit", help=argparse.SUPPRESS)
        p.add_argument("--die-phase", default="train",
                       help=argparse.SUPPRESS)
    add_ps_arguments(p)
    return dict(topology=g, data=d, heterogeneity=h, output=o)


def add_network_arguments(group):
    """The network of the cost model -- ``--bandwidth``, ``--latency``, ``--nic-duplex`` -- as ``hopdec sim``
    and ``hopdec topo analyze/compare`` read it (:func:`hopdec.sim.run.link_model`)."""
    from hopdec.settings.cost import DEFAULT_BANDWIDTH_GBPS, DEFAULT_LATENCY_S
    group.add_argument("--bandwidth", action="append", default=None, metavar="[WHO@]GBPS",
                       help=f"NIC bandwidth per direction in Gb/s (repeatable; WHO@ for some ranks, e.g. 0@100 "
                            f"for a PS server); default {DEFAULT_BANDWIDTH_GBPS:g}. Topology node and edge "
                            f"attributes 'bandwidth' (Gb/s) and 'latency' (s) override it per node/link; the "
                            f"workers of one 'machine' (node attribute) share its NIC")
    group.add_argument("--latency", type=float, default=DEFAULT_LATENCY_S, metavar="SECONDS",
                       help=f"per message, where an edge has no 'latency' attribute (default {DEFAULT_LATENCY_S:g})")
    group.add_argument("--nic-duplex", choices=["full", "half"], default="full",
                       help="full: a NIC sends and receives at full bandwidth at once; half: both share it")


def add_ps_arguments(parser):
    """The PS-only options (``hopdec train`` adds them; ``--staleness``, ``--backup-workers`` are shared)."""
    g = parser.add_argument_group("parameter server (--mode ps: rank 0 serves, ranks 1.. are workers)")
    g.add_argument("--sync", default=None, metavar="{" + ",".join(POLICIES) + "}",
                   help=f"synchronization model (implies --mode ps; default bsp): {sync_usage()}")
    g.add_argument("--staleness-range", default=None, metavar="sL,sU",
                   help="dssp: staleness threshold range (default 3,15: DSSP Table I's s_L=3, r=12)")
    g.add_argument("--lookahead", type=int, default=None, metavar="R",
                   help="elastic: predicted future pushes per worker for ZipLine (default 15)")
    g.add_argument("--esync-epsilon", type=float, default=0.0, metavar="SECONDS",
                   help="esync: the state server's boundary constant (a device aggregates when its "
                        "step time + epsilon exceeds the slowest device's remaining time); negative "
                        "lets a fast device finish a step up to |epsilon| after the slowest")
    g.add_argument("--eval-interval", type=float, default=0.0, metavar="SECONDS",
                   help="evaluate the model every SECONDS of wall time: --mode ps: "
                        "the server's model, logged by the server; --mode allreduce: the workers' (identical) "
                        "model at an iteration boundary, every worker waiting for it (DIR/eval.jsonl); "
                        "decentralized (with --consensus-every): rank 0 evaluates the workers' average "
                        "model of a consensus round at most every SECONDS (DIR/eval.jsonl); 0: only at "
                        "the end")
    return parser


def _picked(args, names, renames=None):
    """``{field: value}`` of the attributes ``args`` has among ``names`` (``renames``: field -> dest)."""
    renames = renames or {}
    out = {}
    for name in names:
        dest = renames.get(name, name)
        if hasattr(args, dest):
            out[name] = getattr(args, dest)
    return out


def settings_from(args, argv=(), simulated=False):
    """The :class:`~hopdec.settings.RunSettings` of parsed options (ConfigError: one line naming the option).
    ``argv``: the command line as typed (a stopped run prints the command that resumes it); ``simulated``:
    ``hopdec sim``'s options, with the cost model."""
    work = Work(**_picked(args, Work.options()))
    protocol = Protocol(**_picked(args, Protocol.options()))
    emulation = Emulation(**{**_picked(args, ["compute_time"] if not simulated else []),
                             "slowdown": tuple(args.slowdown or ())})
    faults = Faults(**_picked(args, ["peer_timeout", "fault_tolerance", "die_how", "death_trace", "churn_mttf",
                                     "detect_s", "heal_stall_s"]),
                    **({"die_rank": ints(args.die_rank, "--die-rank"), "die_at": ints(args.die_at, "--die-at"),
                        "die_phase": tuple(p.strip() for p in str(args.die_phase or "train").split(","))}
                       if hasattr(args, "die_rank") else {}),
                    **({"deaths": deaths(args.deaths)} if hasattr(args, "deaths") else {}))
    ps = PS(**_picked(args, PS.options()))
    observe = Observe(progress=not args.no_progress,
                      **_picked(args, [f for f in Observe.options() if f != "progress"]))
    checkpoints = Checkpoints(**_picked(args, Checkpoints.options(),
                                        {"dir": "checkpoint_dir", "every": "checkpoint_every"}))
    cost = None
    if simulated:
        cost = Cost(compute_time=tuple(args.sim_compute_time or ()), bandwidth=tuple(args.bandwidth or ()),
                    **_picked(args, ["workers", "message_mb", "latency", "nic_duplex", "math", "invariants",
                                     "send_path", "eager_limit", "rendezvous"]))
    return RunSettings(mode=args.mode, work=work, protocol=protocol, ps=ps, emulation=emulation,
                       observe=observe, checkpoints=checkpoints, faults=faults, cost=cost, argv=tuple(argv),
                       typed=typed_options(argv))


def typed_options(argv):
    """The settings options the command line ``argv`` typed (``--lr 0.1``, ``--lr=0.1``, or an abbreviation
    argparse accepted, ``--iter 5``), by their full names: the ones a run refuses when its mode would
    ignore them (:meth:`hopdec.settings.RunSettings.unused`)."""
    known = {opt for group in (Work, Protocol, PS, Emulation, Observe, Checkpoints, Faults, Cost)
             for opt in group.options().values() if opt.startswith("--")}
    out = set()
    for tok in argv or ():
        tok = str(tok)
        if tok == "--":
            break
        if not tok.startswith("--"):
            continue
        name = tok.split("=", 1)[0]
        if name in known:
            out.add(name)
        else:
            match = [k for k in known if k.startswith(name)]
            if len(match) == 1:
                out.add(match[0])
    return frozenset(out)
