"""The Hop protocol's settings: which row of Table 1 a run is, its mechanisms, and their validation.

:class:`ProtocolConfig` is plain data; :func:`check_config` rejects settings that cannot work on a graph
with a :class:`~hopdec.errors.ConfigError` naming the option -- every constraint between the protocol and
its mechanisms is there, once -- and returns the notes worth telling the user. The checks every layer
needs (``max_ig``, backup workers per node) live here once and are used by the core's constructors too.
"""

import math
from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.hop.protocols import PROTOCOLS
from hopdec.topology.bounds import check_max_ig  # noqa: F401  (the one max_ig check; hop.token_queue uses it)

COMPUTE_GRAPHS = ("parallel", "serial")
OUTER_OPTIMIZERS = ("sgd", "nesterov")
DILOCO_OUTER = dict(optimizer="nesterov", lr=0.7, momentum=0.9)
"""DiLoCo's outer step (Douillard et al. 2023): SGD with Nesterov momentum 0.9, lr 0.7."""


@dataclass(frozen=True)
class ProtocolConfig:
    """How workers coordinate. Validated by :func:`check_config` (errors name the option)."""

    iterations: int
    protocol: str = "tokens"
    max_ig: int = 2
    compute_graph: str = "parallel"
    backup_workers: int = 0
    staleness: int = None
    stale_reduce: str = "weighted"
    skip_max_jump: int = 0          # 0: no iteration skipping
    skip_trigger: int = 2
    checkpoint_every: int = 0       # every worker enters the multiples of it (a jump never skips one)
    fault_tolerant: bool = False    # survivors of a failure heal the graph and go on (Worker.reconfigure)
    compress: str = "none"          # --compress: the codec of the exchanges (hopdec.transport.codec)
    consensus_step: float = 1.0     # Choco's gamma: Reduce moves this far to the average (hop.receive.damped)
    # --local-steps: an iteration is a round of this many inner steps, then the outer step (the trainer's:
    # hopdec.ml.trainer.LocalRounds); the core never sees inner steps, so every bound here is in rounds
    local_steps: int = 1
    outer_optimizer: str = "sgd"    # the outer step on the round's pseudo-gradient (resolved: outer_step)
    outer_lr: float = 1.0
    outer_momentum: float = 0.0

    @property
    def rounds(self):
        """Whether an iteration is a round of local steps with an outer step (anything but Hop's own step)."""
        return self.local_steps > 1 or not plain_outer(self.outer_optimizer, self.outer_lr, self.outer_momentum)


def plain_outer(optimizer, lr, momentum):
    """The plain outer step -- SGD, lr 1, no momentum: a round ends where its inner steps and the exchange
    left it (with one local step: Hop's own step)."""
    return optimizer == "sgd" and lr == 1 and momentum == 0


def outer_step(local_steps=1, optimizer=None, lr=None, momentum=None):
    """``(optimizer, lr, momentum)`` of the outer step, defaults filled in: DiLoCo's (:data:`DILOCO_OUTER`)
    with local steps (H > 1) and no optimizer named, else the plain step; an optimizer named without lr
    or momentum gets its own defaults (nesterov: DiLoCo's; sgd: lr 1, momentum 0). ConfigError names the
    option that cannot work."""
    if optimizer is None:
        optimizer = DILOCO_OUTER["optimizer"] if local_steps > 1 else "sgd"
    if optimizer not in OUTER_OPTIMIZERS:
        raise ConfigError(f"--outer-optimizer {optimizer!r}: expected one of {', '.join(OUTER_OPTIMIZERS)}")
    diloco = optimizer == "nesterov"
    lr = (DILOCO_OUTER["lr"] if diloco else 1.0) if lr is None else float(lr)
    momentum = (DILOCO_OUTER["momentum"] if diloco else 0.0) if momentum is None else float(momentum)
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"--outer-lr {lr:g}: must be a finite number > 0")
    if not 0 <= momentum < 1:
        raise ConfigError(f"--outer-momentum {momentum:g}: must be in [0, 1)")
    if diloco and momentum == 0:
        raise ConfigError("--outer-optimizer nesterov needs --outer-momentum > 0 (Nesterov momentum; "
                          "--outer-optimizer sgd is the step without momentum)")
    return optimizer, lr, momentum


def rounds(steps, local_steps, start=None):
    """The rounds of a run of ``steps`` inner steps per worker, ``local_steps`` per round (the last one may
    be shorter): what the core counts as iterations. ``start``: see :func:`round_steps`."""
    k0, done = start or (0, 0)
    return k0 + -(-(int(steps) - int(done)) // int(local_steps))


def round_steps(k, local_steps, steps=None, start=None):
    """Round k's inner step indices: ``k*H .. (k+1)*H - 1``, cut at ``steps`` (the run's inner steps).

    ``start = (K, done)``: a run resumed at round K from a checkpoint after ``done`` inner steps; its rounds
    from K on are H steps each from inner step ``done`` on. That is ``K*H`` unless an earlier run's last round
    was short (its ``steps`` not a multiple of H): that round's exchange and outer step have happened, so
    the run goes on from where it ended -- no inner step skipped or taken twice -- as a loop of your own
    with ``HopSGD`` does after a short round. Rounds before K are not this run's (None for them)."""
    k0, done = start or (0, 0)
    if k < k0:
        return None
    first = int(done) + (k - k0) * local_steps
    end = first + local_steps
    return range(first, end if steps is None else min(end, int(steps)))


def in_steps(value, cfg):
    """A bound of ``value`` rounds said in inner steps too, for the summary, ``topo analyze`` and the
    invariants (e.g. "2 rounds = 16 inner steps")."""
    if cfg.local_steps == 1:
        return f"{value:g}"
    return f"{counted(value, 'round')} = {counted(value * cfg.local_steps, 'inner step')}"


def counted(value, noun):
    """``value`` and the noun, singular for exactly one: "1 round", "2 rounds", "16 inner steps"."""
    return f"{value:g} {noun}" + ("" if value == 1 else "s")


def describe_rounds(cfg):
    """The local steps and the outer step in words (empty without them)."""
    if not cfg.rounds:
        return ""
    outer = ("plain outer step" if plain_outer(cfg.outer_optimizer, cfg.outer_lr, cfg.outer_momentum) else
             f"outer {cfg.outer_optimizer} lr {cfg.outer_lr:g}"
             + (f" momentum {cfg.outer_momentum:g}" if cfg.outer_momentum else ""))
    return f"rounds of {cfg.local_steps} local step{'s' if cfg.local_steps > 1 else ''}, {outer}"


def check_backup(backup, node, in_neighbors):
    """Backup workers B at ``node`` need B < |N_in(node)| (Hop Figure 8), N_in without the node itself."""
    if backup and backup >= in_neighbors:
        raise ConfigError(f"backup workers {backup} at node {node}: must be smaller than its "
                          f"{in_neighbors} in-neighbours")
    return backup


def effective_backup(cfg, view):
    """The backup workers of one node: its topology attribute, else ``--backup-workers``."""
    return cfg.backup_workers if view.backup_workers is None else view.backup_workers


def check_config(cfg, views):
    """Raise ConfigError naming the option when a setting cannot work on this graph; return the notes (lines)
    about settings that work but not as a user may expect."""
    if cfg.protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol {cfg.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    tokens = PROTOCOLS[cfg.protocol].token_queues
    if cfg.compute_graph not in COMPUTE_GRAPHS:
        raise ConfigError(f"--compute-graph {cfg.compute_graph!r}: expected parallel or serial")
    if cfg.iterations < 1:
        raise ConfigError("--iterations must be >= 1")
    if cfg.local_steps < 1:
        raise ConfigError(f"--local-steps {cfg.local_steps}: must be >= 1")
    outer_step(cfg.local_steps, cfg.outer_optimizer, cfg.outer_lr, cfg.outer_momentum)
    check_max_ig(cfg.max_ig)
    if cfg.staleness is not None and cfg.staleness < 0:
        raise ConfigError(f"--staleness {cfg.staleness}: must be >= 0")
    if cfg.stale_reduce not in ("weighted", "plain"):
        raise ConfigError(f"--stale-reduce {cfg.stale_reduce!r}: expected weighted or plain")
    if cfg.backup_workers < 0:
        raise ConfigError(f"--backup-workers {cfg.backup_workers}: must be >= 0")
    backup = uses_backup(cfg, views)
    if cfg.backup_workers and views and all(v.backup_workers is not None for v in views):
        # a node's own backup_workers wins over the option (effective_backup): here no node reads it
        raise ConfigError(f"--backup-workers {cfg.backup_workers} is not used: every node of the topology file "
                          f"sets its own backup_workers, which wins over the option (drop one of them)")
    if not tokens and (backup or cfg.staleness is not None):
        what = (f"--backup-workers {cfg.backup_workers}" if cfg.backup_workers else
                "backup_workers in the topology file") if backup else f"--staleness {cfg.staleness}"
        raise ConfigError(f"{what} needs --protocol tokens: without token queues the iteration gap is "
                          f"unbounded (Hop sec. 4.3/4.4)")
    if cfg.fault_tolerant and cfg.rounds:
        raise ConfigError("--local-steps / --outer-optimizer with --fault-tolerance: not supported (a heal "
                          "may restart a round whose inner steps are under way; not handled yet)")
    if cfg.fault_tolerant and cfg.compress != "none":
        raise ConfigError(f"--compress {cfg.compress} with --fault-tolerance: not supported (a heal loses "
                          f"messages of the compressed streams, whose receivers need every one in order)")
    if cfg.fault_tolerant and not tokens:
        raise ConfigError(f"--fault-tolerance needs --protocol tokens (healing re-establishes the token "
                          f"queues), got --protocol {cfg.protocol}")
    notes = []
    if cfg.skip_max_jump:
        if not tokens:
            raise ConfigError("--skip needs --protocol tokens: a straggler finds itself from its tokens")
        if cfg.skip_max_jump < 2 or cfg.skip_trigger < 1:
            raise ConfigError("--skip: max-jump must be >= 2 and trigger >= 1")
        # every worker sends at every step (one without out-neighbours has nobody to lead)
        sends_each_step = all(v.out_at(m) or not v.out_neighbors for v in views for m in range(v.period))
        if not backup and not cfg.staleness and sends_each_step:
            # sec. 5 pairs skipping with backup workers or bounded staleness (Figure 10): without either, an
            # out-neighbour j of a straggler i at k that i sends to at step k + 1 needs i's update k + 1 for
            # its Recv(k + 1), so j is never more than 1 iteration past i (TokenLedger.lead_of <= 1), and a
            # jump needs a lead of 2 (_jump_target). Only a schedule with a step where i sends nothing lets
            # its out-neighbours get further ahead; a worker without out-neighbours never jumps.
            raise ConfigError(f"--skip max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}: never skips without "
                              f"--backup-workers or --staleness >= 1 (Hop sec. 5 pairs it with one of them): every "
                              f"out-neighbour of a straggler waits for its update of each iteration, so none gets "
                              f"the 2 iterations ahead that a jump needs")
        static = not any(v.steps for v in views)
        if static and cfg.skip_trigger > cfg.max_ig and all(set(v.out_neighbors) <= set(v.in_neighbors)
                                                           for v in views):
            # every out-neighbour j of i also sends to i, so i's token queue from j keeps j within max_ig
            # iterations of i (Theorem 2): TokenLedger.lead_of(j) <= max_ig < trigger, never a jump
            raise ConfigError(f"--skip max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}: never skips with "
                              f"--max-ig {cfg.max_ig}: on this graph every out-neighbour of a worker also sends to "
                              f"it, so its token queues keep them within max_ig iterations of it (Hop Theorem 2) "
                              f"and none gets the trigger's {cfg.skip_trigger} ahead; use trigger <= {cfg.max_ig}")
        if cfg.checkpoint_every == 1:       # _jump_target never jumps over a checkpoint iteration
            raise ConfigError(f"--skip max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger}: never skips with "
                              f"--checkpoint-every 1: a jump never passes an iteration every worker checkpoints, "
                              f"and every iteration is one")
        if cfg.skip_max_jump > cfg.max_ig:
            notes.append(f"--skip max-jump={cfg.skip_max_jump} > --max-ig {cfg.max_ig}: a jump never passes "
                         f"the slowest out-neighbour, which tokens keep within max_ig of it when it also "
                         f"sends to this worker, so jumps are at most {cfg.max_ig} on symmetric graphs")
    for v in views:
        b = effective_backup(cfg, v)
        if b and b >= len(v.in_neighbors):
            if v.backup_workers is None:
                fewest = min(len(u.in_neighbors) for u in views if u.backup_workers is None)
                what, most = f"--backup-workers {b}", _at_most(fewest - 1) + " on this graph"
            else:
                what, most = (f"backup_workers {b} of node {v.rank} in the topology file",
                              _at_most(len(v.in_neighbors) - 1))
            raise ConfigError(f"{what}: node {v.rank} has {len(v.in_neighbors)} in-neighbour(s); backup workers "
                              f"must be fewer than a worker's in-neighbours (Hop sec. 4.3, Figure 8): {most}")
    from hopdec.hop.time_varying import check as check_time_varying
    check_time_varying(cfg, views)                  # a schedule's per-step rules
    return notes


def parse_skip(spec):
    """``max-jump=J,trigger=G`` -> (J, G); None or "" -> (0, 2), i.e. no skipping."""
    if not spec:
        return 0, 2
    vals = {}
    for part in spec.split(","):
        key, _, val = part.partition("=")
        if key.strip() not in ("max-jump", "trigger") or not val.strip().lstrip("-").isdigit():
            raise ConfigError(f"--skip {spec!r}: expected max-jump=J,trigger=G with integers")
        vals[key.strip()] = int(val)
    if "max-jump" not in vals:
        raise ConfigError(f"--skip {spec!r}: max-jump=J is required")
    return vals["max-jump"], vals.get("trigger", 2)


def uses_backup(cfg, graph=None):
    """Whether any node has backup workers: ``--backup-workers`` or a node's ``backup_workers`` attribute
    in the topology (``graph``: an ``nx.DiGraph`` or the node views)."""
    if cfg.backup_workers > 0:
        return True
    if graph is None:
        return False
    if hasattr(graph, "nodes") and callable(graph.nodes):
        return any((d.get("backup_workers") or 0) > 0 for _, d in graph.nodes(data=True))
    return any(v.backup_workers for v in graph)


def _at_most(k: int) -> str:
    """How many backup workers a node with k + 1 in-neighbours may have, in words ("none", not "at most -1")."""
    return f"at most {k}" if k >= 1 else "none"


def setting_name(cfg, graph=None):
    """The row of Hop Table 1 this configuration is, as named by :func:`hopdec.topology.gap_bounds`;
    ``graph`` (the topology or its node views) counts per-node backup workers too."""
    row = PROTOCOLS[cfg.protocol].row if cfg.protocol in PROTOCOLS else None
    if row is not None:
        return row
    backup = uses_backup(cfg, graph)
    if cfg.staleness is not None:
        return "hybrid" if backup else "staleness"
    return "backup" if backup else "standard"


def describe(cfg, graph=None):
    """A run's setting for titles: the Table 1 row, plus iteration skipping when on."""
    return setting_name(cfg, graph) + (f"+skip(max-jump={cfg.skip_max_jump},trigger={cfg.skip_trigger})"
                                       if cfg.skip_max_jump else "") + (
        f"+compress({cfg.compress})" if cfg.compress != "none" else "") + (        # gossip
        f"+local(H={cfg.local_steps}, outer {cfg.outer_optimizer} lr {cfg.outer_lr:g}"
        + (f" momentum {cfg.outer_momentum:g}" if cfg.outer_momentum else "") + ")" if cfg.rounds else "")


def gap_bound(graph, cfg):
    """Hop Table 1's bound on the largest Iter(i) - Iter(j) for this graph and setting."""
    from hopdec.topology.bounds import max_gap_bound
    if graph.graph.get("schedule") is not None:     # time-varying: Table 1 with activation gaps
        from hopdec.hop.time_varying import max_gap_bound as time_varying_bound
        return time_varying_bound(graph, cfg)
    max_ig = cfg.max_ig if PROTOCOLS[cfg.protocol].token_queues else None
    return max_gap_bound(graph, setting_name(cfg, graph), max_ig=max_ig, staleness=cfg.staleness)
