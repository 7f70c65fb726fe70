"""``hopdec sim``: a run's assembly (:mod:`hopdec.modes`) carried out in virtual time, in one process.

The settings are ``hopdec train``'s plus the cost model (:class:`hopdec.settings.Cost`; :mod:`hopdec.sim.costs`,
:mod:`hopdec.sim.network`). The run is assembled exactly as a real one (:class:`~hopdec.modes.HopRun`,
:class:`~hopdec.modes.PSRun`: the same checks, cores, trainers, headers, titles, evaluations and saved
models), the same cores run (:mod:`hopdec.sim.hop`, :mod:`hopdec.sim.ps`), and the same logs and summary
come out, with virtual times and a label saying which fidelity made them: ``SIMULATED (timing only)`` or
``SIMULATED (--math)``. What is this executor's own: the cost model, the network, the invariant checks
and the footer with the simulation's own figures.
"""

import json
import math
import os
import sys
import time
from functools import partial

from hopdec.errors import ConfigError, HopdecError
from hopdec.files import writing
from hopdec.settings.cost import CHECK_UP_TO, DEFAULT_BANDWIDTH_GBPS
from hopdec.sim.costs import ComputeModel, check_seconds, parse_bandwidth, per_rank
from hopdec.sim.events import collector_paused
from hopdec.sim.network import LinkModel
from hopdec.sim.progress import attach as progress, running
from hopdec.words import count

MIB = 2 ** 20
"""``--message-mb`` counts MiB (VGG-16's 138M float32 parameters are the papers' "528 MB")."""
TABLE_UP_TO = 32          # one summary row per worker up to this many, else mean / slowest / fastest
BOUND_UP_TO = 2048        # Table 1's bound needs all-pairs path lengths (n x n)
EVAL_EACH_UP_TO = 64      # --math: each worker's own test accuracy in the table up to this many


# ---- what a simulation is made of ----------------------------------------------------------------
def assemble(settings):
    """The run assembly of the settings' mode (its cheap checks made), over the workers ``-n`` and the
    topology say."""
    from hopdec.modes.decentralized import HopRun, is_generator, resolve_topology
    from hopdec.modes.ps import PSRun
    n, spec = settings.cost.workers, settings.protocol.topology
    if n is not None:
        from hopdec.limits import check_workers
        check_workers(n, f"-n {n}")
    if settings.mode == "allreduce":
        from hopdec.modes.allreduce import AllReduceRun
        if n is None:
            raise ConfigError("--mode allreduce: give the number of workers with -n")
        return AllReduceRun(settings, n)
    if settings.mode == "ps":
        if n is None:
            raise ConfigError("--mode ps: give the number of workers with -n (the server is rank 0, the "
                              "workers ranks 1..n)")
        return PSRun(settings, n)
    if spec is None or is_generator(spec):
        if n is None:
            raise ConfigError("give the number of workers with -n (or a topology file)")
        graph = resolve_topology(spec, n)
    else:
        graph = resolve_topology(spec, 0)                 # a file (a missing one: its own error)
        if n is not None and graph.number_of_nodes() != n:
            raise ConfigError(f"{spec}: has {graph.number_of_nodes()} workers but -n is {n}")
    return HopRun(settings, graph)


def _number_attr(value, what, positive=True):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a number") from None
    if math.isnan(x) or x < 0 or (positive and x == 0) or (math.isinf(x) and not positive):
        raise ConfigError(f"{what}: must be {'> 0' if positive else 'a finite number >= 0'}, got {value!r}")
    return x


def link_model(cost, nodes, graph=None):
    """The network (``cost``: :class:`hopdec.settings.Cost`): ``--bandwidth [WHO@]GBPS`` (repeatable),
    ``--latency``, ``--nic-duplex``, and the topology's ``bandwidth`` (Gb/s) node attributes,
    ``bandwidth``/``latency`` edge attributes and ``machine`` node attributes (a machine's workers share its
    NIC, :class:`~hopdec.sim.network.LinkModel`)."""
    latency = check_seconds(cost.latency, "--latency")
    specs = list(cost.bandwidth)
    base = DEFAULT_BANDWIDTH_GBPS * 1e9 / 8
    for s in specs:
        if "@" not in str(s):
            base = parse_bandwidth(str(s).strip(), "--bandwidth", str(s))
    node_bw = {}
    src = (graph.graph.get("source") if graph is not None else None) or "topology"
    if graph is not None:
        for v, d in graph.nodes(data=True):
            if "bandwidth" in d:
                node_bw[int(v)] = _number_attr(d["bandwidth"], f"{src}: node {v} bandwidth") * 1e9 / 8
    per = per_rank("--bandwidth", [s for s in specs if "@" in str(s)], range(nodes), parse_bandwidth, None,
                   members=src if graph is not None else "this run")    # (a PS server's NIC: rank 0)
    node_bw.update({r: v for r, v in per.items() if v is not None})
    node_bw = {r: v for r, v in node_bw.items() if v != base}
    links = {}
    if graph is not None:
        # the adjacency read directly and no set per edge: 4 s of CPU at a 100,000-worker one-peer schedule's
        # 1.7 million union edges, none with an attribute (topo analyze's network section), now 0.7
        tagged = ((u, v, d) for u, nbrs in graph.adjacency() for v, d in nbrs.items()
                  if ("bandwidth" in d or "latency" in d) and u != v)
        for u, v, d in tagged:
            bw = d.get("bandwidth")
            lat = d.get("latency")
            links[(int(u), int(v))] = (
                None if bw is None else _number_attr(bw, f"{src}: edge {u}->{v} bandwidth") * 1e9 / 8,
                None if lat is None else _number_attr(lat, f"{src}: edge {u}->{v} latency", positive=False))
    hosts = {} if graph is None else {int(v): d["machine"] for v, d in graph.nodes(data=True) if "machine" in d}
    return LinkModel(bandwidth=base, latency=latency, node_bandwidth=node_bw, links=links,
                     duplex=cost.nic_duplex, hosts=hosts)


class _Logs:
    """Per-rank JSONL logs without one open file per rank (10,000 workers would exhaust file handles):
    lines are buffered and appended in batches. Each rank also gets a :class:`RankLogger` without a file
    for the summary's figures. ``header(rank)``: the rank's header line; ``entries``: keep each rank's
    (time, iteration) list (:class:`RankLogger`; the Hop simulator measures the gap as it runs)."""

    FLUSH_LINES = 200_000

    def __init__(self, log_dir, ranks, header, entries=True):
        from hopdec.runtime.metrics import RankLogger
        self.dir = log_dir
        self.stats = {r: RankLogger(None, r, entries=entries) for r in ranks}
        self._lines = {r: [] for r in ranks}
        self._count = 0
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            for r in ranks:
                with writing(self._path(r), "w") as f:
                    f.write(json.dumps({"rank": r, "run": header(r)}) + "\n")

    def _path(self, r):
        return os.path.join(self.dir, f"rank{r}.jsonl")

    def sink(self, rank):
        """Where rank ``rank``'s records go: :meth:`log` for it, or straight to its :class:`RankLogger` when
        no file is kept (one call less per simulated worker-iteration)."""
        return partial(self.log, rank) if self.dir else self.stats[rank].log

    def log(self, rank, rec):
        self.stats[rank].log(rec)
        if self.dir:
            self._lines[rank].append(json.dumps(rec))
            self._count += 1
            if self._count >= self.FLUSH_LINES:
                self.flush()

    def event(self, rank, name, **data):
        """A line that is not an iteration record (``{"event": name, ...}``), as :meth:`RankLogger.event`."""
        if self.dir:
            self._lines[rank].append(json.dumps(dict(event=name, **data)))
            self._count += 1

    def flush(self):
        if not self.dir:
            return
        for r, lines in self._lines.items():
            if lines:
                with writing(self._path(r), "a") as f:
                    f.write("\n".join(lines) + "\n")
                lines.clear()
        self._count = 0


def _rows(stats, evaluate_each=None):
    rows = []
    for r, s in stats.items():
        acc = evaluate_each(r) if evaluate_each else None
        rows.append(dict(rank=r, iterations=s.iterations, iter_per_s=s.progress_rate, wait_s=s.wait_s,
                         compute_s=s.compute_s, jumps=s.jumps, loss=s.last_loss, test_acc=acc))
    return rows


def _condensed(rows, logged):
    """Large runs: the mean over workers, then the slowest and the fastest worker (by iter/s)."""
    if len(rows) <= TABLE_UP_TO:
        return rows, None
    n = len(rows)
    rated = [r for r in rows if r["iter_per_s"] is not None]

    def mean(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return sum(vals) / len(vals) if vals else None
    avg = dict(rank="mean", iterations=round(mean("iterations")), iter_per_s=mean("iter_per_s"),
               wait_s=mean("wait_s"), compute_s=mean("compute_s"), jumps=round(mean("jumps")),
               loss=mean("loss"), test_acc=mean("test_acc"))
    out = [avg]
    if rated:
        slow = min(rated, key=lambda r: r["iter_per_s"])
        fast = max(rated, key=lambda r: r["iter_per_s"])
        out += [dict(slow, rank=f"slowest: {slow['rank']}"), dict(fast, rank=f"fastest: {fast['rank']}")]
    return out, f"({n} workers: their mean, the slowest and the fastest; " + (
        "every rank is in the logs)" if logged else "--log-dir keeps every rank's records)")


# ---- the run -----------------------------------------------------------------------------------
class Stopped(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, which ``hopdec sim`` turns into one) while the events ran: the records kept so far
    were written; ``str``: where the run stopped and where its records are. Still a KeyboardInterrupt, so a
    script that calls :func:`simulate` and catches one sees no difference."""


def _run_events(sim, total, log_dir, flush):
    """``sim.run()``; a KeyboardInterrupt in it (Ctrl-C) writes the records kept so far (``flush()``: a
    long run buffers up to :attr:`_Logs.FLUSH_LINES`, which an interrupt lost) and raises :class:`Stopped`.
    A run that ends on an error (the deaths left too few workers) writes them too, as a real run's logs
    keep what it did before its one line: the deaths and heals until then are in them."""
    try:
        sim.run()
    except HopdecError as err:
        flush()
        if log_dir:
            raise type(err)(f"{err} (the records up to then are in {log_dir}/rank*.jsonl)") from None
        raise
    except KeyboardInterrupt:
        flush()
        its = running(sim)
        lo, hi = (min(its.values()), max(its.values())) if its else (None, None)
        where = ("every worker had finished" if not its else f"the workers at iteration {lo} of {total}"
                 if lo == hi else f"the workers at iterations {lo}..{hi} of {total}")
        raise Stopped(f"at virtual second {sim.q.now:.6g} ({where}); "
                      + (f"the records up to then are in {log_dir}/rank*.jsonl; " if log_dir else "")
                      + "no summary") from None


def run_id(settings):
    """A simulated run's id in its logs' headers: a hash of what it computes (its settings but where its
    output goes), so the same simulation writes the same logs, and two different ones never share an id."""
    import hashlib
    from dataclasses import fields
    output = {"log_dir", "overwrite", "progress", "progress_interval", "trace", "tensorboard"}
    what = [(f.name, getattr(settings, f.name)) for f in fields(settings) if f.name not in ("observe", "argv", "typed")]
    what += [(f.name, getattr(settings.observe, f.name)) for f in fields(settings.observe) if f.name not in output]
    return hashlib.sha256(repr(what).encode()).hexdigest()[:12]


class Simulation:
    """One simulated run: the assembly with its workload, the cost model, and what the summary says of it."""

    def __init__(self, settings, out):
        from hopdec.modes.work import INPUTS, resolve
        from hopdec.runtime.setup import check_fresh_log_dir
        cost = settings.cost
        self.settings, self.cost, self.out = settings, cost, out
        self.run_id = run_id(settings)
        run = assemble(settings)
        n = len(run.workers)
        nodes = n + (1 if run.mode == "ps" else 0)
        if settings.observe.log_dir:
            check_fresh_log_dir(settings.observe.log_dir, 0, nodes, settings.observe.overwrite)
        self.deaths = None                  # simulated deaths (hopdec.sim.churn), read before any data
        if settings.faults.simulates_deaths:
            from hopdec.sim.churn import check_ps, planned_deaths
            if run.mode == "ps":
                check_ps(settings.faults, settings.faults.deaths)
            self.deaths = planned_deaths(settings.faults, run.workers, settings.work.seed)
        self.compute = ComputeModel(list(cost.compute_time), run.workers, seed=settings.work.seed,
                                    slowdowns=list(settings.emulation.slowdown))
        self.link = link_model(cost, nodes, getattr(run, "graph", None))
        load = cost.math or (cost.message_mb is None and settings.work.dataset not in INPUTS)
        self.run = run = run.with_work(resolve(settings.work, n, load_data=load, trains=cost.math, copies=True))
        self.numel = run.work.numel() if (cost.math or cost.message_mb is None) else None
        self.message_bytes = cost.message_mb * MIB if cost.message_mb is not None else 4 * self.numel
        self.check = cost.check_invariants(n)
        from hopdec.sim.sends import DEFAULT_EAGER_BYTES, SendPath
        self.sends = SendPath(cost.send_path, float(DEFAULT_EAGER_BYTES if cost.eager_limit is None
                                                    else cost.eager_limit), cost.rendezvous)
        self.cost_model = dict(fidelity=cost.fidelity, time_unit="virtual seconds", **self.compute.as_dict(),
                               message_mb=self.message_bytes / MIB,
                               message_size="--message-mb" if cost.message_mb is not None else
                               f"{run.work.model}: {self.numel} parameters x 4 bytes",
                               network=self.link.as_dict(), invariants_checked=self.check)
        if run.mode == "decentralized":
            self.cost_model["sends"] = self.sends.as_dict()
        # --compress: what a coded update message weighs: of the model, or of --message-mb's values when
        # given (with --math the real model is coded and each message charged message_bytes / its bytes)
        self.coded_numel = self.numel if cost.message_mb is None else int(self.message_bytes // 4)
        self.math_numel = self.numel if cost.math else self.coded_numel
        self.coded_scale = (self.message_bytes / (4 * self.numel)
                            if cost.math and cost.message_mb is not None else 1.0)
        cfg = getattr(run, "cfg", None)
        if cfg is not None and cfg.compress != "none":
            from hopdec.transport.codec import message_bytes as coded_bytes
            self.cost_model.update(compress=cfg.compress,
                                   message_mb_coded=coded_bytes(cfg.compress, self.coded_numel) / MIB)
        if cost.math:
            import torch
            torch.set_num_threads(settings.work.threads or 1)

    def header(self):
        """What the executor adds to the run's header: the fidelity, the device, the cost model."""
        more = {}
        if self.deaths is not None:
            from hopdec.sim.churn import describe
            more = dict(fault_tolerance=True, simulated_deaths=describe(self.settings.faults, self.deaths,
                                                                        self.run.mode))
        return dict(device="simulated", simulated=self.cost.fidelity, cost_model=self.cost_model,
                    run_id=self.run_id, **more)

    def trainers(self, ranks):
        return {r: self.run.trainer(r) for r in ranks}

    def times_line(self):
        mb = self.message_bytes / MIB
        coded = self.cost_model.get("message_mb_coded")
        return (f"{self.cost.fidelity} -- virtual seconds; {self.compute.describe()}; messages of "
                f"{mb:.4g} MiB ({self.cost_model['message_size']})"
                + (f" coded to {coded:.4g} MiB by --compress {self.cost_model['compress']}" if coded else "")
                + f"; {self.link.describe()}"
                + (f"; {self.sends.describe(self.message_bytes)}" if "sends" in self.cost_model else "")
                + "; sends, Reduce and Apply take no time")

    def footer(self, sim, wall, extra=""):
        net = sim.net
        ev = sim.q.events
        return (f"simulated {sim.q.now:.6g} virtual s in {wall:.3g} s of wall time: {count(ev, 'event')} "
                f"({ev / max(wall, 1e-9):,.0f}/s; {count(net.transfers, 'data message')}, "
                f"{count(net.controls, 'control message')}){extra}")


def simulate(settings, out=None, entries=False):
    """Run ``hopdec sim`` for ``settings`` (:class:`hopdec.settings.RunSettings` with a cost model); print
    the summary to ``out`` and return the figures. ``entries``: the decentralized mode's ``stats[r].entries``
    keep every iteration's (time, iteration), for a caller that reads rates off them (the summary does not:
    the simulator measures the gap as it runs; at 10,000 x 1000 they are 10 million tuples, about 1 GB);
    else they are None. So do the all-reduce's; the parameter server's always keep them (its gap is
    replayed from them). ``out`` None: the
    ``sys.stdout`` of the call (a default bound at import kept a stream that may be closed since)."""
    out = sys.stdout if out is None else out
    if settings.observe.log_dir:                        # a file or a FIFO there, no permission: one line, first
        from hopdec.runtime.metrics import check_log_dir
        check_log_dir(settings.observe.log_dir, 0)
    with collector_paused():                # O(n) objects, no cycles: no full collections walking them
        sim = Simulation(settings, out)
    for note in getattr(sim.run, "warnings", ()):        # the topology file's, as hopdec train prints them
        print(f"hopdec sim: warning: {note}", file=sys.stderr, flush=True)
    for note in getattr(sim.run, "notes", ()):
        print(f"hopdec sim: note: {note}", file=sys.stderr, flush=True)
    for note in sim.run.work.notes:                     # (the data's: shards smaller than a batch)
        print(f"hopdec sim: note: {note}", file=sys.stderr, flush=True)
    for note in settings.observe.unseen(outputs=("--log-dir",)):
        print(f"hopdec sim: note: {note}", file=sys.stderr, flush=True)
    untrained = settings.untrained()
    if untrained:
        print(f"hopdec sim: note: {', '.join(untrained)} change{'s' if len(untrained) == 1 else ''} nothing "
              f"here: timing only, no model trains (--math trains one)", file=sys.stderr, flush=True)
    if sim.run.mode == "ps":
        return _run_ps(sim)
    if sim.run.mode == "allreduce":
        return _run_allreduce(sim, entries)
    return _run_hop(sim, entries)


def _run_hop(S, entries=False):
    import numpy as np

    from hopdec.modes.work import save_params
    from hopdec.runtime.summary import summary_text
    from hopdec.sim.hop import HopSim

    hop, cost, ob = S.run, S.cost, S.settings.observe
    workers, n = hop.workers, hop.n
    log_dir = ob.log_dir
    bound = hop.bound() if n <= BOUND_UP_TO else None
    header = hop.header(S.numel, S.compute.describe(), bound, **S.header())
    logs = _Logs(log_dir, workers, lambda r: header, entries=entries)   # the gap: sim.max_gap
    compute_time, on_record, records = S.compute.step, None, logs.sink
    if hop.cfg.rounds:                  # a round of local steps costs its inner steps' times
        from hopdec.sim.costs import RoundCompute
        compute_time = RoundCompute(S.compute.step, hop.round_steps)

        def on_record(rank, rec):
            steps = hop.round_steps(rec["iter"])
            rec["inner_steps"], rec["first_step"] = len(steps), steps.start
            logs.log(rank, rec)
        records = None
    factory, trainers = None, None
    if cost.math:                       # torch only here: a timing-only run never imports it
        from hopdec.sim.backends import MathBackend
        trainers = S.trainers(workers)
        factory = lambda r: MathBackend(trainers[r], r, compute_time)  # noqa: E731
    inv = None
    if S.check:
        from hopdec.hop.invariants import Invariants
        inv = Invariants(hop.graph, hop.cfg)
    with collector_paused():
        sim = HopSim(hop.views, hop.cfg, compute_time, network=S.link, message_bytes=S.message_bytes,
                     backend_factory=factory, on_record=on_record, records=records, send_path=S.sends,
                     compress=hop.cfg.compress, numel=S.math_numel, coded_scale=S.coded_scale,
                     detail=bool(log_dir), check=(lambda s: inv.check(s.cores, s.in_flight, s.sent_to)) if inv else None)
    churn = None
    if S.deaths is not None:                    # worker deaths, healed as --fault-tolerance heals them
        from hopdec.sim.churn import attach
        churn = attach(sim, hop, S.settings.faults, S.deaths, cost.fidelity, logs.event, inv, trainers)
    evals = []
    if trainers and ob.eval_interval:
        def evaluate():
            avg = np.mean([t.write_params() for t in trainers.values()], axis=0)
            loss, acc = next(iter(trainers.values())).evaluate(avg)
            # the living workers' iterations: a dead one's stays where it died (its model left the average)
            its = [c.iteration for c in sim.cores if churn is None or c.rank in churn.alive]
            evals.append(dict(time=sim.now, test_loss=loss, test_acc=acc, iter_min=min(its),
                              iter_mean=sum(its) / len(its), model=hop.eval_model, simulated=cost.fidelity,
                              sent_bytes=sum(io.bytes_sent for io in sim.ios) / n))
        evaluate()
        sim.q.every(ob.eval_interval, evaluate)
    progress(sim, hop.cfg.iterations, S.settings,            # a line every few wall seconds on a long run
             what="round" if hop.cfg.rounds else "iter")
    t0 = time.perf_counter()
    _run_events(sim, hop.cfg.iterations, log_dir, logs.flush)
    wall = time.perf_counter() - t0
    logs.flush()
    avg_loss = avg_acc = None
    each = None
    if trainers:
        avg = np.mean([t.write_params() for t in trainers.values()], axis=0)
        avg_loss, avg_acc = next(iter(trainers.values())).evaluate(avg)
        evals.append(dict(time=sim.now, test_loss=avg_loss, test_acc=avg_acc, iter_min=hop.cfg.iterations - 1,
                          iter_mean=hop.cfg.iterations - 1, model=hop.eval_model, simulated=cost.fidelity,
                          sent_bytes=sum(io.bytes_sent for io in sim.ios) / n, final=True))
        if n <= EVAL_EACH_UP_TO:
            each = lambda r: trainers[r].evaluate()[1]  # noqa: E731
        for r, t in trainers.items():
            if hop.saves(r):
                save_params(log_dir, r, t.write_params())
    if log_dir and evals:
        with writing(os.path.join(log_dir, "eval.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in evals)
    stats = logs.stats if churn is None else {r: s for r, s in logs.stats.items() if r in churn.alive}
    rows, note = _condensed(_rows(stats, each), bool(log_dir))
    text = summary_text(f"{cost.fidelity}: {hop.title()}", rows, sim.max_gap, S.times_line(), avg_loss=avg_loss,
                        avg_acc=avg_acc, bound=bound, model_label=hop.model_label, bound_label=hop.bound_label,
                        unit=hop.unit)
    if bound is None:
        text += f"\n(Table 1's gap bound is not computed above {BOUND_UP_TO} workers: it needs all-pairs paths)"
    if note:
        text += "\n" + note
    if churn is not None:
        from hopdec.sim.churn import summary_lines
        text += "\n" + "\n".join(summary_lines(churn, hop, bound, cost.fidelity))
    cfg = hop.cfg
    sent = sum(io.bytes_sent for io in sim.ios)                     # what the updates moved
    text += "".join("\n" + line for line in hop.round_notes(bound))
    if sim.waits:                                   # zero-copy sends: the pool of stores, as a real run's
        from hopdec.runtime.hop_loop import store_cap, stores_line
        text += "\n" + stores_line([b.stores for b in sim.backends], int(S.message_bytes), max(map(store_cap, sim.cores)))
    ran = sum(st.iterations for st in logs.stats.values())        # (a jump skips some; a dead worker stops)
    text += (f"\ntraffic: {sent / max(ran, 1):,.0f} bytes of updates per worker and "
             f"{'round' if cfg.rounds else 'iteration'} run"
             + (f" (--compress {cfg.compress}: coded messages of {S.cost_model['message_mb_coded'] * MIB:,.0f} "
                f"bytes, keys of {4 * S.coded_numel + 32:,} once per edge)" if cfg.compress != "none" else ""))
    if cfg.compress == "none" and churn is None:      # what the network alone allows (topo analyze's bound)
        from hopdec.topology.traffic import traffic
        t = traffic(hop.graph, S.link, S.message_bytes / MIB)
        if t["max_iterations_per_s"]:
            text += (f"\nnetwork: at most {t['max_iterations_per_s']:.4g} {'rounds' if cfg.rounds else 'iterations'}"
                     f"/s whatever the compute ({t['bottleneck']}; hopdec topo analyze)")
    checked = (f"; Hop invariants (Theorem 2, queue capacity, Table 1 gaps, no update lost"
               + (", in rounds" if cfg.rounds else "") + f") held at all {inv.checks} events" if inv else "; Hop invariants not checked (" + (
                   f"--invariants auto checks up to {CHECK_UP_TO} workers; --invariants on forces it)"
                   if cost.invariants == "auto" else "--invariants off)"))
    text += "\n" + S.footer(sim, wall, checked)
    if log_dir:
        text += f"\nlogs: {log_dir}/rank*.jsonl" + (" and eval.jsonl" if evals else "")
    print(text, file=S.out, flush=True)
    return dict(text=text, sim=sim, max_gap=sim.max_gap, bound=bound, avg_loss=avg_loss, avg_acc=avg_acc,
                evals=evals, wall_s=wall, events=sim.q.events, virtual_s=sim.now, rows=_rows(logs.stats),
                stats=logs.stats, checks=inv.checks if inv else 0, header=header, title=hop.title(),
                setting=hop.setting, churn=churn)


def _run_ps(S):
    from hopdec.core import Deadlock
    from hopdec.modes.work import save_params
    from hopdec.report.gaps import largest_gap
    from hopdec.runtime.metrics import EventLog
    from hopdec.runtime.summary import summary_text
    from hopdec.sim.ps import PSSim

    ps, cost, ob = S.run, S.cost, S.settings.observe
    policy, workers, n = ps.policy, ps.workers, ps.n
    log_dir = ob.log_dir
    events = EventLog(log_dir, ps.header(0, S.numel, **S.header()))
    logs = _Logs(log_dir, workers, lambda w: ps.header(w, S.numel, S.compute.describe(), **S.header()))
    factory = server_model = trainers = server_trainer = None
    if cost.math:                       # torch only here: a timing-only run never imports it
        from hopdec.runtime.backend import ServerModel
        from hopdec.sim.backends import PSMathBackend
        trainers = S.trainers(workers)
        server_trainer = ps.trainer(0)
        server_model = ServerModel(server_trainer)
        factory = lambda w: PSMathBackend(trainers[w], w, S.compute.step)  # noqa: E731
    bound = ps.bound()

    def bounded(sim):
        low = policy.slowest_pushes()
        for w in workers:
            if sim.running(w) and policy.pushes[w] - low > bound:
                raise AssertionError(f"--sync {policy.sync}: worker {w} runs {policy.pushes[w] - low} "
                                     f"pushes ahead of the slowest, bound {bound}")
    check = bounded if S.check and bound is not None else None
    sim = PSSim(policy, S.compute.step, budget=ps.budget, network=S.link, message_bytes=S.message_bytes,
                backend_factory=factory, server_model=server_model, numel=S.numel, on_record=logs.log,
                on_event=events, check=check)
    if S.deaths is not None:                    # worker deaths: found --failure-detection later, then dropped
        from hopdec.sim.churn import kill_ps_workers
        kill_ps_workers(sim, S.deaths, S.settings.faults.detect_s, cost.fidelity)
    evals = []

    def evaluate():
        loss, acc = server_trainer.evaluate()
        rec = dict(time=sim.now, elapsed=sim.now, version=policy.version, work=sim.server.work,
                   test_loss=loss, test_acc=acc)
        evals.append(rec)
        events("eval", **rec)
    if server_trainer is not None and ob.eval_interval:
        evaluate()
        sim.q.every(ob.eval_interval, evaluate)
    progress(sim, ps.work.iterations, S.settings)            # a line every few wall seconds on a long run
    t0 = time.perf_counter()

    def flush():
        logs.flush()
        events.close()
    _run_events(sim, ps.work.iterations, log_dir, flush)
    wall = time.perf_counter() - t0
    logs.flush()
    if not all(sim.done.values()):
        raise Deadlock(f"--sync {policy.sync}: no event left but workers "
                       f"{[w for w, d in sim.done.items() if not d]} did not finish")
    elapsed = sim.end_time if sim.end_time is not None else sim.now
    avg_loss = avg_acc = None
    each = None
    if server_trainer is not None:
        evaluate()
        avg_loss, avg_acc = evals[-1]["test_loss"], evals[-1]["test_acc"]
        if n <= EVAL_EACH_UP_TO:
            each = lambda w: trainers[w].evaluate()[1]  # noqa: E731
        if ps.saves(0):
            save_params(log_dir, 0, server_trainer.write_params())
        for w, t in trainers.items():
            if ps.saves(w):
                save_params(log_dir, w, t.write_params())
    events("summary", elapsed=elapsed, version=policy.version, applied=sim.server.applied,
           dropped=sim.server.dropped, discarded=sim.server.discarded, unfinished=sim.server.unfinished,
           work=sim.server.work, test_loss=avg_loss, test_acc=avg_acc)
    events.close()
    from hopdec.sim.churn import ps_gap_entries
    gap = largest_gap(*ps_gap_entries(sim, logs.stats))    # a dead worker counts until the server dropped it
    rows, note = _condensed(_rows(logs.stats, each), bool(log_dir))
    text = summary_text(f"{cost.fidelity}: {ps.title()}", rows, gap, S.times_line(), avg_loss=avg_loss,
                        avg_acc=avg_acc, bound=bound, model_label=ps.model_label, bound_label=ps.bound_label)
    if note:
        text += "\n" + note
    if S.deaths is not None:
        from hopdec.sim.churn import ps_summary_lines
        text += "".join("\n" + line for line in ps_summary_lines(sim, S.settings.faults.detect_s, cost.fidelity,
                                                                      len(S.deaths)))
        text += "".join(f"\n{line} ({cost.fidelity}, virtual time)" for line in ps.failure_notes(sim.server))
    text += "\n" + ps.server_line(sim.server, f"{elapsed:.6g} virtual s")
    checked = ("" if check is None else f"; the sync model's gap bound held at all {sim.q.events} events")
    if check is None and S.cost.invariants == "on":             # (asked for, and there is nothing to check)
        checked = f"; --invariants on: --sync {policy.sync} bounds no gap, so nothing was checked"
    text += "\n" + S.footer(sim, wall, checked)
    if log_dir:
        text += f"\nlogs: {log_dir}/rank*.jsonl"
    print(text, file=S.out, flush=True)
    return dict(text=text, sim=sim, max_gap=gap, bound=bound, avg_loss=avg_loss, avg_acc=avg_acc,
                evals=evals, wall_s=wall, events=sim.q.events, virtual_s=elapsed, rows=_rows(logs.stats),
                stats=logs.stats, policy=policy, title=ps.title())


def _run_allreduce(S, entries=False):
    from hopdec.modes.work import save_params
    from hopdec.runtime.summary import summary_text
    from hopdec.sim.allreduce import AllReduceSim, MathBackend

    ar, cost, ob = S.run, S.cost, S.settings.observe
    workers, n = ar.workers, ar.n
    log_dir = ob.log_dir
    header = ar.header(S.numel, S.compute.describe(), **S.header())
    logs = _Logs(log_dir, workers, lambda r: header, entries=entries)   # the gap: sim.max_gap
    factory = trainers = None
    if cost.math:
        trainers = S.trainers(workers)
        start = trainers[0].replica_state()          # rank 0's model on every replica, as under MPI (DDP)
        for r in workers[1:]:
            trainers[r].load_replica_state(start)
        factory = lambda r: MathBackend(trainers[r], r, S.compute.step)  # noqa: E731
    sim = AllReduceSim(n, ar.work.iterations, S.compute.step, network=S.link, message_bytes=S.message_bytes,
                       backend_factory=factory, on_record=logs.log)
    evals = []
    if trainers and ob.eval_interval:              # the model every worker holds, every SECONDS (virtual)
        def evaluate():
            loss, acc = trainers[0].evaluate()
            k = sim.cores[0].iteration
            evals.append(dict(time=sim.now, test_loss=loss, test_acc=acc, iter_min=k, iter_mean=k,
                              model=ar.eval_model, simulated=cost.fidelity))
        evaluate()
        sim.q.every(ob.eval_interval, evaluate)
    progress(sim, ar.work.iterations, S.settings)            # a line every few wall seconds on a long run
    t0 = time.perf_counter()
    _run_events(sim, ar.work.iterations, log_dir, logs.flush)
    wall = time.perf_counter() - t0
    logs.flush()
    avg_loss = avg_acc = None
    each = None
    if trainers:
        avg_loss, avg_acc = trainers[0].evaluate()
        k = ar.work.iterations
        evals.append(dict(time=sim.now, test_loss=avg_loss, test_acc=avg_acc, iter_min=k, iter_mean=k,
                          model=ar.eval_model, simulated=cost.fidelity, final=True))
        if log_dir:
            with writing(os.path.join(log_dir, "eval.jsonl"), "w") as f:
                f.writelines(json.dumps(e) + "\n" for e in evals)
        if n <= EVAL_EACH_UP_TO:
            each = lambda r: trainers[r].evaluate()[1]  # noqa: E731
        for r, t in trainers.items():
            if ar.saves(r):
                save_params(log_dir, r, t.write_params())
    rows, note = _condensed(_rows(logs.stats, each), bool(log_dir))
    text = summary_text(f"{cost.fidelity}: {ar.title()}", rows, sim.max_gap, S.times_line(), avg_loss=avg_loss,
                        avg_acc=avg_acc, bound=ar.bound(), model_label=ar.model_label, bound_label=ar.bound_label)
    if note:
        text += "\n" + note
    text += (f"\ntraffic: {sim.bytes / max(n * ar.work.iterations, 1):,.0f} bytes per worker and iteration (a ring "
             f"all-reduce: 2(n-1) chunks of {S.message_bytes / max(n, 1):,.0f} bytes)")
    text += "\n" + S.footer(sim, wall, "; --invariants on: the all-reduce has no protocol state to check (lockstep)"
                             if S.cost.invariants == "on" else "")
    if log_dir:
        text += f"\nlogs: {log_dir}/rank*.jsonl"
    print(text, file=S.out, flush=True)
    return dict(text=text, sim=sim, max_gap=sim.max_gap, bound=ar.bound(), avg_loss=avg_loss, avg_acc=avg_acc,
                evals=evals, wall_s=wall, events=sim.q.events, virtual_s=sim.now, rows=_rows(logs.stats),
                stats=logs.stats, header=header, title=ar.title())
