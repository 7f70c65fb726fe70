"""The command-line options of ``hopdec train --mode ps`` and their checks (before torch is imported)."""

from hopdec.errors import ConfigError
from hopdec.ps.sync import SYNC_MODES, make_policy


def add_arguments(parser):
    """The PS-only options (``hopdec train`` adds them; ``--staleness``, ``--backup-workers`` are shared)."""
    g = parser.add_argument_group("parameter server (--mode ps: rank 0 serves, ranks 1.. are workers)")
    g.add_argument("--sync", default=None, metavar="{" + ",".join(SYNC_MODES) + "}",
                   help="synchronization model (implies --mode ps; default bsp): bsp, asp, ssp "
                        "(--staleness s, default 3), dssp "
                        "(--staleness-range), elastic (--lookahead), backup (--backup-workers b, default 1: "
                        "N = workers - b gradients per step), esync")
    g.add_argument("--staleness-range", default=None, metavar="sL,sU",
                   help="dssp: staleness threshold range (default 3,15: DSSP Table I's s_L=3, r=12)")
    g.add_argument("--lookahead", type=int, default=None, metavar="R",
                   help="elastic: predicted future pushes per worker for ZipLine (default 15)")
    g.add_argument("--esync-epsilon", type=float, default=0.0, metavar="SECONDS",
                   help="esync: the state server's boundary constant (a device aggregates when its "
                        "step time + epsilon exceeds the slowest device's remaining time); negative "
                        "lets a fast device finish a step up to |epsilon| after the slowest")
    g.add_argument("--eval-interval", type=float, default=0.0, metavar="SECONDS",
                   help="the server evaluates its model every SECONDS of wall time and logs it; "
                        "decentralized runs with --consensus-every: rank 0 evaluates the workers' average "
                        "model of a consensus round at most every SECONDS (DIR/eval.jsonl) (0: only at "
                        "the end)")
    return parser


def policy_from(args, workers):
    """The sync policy the options ask for, over worker ids ``workers`` (ConfigError names the option)."""
    return make_policy(getattr(args, "sync", None) or "bsp", workers,
                       staleness=getattr(args, "staleness", None),
                       staleness_range=getattr(args, "staleness_range", None),
                       lookahead=getattr(args, "lookahead", None),
                       backup_workers=getattr(args, "backup_workers", None),
                       esync_epsilon=getattr(args, "esync_epsilon", 0.0) or 0.0)


def check_args(args, size):
    """The PS checks that need only the options and the number of ranks (no torch): returns the policy.

    Rank 0 is the server, ranks 1..size-1 the workers; every number a user sees is an MPI rank.
    """
    if size < 2:
        raise ConfigError(f"--mode ps needs at least 2 ranks (a server and a worker), got {size}")
    from hopdec.transport.codec import check_options as check_compress      # gossip: --compress is decentralized
    check_compress(args)
    ev = getattr(args, "eval_interval", 0.0) or 0.0
    if not ev >= 0 or ev == float("inf"):
        raise ConfigError(f"--eval-interval must be a finite number of seconds >= 0, got {ev}")
    from hopdec.runtime.faults import _ints
    for die in _ints(getattr(args, "die_rank", None)):
        if not 0 <= die < size:
            raise ConfigError(f"--die-rank {die}: no such rank (0..{size - 1})")
    return policy_from(args, range(1, size))
