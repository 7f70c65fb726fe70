"""What a decentralized (Hop) run consists of, whoever executes it: real MPI ranks
(:mod:`hopdec.runtime.hop_mpi`), the virtual-time simulator (:mod:`hopdec.sim.run`) or the seeded
in-process scheduler (:mod:`hopdec.sim.inproc`).

:class:`HopRun` holds the decisions about a run that are not the protocol's (those are the cores', in
:mod:`hopdec.hop`): the topology and its checks, the protocol settings checked once
(:func:`hopdec.hop.config.check_config`, with the notes it makes), Table 1's bound, one core and one
trainer per worker, the log header, the title, what is evaluated and what is saved. An executor adds only
what it alone knows (where the parameters live, the cost model, the emulation it runs) and carries out
the actions; a reader checks "no decision in a driver" by reading this module.
"""

import copy
import os
from dataclasses import replace

from hopdec.errors import ConfigError
from hopdec.hop.config import check_config, counted, describe, gap_bound, in_steps, round_steps, rounds, setting_name
from hopdec.hop.time_varying import describe as describe_schedule
from hopdec.hop.protocols import PROTOCOLS
from hopdec.hop.worker import Worker, node_views

EVAL_MODEL = "average of every worker's parameters"
"""What a decentralized run evaluates (the summary, ``eval.jsonl``)."""


def is_generator(spec):
    from hopdec import topology as T
    return spec in T.GENERATORS and not os.path.exists(spec)


def resolve_topology(spec, size):
    """A topology file, or a generator kind of ``hopdec topo generate`` built over ``size`` workers (None:
    the default topology for ``size``)."""
    from hopdec import topology as T
    if spec is None:
        return T.default_topology(size)
    if is_generator(spec):
        try:
            g = T.GENERATORS[spec](size)
        except ValueError as err:
            raise ConfigError(f"--topology {spec}: {err}") from None
        g.graph["source"] = f"{spec}({size})"
        return g
    if os.sep not in spec and "." not in spec and not os.path.lexists(spec):   # (a path: T.load says it)
        from hopdec.errors import did_you_mean
        from hopdec.files import shown
        raise ConfigError(f"--topology {shown(spec)}: no such file, and not a generator kind (one of "
                          f"{', '.join(sorted(T.GENERATORS))}){did_you_mean(spec, T.GENERATORS, cutoff=0.6)}")
    return T.load(spec)


class HopRun:
    """One decentralized run: ``settings`` (:class:`hopdec.settings.RunSettings`) on ``graph``.

    Built before anything is loaded (the protocol's checks are cheap); :meth:`with_work` adds the resolved
    :class:`~hopdec.modes.work.Workload` (model, data, iterations) once it is known.
    """

    mode = "decentralized"

    def __init__(self, settings, graph):
        self.settings, self.graph = settings, graph
        self.cfg = settings.protocol.config(settings.work.iterations or 1, settings.checkpoints.every,
                                            settings.faults.fault_tolerance)
        self.views = node_views(graph, ahead=PROTOCOLS[self.cfg.protocol].path_bounded)
        self.notes = check_config(self.cfg, self.views)      # the protocol's checks, once per run
        # what loading the topology file noticed (weights renormalised, a periodic W): train and sim
        # print them as warnings, as topo analyze does
        self.warnings = tuple(graph.graph.get("notes", ()))
        self.work = None
        self.start = None       # (round K, inner steps done): where a resumed run's rounds start (continued_from)

    def with_work(self, work):
        """This run with its workload (``cfg.iterations`` becomes the workload's, in rounds of local steps)."""
        run = copy.copy(self)
        run.work, run.cfg = work, replace(self.cfg, iterations=rounds(work.iterations, self.cfg.local_steps,
                                                                      self.start))
        return run

    def continued_from(self, key, done=None):
        """This run resumed from its checkpoint at iteration ``key``; with local steps, after ``done`` inner
        steps (the checkpoint's; None: ``key`` whole rounds). Its rounds from ``key`` on take H inner steps
        each from inner step ``done`` on (:func:`~hopdec.hop.config.round_steps`): a checkpoint that ends
        a short last round goes on from where that round ended, and ``cfg.iterations`` counts the rounds
        that makes."""
        if not self.cfg.rounds:
            return self
        run = copy.copy(self)
        run.start = (int(key), int(key) * self.cfg.local_steps if done is None else int(done))
        return run.with_work(self.work)

    # ---- who takes part ----
    @property
    def n(self):
        return self.graph.number_of_nodes()

    @property
    def workers(self):
        """The worker ids: the ranks 0..n-1."""
        return tuple(range(self.n))

    @property
    def source(self):
        return self.graph.graph.get("source")

    def core(self, rank):
        """Worker ``rank``'s protocol core."""
        return Worker(self.views[rank], self.cfg)

    def trainer(self, rank, device="cpu"):
        """Worker ``rank``'s trainer: shard ``rank`` of n; with local steps, in rounds of them
        (:class:`hopdec.ml.trainer.LocalRounds`: inner steps in ComputeGradient, the outer step in Apply)."""
        t = self.work.trainer(rank, self.n, device)
        cfg = self.cfg
        if cfg.rounds:
            from hopdec.ml.trainer import OuterStep
            t.use_local_steps(cfg.local_steps, OuterStep(cfg.outer_optimizer, cfg.outer_lr, cfg.outer_momentum),
                              cfg.compute_graph, self.round_steps)
        return t

    def round_steps(self, k):
        """Round (iteration) k's inner steps: ``k`` itself without local steps."""
        return round_steps(k, self.cfg.local_steps, self.work.iterations, self.start)

    def inner_steps_at(self, k):
        """The inner steps taken before round (iteration) ``k`` (k <= ``cfg.iterations``; a resumed run's
        from its checkpoint's on): what a checkpoint at Enter(k) records."""
        return min(round_steps(k, self.cfg.local_steps, None, self.start).start, self.work.iterations)

    # ---- what is reported ----
    @property
    def setting(self):
        """The row of Hop Table 1 this run is (per-node backup workers of the topology count)."""
        return setting_name(self.cfg, self.graph)

    def bound(self):
        """Hop Table 1's bound on the iteration gap for this graph and setting."""
        return gap_bound(self.graph, self.cfg)

    def header(self, params, emulation, bound, **executor):
        """The log header every worker writes (``params``: the model's size, ``emulation``: what is
        emulated, ``bound``: the gap bound); ``executor``: what only the executor knows (the device, the
        cost model, where the buffers are, ...)."""
        cfg = self.cfg
        return dict(mode=self.mode, workers=self.n, topology=self.source, protocol=cfg.protocol, setting=self.setting,
                    max_ig=cfg.max_ig, staleness=cfg.staleness, backup_workers=cfg.backup_workers,
                    skip=self.settings.protocol.skip, compute_graph=cfg.compute_graph, iterations=cfg.iterations,
                    model=self.work.model, params=params, hparams=self.work.hparams, emulation=emulation,
                    gap_bound=bound, seed=self.settings.work.seed, compress=cfg.compress,
                    consensus_step=cfg.consensus_step, schedule=describe_schedule(self.graph),
                    **self.rounds_header(), **executor)

    def rounds_header(self):
        """The header's local-steps fields (none without them, so older logs and a plain run look alike):
        ``iterations`` counts rounds, ``inner_steps`` the mini-batches per worker."""
        cfg = self.cfg
        if not cfg.rounds:
            return {}
        return dict(local_steps=cfg.local_steps, inner_steps=self.work.iterations, outer=dict(
            optimizer=cfg.outer_optimizer, lr=cfg.outer_lr, momentum=cfg.outer_momentum))

    @property
    def unit(self):
        """What the summary's rows count: rounds with ``--local-steps`` H > 1, else iterations."""
        return "rounds" if self.cfg.rounds else "iters"

    def round_notes(self, bound):
        """The summary's line on rounds of local steps (none without them)."""
        cfg = self.cfg
        if not cfg.rounds:
            return []
        b = ("not computed" if bound is None else "unbounded" if bound == float("inf") else
             in_steps(bound, cfg))
        k0, done = self.start or (0, 0)
        short = (f"; resumed at round {k0} after {done} inner steps, as an earlier shorter round left it"
                 if done != k0 * cfg.local_steps else "")
        return [f"rounds: {counted(cfg.iterations, 'round')} of {cfg.local_steps} local steps "
                f"({counted(self.work.iterations, 'inner step')} per worker; the iterations above are rounds"
                f"{short}); gap bound {b}"]

    def message_bytes(self, params):
        """Bytes one update message puts on the wire: the codec's coded message, or the float32 message."""
        from hopdec.transport.codec import message_bytes
        return message_bytes(self.cfg.compress, params)

    def traffic_notes(self, counters, iterations, rank):
        """The summary's line on what a rank's updates put on the wire (``counters``: its transport's)."""
        c, its = counters, max(iterations, 1)
        line = (f"traffic: rank {rank} sent {c['bytes'] / its:,.0f} bytes of updates per "
                f"{'round' if self.cfg.rounds else 'iteration'} "
                f"({c['updates']} messages, {c['bytes']:,} bytes in all")
        if self.cfg.compress != "none":
            line += f"; --compress {self.cfg.compress}, of which {c['key_messages']} full-size keys"
        return [line + ")"]

    def title(self):
        cfg = self.cfg
        return (f"decentralized {describe(cfg, self.graph)} on {self.source} ({self.n} workers, "
                f"protocol {cfg.protocol}, max_ig {cfg.max_ig})")

    model_label = "averaged model"
    bound_label = "bound from the topology"
    eval_model = EVAL_MODEL

    def saves(self, rank):
        """Whether ``--save-models`` saves rank ``rank``'s parameters (every worker's)."""
        return bool(self.settings.observe.save_models and self.settings.observe.log_dir)

    def heal_notes(self, heals, healed_graph, bound):
        """The summary's lines about failures (``--fault-tolerance``): who failed, when, the healed graph,
        what it cost, and the healed graph's bound."""
        if not heals:
            return []
        lines = [f"failure: rank(s) {rank_list(e['failed'])} died near iteration {e['iteration']}; "
                 f"{len(e['survivors'])} survivors healed the graph in {e['stall_s']:.4g} s "
                 f"(spectral gap now {e['spectral_gap']})" for e in heals]
        from hopdec.topology.heal import relabelled
        healed_bound = gap_bound(relabelled(healed_graph), self.cfg)
        lines.append(f"after the failures the gap bound is {healed_bound:g} on the healed graph "
                     f"({healed_graph.number_of_nodes()} workers; it was {bound:g})")
        return lines


RANKS_SHOWN = 12
"""A summary line names up to this many failed ranks; more are counted (every one is in the logs)."""


def rank_list(ranks):
    """``"3, 10, 17"``; beyond :data:`RANKS_SHOWN` the first ones and the count (a burst of 90 deaths among
    2,000 simulated workers made one summary line of 90 numbers): ``"3, 10, ..., 297 (90 in all)"``; a
    log's ``heal`` events list every one."""
    ranks = list(ranks)
    if len(ranks) <= RANKS_SHOWN:
        return ", ".join(map(str, ranks))
    return ", ".join(map(str, ranks[:RANKS_SHOWN - 2])) + f", ..., {ranks[-1]} ({len(ranks)} in all)"
