"""Hop on a time-varying topology: what the queues and every mechanism mean when edges come and go.

A schedule (:mod:`hopdec.topology.schedule`) gives P graphs G_0..G_{P-1}; iteration k uses G_{k mod P}. The
protocol keeps two graphs apart:

* **Updates flow on the edges active at k.** Send(k) goes to out(i, k); Recv(k) waits only for in(i, k);
  Reduce(k) mixes with step k mod P's weights (:class:`hopdec.hop.receive._Policy` keeps the per-step
  weights; :meth:`hopdec.hop.worker.NodeView.out_at`). The phase is the iteration itself, so a jump, a
  resume at K or a checkpoint fixes it with no extra state (K mod P).
* **Token queues live on the union graph U** (every edge of any step), whichever step is active: entering
  an iteration inserts a token into TokenQ(i->j) for every union in-neighbour j and takes one from every
  union out-neighbour. Theorem 2's induction only looks at those two moves, never at messages, so
  ``TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig`` holds on every union edge at every instant, and
  with it Iter(i) - Iter(j) <= max_ig for every union edge i -> j and ``max_ig * len_U(Path i->j)`` for any
  pair (the token half of Table 1, on U). A token queue per union edge costs nothing when the edge is idle:
  grants are cumulative counts (tiny messages, or carried in an update when one goes that way).

What changes is the other half, Theorem 1's forward dependence: a receiver waits for a sender only at the
steps where their edge is active, so along an edge used once every g iterations (its *activation gap*,
:meth:`hopdec.topology.schedule.Schedule.activation_gap`) the receiver may be g iterations ahead, not 1.
Theorem 1 becomes Iter(i) - Iter(j) <= dist_g(j -> i), edges weighted by their gaps; with bounded
staleness s each edge weighs g + s. Table 1's bound is ``min(dist_b(j->i), max_ig * len_U(i->j))``
(:func:`hopdec.topology.schedule_analysis.gap_bounds`, which ``topo analyze``, the summary and the
invariants checker use).

The mechanisms, per step:

* **Backup workers** (sec. 4.3): Recv(k) needs all but B of in(i, k); B must be smaller than the smallest
  non-zero per-step in-degree (one-peer graphs: no backup workers -- a worker would wait for nobody).
* **Bounded staleness** (sec. 4.4): Recv(k) waits until the newest update of every in-neighbour *active at
  k* is no older than k - s; an in-neighbour active every p steps is, when on pace, p - 1 iterations old
  between its activations, so s < p makes its edge behave as in the standard setting. Reduce takes every
  fresh satisfactory update held (also from in-neighbours not active at k, whose updates came late), each
  with its edge's weight at the step it was sent in, times eq. (2)'s factor.
* **Iteration skipping** (sec. 5): a jump to k refreshes with Recv(k - 1) of step k - 1's edges, and sends
  from k on with step k's. Tokens are taken and given as on a static graph, so the token bound holds; the
  forward half does not (an edge active only at a skipped step was never waited for), so with skipping
  Table 1 is the token bound alone.
* **Late updates** (sec. 6.2): unchanged; a send is left out when its receiver is known (from the union
  tokens) to be past every iteration that could use it.
* **Checkpoints and resume**: the position K fixes the phase; the saved state is that of a static graph.
* **Notify-ack** (sec. 3.3) pairs each send with the previous one on the same edges: not supported with a
  schedule (refused). **Fault tolerance** (healing) re-wires one static graph: not supported (refused).
"""

from hopdec.errors import ConfigError
from hopdec.hop.receive import backup_limit


def check(cfg, views):
    """ConfigError naming the option when a setting cannot work on this time-varying topology."""
    if not views or views[0].steps is None:
        return
    if cfg.fault_tolerant:
        raise ConfigError("--fault-tolerance: healing a time-varying topology is not supported (it re-wires "
                          "one static graph); use a static --topology")
    if cfg.protocol == "notify-ack":
        raise ConfigError("--protocol notify-ack: not with a time-varying topology (its ACKs pair each send "
                          "with the previous one on the same edges); use --protocol tokens")
    for v in views:
        b = cfg.backup_workers if v.backup_workers is None else v.backup_workers
        limit = backup_limit([sorted(s for s in w if s != v.rank) for w, _ in v.steps])
        if b and b >= limit:
            what = f"--backup-workers {b}" if v.backup_workers is None else f"backup_workers {b} of node {v.rank}"
            raise ConfigError(f"{what}: backup workers must be fewer than a worker's in-neighbours at every step "
                              f"of the schedule, and node {v.rank} has {limit} at some step (one-peer graphs have "
                              f"one in-neighbour per step: no backup workers)")


def table1(graph, cfg):
    """``(setting, max_ig, staleness, skipping)``: the arguments of
    :func:`hopdec.topology.schedule_analysis.gap_bounds` that bound a run of ``cfg`` on this schedule."""
    from hopdec.hop.config import setting_name
    max_ig = cfg.max_ig if cfg.protocol == "tokens" else None
    return setting_name(cfg, graph), max_ig, cfg.staleness, bool(cfg.skip_max_jump)


def gap_bounds(graph, cfg):
    """Table 1's bound on Iter(i) - Iter(j) for every pair, for a run of ``cfg`` on the schedule ``graph``."""
    from hopdec.topology.schedule_analysis import gap_bounds as bounds
    return bounds(graph, *table1(graph, cfg))


def max_gap_bound(graph, cfg):
    return float(gap_bounds(graph, cfg).max())


def describe(graph):
    """``"time-varying, period P"`` for a schedule (titles, log headers); None for a static graph."""
    s = graph.graph.get("schedule")
    return None if s is None else f"time-varying, period {s.period}"
