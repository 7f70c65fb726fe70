"""``hopdec sim``: build a simulation from the command-line options, run it, write the logs, print the summary.

The options are ``hopdec train``'s (:func:`hopdec.cli.train.add_run_arguments`) plus the cost model
(:mod:`hopdec.sim.costs`, :mod:`hopdec.sim.network`). The same checks run as in a real run (the
protocol settings through :func:`hopdec.runtime.decentralized.prepare`, the sync model through
:func:`hopdec.ps.options.check_args`), the same cores run (:mod:`hopdec.sim.hop`, :mod:`hopdec.sim.ps`),
and the same logs and summary come out, with virtual times and a label saying which fidelity made them:
``SIMULATED (timing only)`` or ``SIMULATED (--math)``.
"""

import json
import math
import os
import sys
import time

from hopdec.errors import ConfigError
from hopdec.sim.costs import ComputeModel, check_seconds, parse_bandwidth, per_rank
from hopdec.sim.network import LinkModel

MIB = 2 ** 20
"""``--message-mb`` counts MiB (VGG-16's 138M float32 parameters are the papers' "528 MB")."""
DEFAULT_BANDWIDTH_GBPS = 10.0
DEFAULT_LATENCY_S = 5e-5
CHECK_UP_TO = 16          # --invariants auto: checked at every event up to this many workers (O(n^2) each:
                          # ~10x the simulation itself at 64 workers)
TABLE_UP_TO = 32          # one summary row per worker up to this many, else mean / slowest / fastest
BOUND_UP_TO = 2048        # Table 1's bound needs all-pairs path lengths (n x n)
EVAL_EACH_UP_TO = 64      # --math: each worker's own test accuracy in the table up to this many
INPUTS = {"digits": ((1, 8, 8), 10), "cifar10": ((3, 32, 32), 10)}
"""Input shape and classes of the datasets whose model size is known without reading them."""


def fidelity(args):
    return "SIMULATED (--math)" if args.math else "SIMULATED (timing only)"


# ---- what a simulation is made of ----------------------------------------------------------------
def _workers_and_graph(args):
    """(worker ranks, graph or None, policy or None) with every check a real run makes."""
    from hopdec.cli.train import resolve_topology
    n = args.workers
    if n is not None and n < 1:
        raise ConfigError(f"-n {n}: must be >= 1")
    if n is not None:
        from hopdec.limits import check_workers
        check_workers(n, f"-n {n}")
    if args.mode == "ps":
        if n is None:
            raise ConfigError("--mode ps: give the number of workers with -n (the server is rank 0, the "
                              "workers ranks 1..n)")
        from hopdec.ps.options import check_args
        policy = check_args(args, n + 1)
        return tuple(policy.workers), None, policy
    spec = args.topology
    if spec is None or (not os.path.exists(spec) and _is_generator(spec)):
        if n is None:
            raise ConfigError("give the number of workers with -n (or a topology file)")
        graph = resolve_topology(spec, n)
    else:
        graph = resolve_topology(spec, 0)                 # a file (a missing one: its own error)
        if n is not None and graph.number_of_nodes() != n:
            raise ConfigError(f"{spec}: has {graph.number_of_nodes()} workers but -n is {n}")
    return tuple(range(graph.number_of_nodes())), graph, None


def _is_generator(spec):
    from hopdec import topology as T
    return spec in T.GENERATORS


def _model(args):
    from hopdec.ml.models import PRESETS, default_model_for
    name = args.model or default_model_for(args.dataset)
    hp = dict(PRESETS[name])
    for key in ("lr", "momentum", "weight_decay", "batch_size"):
        if getattr(args, key) is not None:
            hp[key] = getattr(args, key)
    return name, hp


def _dataset(args):
    from hopdec.ml.data import load_dataset
    return load_dataset(args.dataset, data_dir=args.data_dir, path=args.data_path, test_path=args.test_path,
                        seed=args.seed)


def model_numel(name, args, dataset=None):
    """Trainable parameters of the model, counted on torch's meta device (no memory, no training)."""
    from hopdec.ml.models import parameter_count
    if dataset is not None:
        shape, classes = dataset.input_shape, dataset.num_classes
    elif args.dataset in INPUTS:
        shape, classes = INPUTS[args.dataset]
    else:
        d = _dataset(args)
        shape, classes = d.input_shape, d.num_classes
    return parameter_count(name, shape, classes, norm=args.norm)


def _number_attr(value, what, positive=True):
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a number") from None
    if math.isnan(x) or x < 0 or (positive and x == 0) or (math.isinf(x) and not positive):
        raise ConfigError(f"{what}: must be {'> 0' if positive else 'a finite number >= 0'}, got {value!r}")
    return x


def link_model(args, nodes, graph=None):
    """The network: ``--bandwidth [WHO@]GBPS`` (repeatable), ``--latency``, ``--nic-duplex``, and the
    topology's ``bandwidth`` (Gb/s) node attributes and ``bandwidth``/``latency`` edge attributes."""
    latency = check_seconds(args.latency, "--latency")
    specs = list(args.bandwidth or [])
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
    per = per_rank("--bandwidth", [s for s in specs if "@" in str(s)], range(nodes), parse_bandwidth, None)
    node_bw.update({r: v for r, v in per.items() if v is not None})
    node_bw = {r: v for r, v in node_bw.items() if v != base}
    links = {}
    if graph is not None:
        for u, v, d in graph.edges(data=True):
            if u == v or not ({"bandwidth", "latency"} & set(d)):
                continue
            bw = d.get("bandwidth")
            lat = d.get("latency")
            links[(int(u), int(v))] = (
                None if bw is None else _number_attr(bw, f"{src}: edge {u}->{v} bandwidth") * 1e9 / 8,
                None if lat is None else _number_attr(lat, f"{src}: edge {u}->{v} latency", positive=False))
    return LinkModel(bandwidth=base, latency=latency, node_bandwidth=node_bw, links=links,
                     duplex=args.nic_duplex)


class _Logs:
    """Per-rank JSONL logs without one open file per rank (10,000 workers would exhaust file handles):
    lines are buffered and appended in batches. Each rank also gets a :class:`RankLogger` without a file
    for the summary's figures."""

    FLUSH_LINES = 200_000

    def __init__(self, log_dir, ranks, header):
        from hopdec.runtime.metrics import RankLogger
        self.dir = log_dir
        self.stats = {r: RankLogger(None, r) for r in ranks}
        self._lines = {r: [] for r in ranks}
        self._count = 0
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            for r in ranks:
                with open(self._path(r), "w") as f:
                    f.write(json.dumps({"rank": r, "run": header}) + "\n")

    def _path(self, r):
        return os.path.join(self.dir, f"rank{r}.jsonl")

    def log(self, rank, rec):
        self.stats[rank].log(rec)
        if self.dir:
            self._lines[rank].append(json.dumps(rec))
            self._count += 1
            if self._count >= self.FLUSH_LINES:
                self.flush()

    def flush(self):
        if not self.dir:
            return
        for r, lines in self._lines.items():
            if lines:
                with open(self._path(r), "a") as f:
                    f.write("\n".join(lines) + "\n")
                lines.clear()
        self._count = 0


def largest_gap(entries):
    """The largest Iter(i) - Iter(j) over all pairs (:func:`hopdec.runtime.metrics.gap_sweep`)."""
    from hopdec.runtime.metrics import gap_sweep
    return max((g for _, g in gap_sweep(entries)), default=0)


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
def simulate(args, out=sys.stdout):
    """Run ``hopdec sim`` for parsed ``args``; print the summary to ``out`` and return the figures."""
    from hopdec.cli.options import check_numbers
    from hopdec.cli.train import resolve_mode
    resolve_mode(args)                                  # --sync implies --mode ps
    check_numbers(args)                                 # the same ranges as hopdec train
    if args.save_models and not args.log_dir:
        raise ConfigError("--save-models needs --log-dir")
    if args.save_models and not args.math:
        raise ConfigError("--save-models needs --math (timing only has no parameters)")
    if args.log_dir:                                    # a file there, no permission: one line, first
        from hopdec.runtime.metrics import check_log_dir
        check_log_dir(args.log_dir, 0)
    if args.message_mb is not None and not (args.message_mb >= 0 and math.isfinite(args.message_mb)):
        raise ConfigError(f"--message-mb {args.message_mb}: must be a finite number >= 0")
    if args.invariants not in ("auto", "on", "off"):
        raise ConfigError(f"--invariants {args.invariants!r}: expected auto, on or off")
    workers, graph, policy = _workers_and_graph(args)
    if graph is not None:
        from hopdec.runtime.decentralized import prepare
        prepare(args, graph, args.iterations or 1)        # the protocol checks, before anything is loaded
    nodes = len(workers) + (1 if policy is not None else 0)
    compute = ComputeModel(args.sim_compute_time, workers, seed=args.seed, slowdowns=args.slowdown)
    link = link_model(args, nodes, graph)
    eval_interval = float(getattr(args, "eval_interval", 0.0) or 0.0)
    if not (eval_interval >= 0 and math.isfinite(eval_interval)):
        raise ConfigError(f"--eval-interval must be a finite number of seconds >= 0, got {eval_interval}")
    if eval_interval and not args.math:
        raise ConfigError("--eval-interval needs --math (timing only has no model to evaluate)")
    model_name, hparams = _model(args)
    dataset = None
    if args.math or args.epochs is not None or (args.message_mb is None and args.dataset not in INPUTS):
        dataset = _dataset(args)
    if args.epochs is not None:
        from hopdec.ml.data import steps_per_epoch
        shard = len(dataset.train_y) // len(workers)
        iterations = max(1, int(round(args.epochs * steps_per_epoch(shard, hparams["batch_size"]))))
    else:
        iterations = args.iterations or 200
    numel = model_numel(model_name, args, dataset) if (args.math or args.message_mb is None) else None
    message_bytes = args.message_mb * MIB if args.message_mb is not None else 4 * numel
    check = args.invariants == "on" or (args.invariants == "auto" and len(workers) <= CHECK_UP_TO)
    cost = dict(fidelity=fidelity(args), time_unit="virtual seconds", **compute.as_dict(),
                message_mb=message_bytes / MIB,
                message_size="--message-mb" if args.message_mb is not None else f"{model_name}: {numel} "
                                                                                  f"parameters x 4 bytes",
                network=link.as_dict(), invariants_checked=check)
    ctx = dict(args=args, workers=workers, compute=compute, link=link, message_bytes=message_bytes,
               model_name=model_name, hparams=hparams, dataset=dataset, iterations=iterations, numel=numel,
               check=check, cost=cost, eval_interval=eval_interval, out=out)
    if args.math:
        import torch
        torch.set_num_threads(args.threads or 1)
    if policy is not None:
        return _run_ps(ctx, policy)
    return _run_hop(ctx, graph)


def _trainers(ctx, parts):
    """One real trainer per worker (``parts``: its shard index), exactly as a real run makes them."""
    import torch

    from hopdec.runtime.context import RunContext
    rc = RunContext(args=ctx["args"], comm=None, dataset=ctx["dataset"], model_name=ctx["model_name"],
                    hparams=ctx["hparams"], iterations=ctx["iterations"], device=torch.device("cpu"))
    return {w: rc.make_trainer(p, len(parts)) for w, p in parts.items()}, rc


def _times_line(ctx):
    mb = ctx["message_bytes"] / MIB
    return (f"{fidelity(ctx['args'])} -- virtual seconds; {ctx['compute'].describe()}; messages of "
            f"{mb:.4g} MB ({ctx['cost']['message_size']}); {ctx['link'].describe()}; sends, Reduce and "
            f"Apply take no time")


def _footer(ctx, sim, wall, extra=""):
    net = sim.net
    ev = sim.q.events
    return (f"simulated {sim.q.now:.6g} virtual s in {wall:.3g} s of wall time: {ev} events "
            f"({ev / max(wall, 1e-9):,.0f}/s; {net.transfers} data messages, {net.controls} control "
            f"messages){extra}")


def _run_hop(ctx, graph):
    import numpy as np

    from hopdec.hop.config import describe, gap_bound, setting_name
    from hopdec.runtime.decentralized import prepare
    from hopdec.runtime.report import summary_text
    from hopdec.sim.backends import MathBackend
    from hopdec.sim.hop import HopSim

    args, workers, n = ctx["args"], ctx["workers"], len(ctx["workers"])
    cfg, views = prepare(args, graph, ctx["iterations"])
    bound = gap_bound(graph, cfg) if n <= BOUND_UP_TO else None
    header = dict(mode="decentralized", simulated=fidelity(args), topology=graph.graph.get("source"),
                  protocol=cfg.protocol, setting=setting_name(cfg), max_ig=cfg.max_ig, staleness=cfg.staleness,
                  backup_workers=cfg.backup_workers, skip=args.skip, compute_graph=cfg.compute_graph,
                  iterations=cfg.iterations, model=ctx["model_name"], params=ctx["numel"],
                  hparams=ctx["hparams"], device="simulated", emulation=ctx["compute"].describe(),
                  cost_model=ctx["cost"], gap_bound=bound, seed=args.seed)
    logs = _Logs(args.log_dir, workers, header)
    factory, trainers = None, None
    if args.math:
        trainers, _ = _trainers(ctx, {w: w for w in workers})
        factory = lambda r: MathBackend(trainers[r], r, ctx["compute"].step)  # noqa: E731
    inv = None
    if ctx["check"]:
        from hopdec.hop.invariants import Invariants
        inv = Invariants(graph, cfg)
    sim = HopSim(views, cfg, ctx["compute"].step, network=ctx["link"], message_bytes=ctx["message_bytes"],
                 backend_factory=factory, on_record=logs.log,
                 check=(lambda s: inv.check(s.cores, s.in_flight, s.sent_to)) if inv else None)
    evals = []
    if trainers and ctx["eval_interval"]:
        def evaluate():
            avg = np.mean([t.write_params() for t in trainers.values()], axis=0)
            loss, acc = trainers[workers[0]].evaluate(avg)
            its = [c.iteration for c in sim.cores]
            evals.append(dict(time=sim.now, test_loss=loss, test_acc=acc, iter_min=min(its),
                              iter_mean=sum(its) / n, model="average of every worker's parameters",
                              simulated=fidelity(args)))
        evaluate()
        sim.q.every(ctx["eval_interval"], evaluate)
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    logs.flush()
    avg_loss = avg_acc = None
    each = None
    if trainers:
        avg = np.mean([t.write_params() for t in trainers.values()], axis=0)
        avg_loss, avg_acc = trainers[workers[0]].evaluate(avg)
        evals.append(dict(time=sim.now, test_loss=avg_loss, test_acc=avg_acc, iter_min=cfg.iterations - 1,
                          iter_mean=cfg.iterations - 1, model="average of every worker's parameters",
                          simulated=fidelity(args), final=True))
        if n <= EVAL_EACH_UP_TO:
            each = lambda r: trainers[r].evaluate()[1]  # noqa: E731
        if args.save_models and args.log_dir:
            for r, t in trainers.items():
                np.save(os.path.join(args.log_dir, f"params_rank{r}.npy"), t.write_params())
    if args.log_dir and evals:
        with open(os.path.join(args.log_dir, "eval.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in evals)
    rows, note = _condensed(_rows(logs.stats, each), bool(args.log_dir))
    title = (f"{fidelity(args)}: decentralized {describe(cfg)} on {graph.graph.get('source')} ({n} workers, "
             f"protocol {cfg.protocol}, max_ig {cfg.max_ig})")
    text = summary_text(title, rows, sim.max_gap, _times_line(ctx), avg_loss=avg_loss, avg_acc=avg_acc,
                        bound=bound if bound is not None else None)
    if bound is None:
        text += f"\n(Table 1's gap bound is not computed above {BOUND_UP_TO} workers: it needs all-pairs paths)"
    if note:
        text += "\n" + note
    checked = (f"; Hop invariants (Theorem 2, queue capacity, Table 1 gaps, no update lost) held at all "
               f"{inv.checks} events" if inv else "; Hop invariants not checked (" + (
                   f"--invariants auto checks up to {CHECK_UP_TO} workers; --invariants on forces it)"
                   if args.invariants == "auto" else "--invariants off)"))
    text += "\n" + _footer(ctx, sim, wall, checked)
    if args.log_dir:
        text += f"\nlogs: {args.log_dir}/rank*.jsonl" + (" and eval.jsonl" if evals else "")
    print(text, file=ctx["out"], flush=True)
    return dict(text=text, sim=sim, max_gap=sim.max_gap, bound=bound, avg_loss=avg_loss, avg_acc=avg_acc,
                evals=evals, wall_s=wall, events=sim.q.events, virtual_s=sim.now, rows=_rows(logs.stats),
                stats=logs.stats, checks=inv.checks if inv else 0)


def _run_ps(ctx, policy):
    from hopdec.ps.mpi import ServerModel, _EventLog
    from hopdec.runtime.report import summary_text
    from hopdec.sim.backends import PSMathBackend
    from hopdec.sim.ps import PSSim

    args, workers, n = ctx["args"], ctx["workers"], len(ctx["workers"])
    budget = ctx["iterations"] * n
    settings = policy.settings()
    common = dict(mode="ps", simulated=fidelity(args), sync=policy.sync, workers=n,
                  iterations=ctx["iterations"], model=ctx["model_name"], params=ctx["numel"],
                  hparams=ctx["hparams"], device="simulated", seed=args.seed, settings=settings,
                  gap_bound=policy.gap_bound(), cost_model=ctx["cost"])
    events = _EventLog(args.log_dir, dict(common, worker_ranks=list(workers), budget=budget))
    logs = _Logs(args.log_dir, workers, dict(common, emulation=ctx["compute"].describe()))
    factory = server_model = trainers = server_trainer = None
    if args.math:
        trainers, rc = _trainers(ctx, {w: i for i, w in enumerate(workers)})
        server_trainer = rc.make_trainer(0, n)
        server_model = ServerModel(server_trainer)
        factory = lambda w: PSMathBackend(trainers[w], w, ctx["compute"].step)  # noqa: E731
    bound = policy.gap_bound()
    check = None
    if ctx["check"] and bound is not None:
        def check(sim):
            low = policy.slowest_pushes()
            for w in workers:
                if sim.running(w) and policy.pushes[w] - low > bound:
                    raise AssertionError(f"--sync {policy.sync}: worker {w} runs {policy.pushes[w] - low} "
                                         f"pushes ahead of the slowest, bound {bound}")
    sim = PSSim(policy, ctx["compute"].step, budget=budget, network=ctx["link"],
                message_bytes=ctx["message_bytes"], backend_factory=factory, server_model=server_model,
                numel=ctx["numel"], on_record=logs.log, on_event=events, check=check)
    evals = []

    def evaluate():
        loss, acc = server_trainer.evaluate()
        rec = dict(time=sim.now, elapsed=sim.now, version=policy.version, work=sim.server.work,
                   test_loss=loss, test_acc=acc)
        evals.append(rec)
        events("eval", **rec)
    if server_trainer is not None and ctx["eval_interval"]:
        evaluate()
        sim.q.every(ctx["eval_interval"], evaluate)
    t0 = time.perf_counter()
    sim.run()
    wall = time.perf_counter() - t0
    logs.flush()
    if not all(sim.done.values()):
        from hopdec.sim.hop import Deadlock
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
        if args.save_models and args.log_dir:
            import numpy as np
            np.save(os.path.join(args.log_dir, "params_rank0.npy"), server_trainer.write_params())
            for w, t in trainers.items():
                np.save(os.path.join(args.log_dir, f"params_rank{w}.npy"), t.write_params())
    events("summary", elapsed=elapsed, version=policy.version, applied=sim.server.applied,
           dropped=sim.server.dropped, work=sim.server.work, test_loss=avg_loss, test_acc=avg_acc)
    events.close()
    gap = largest_gap([s.entries for s in logs.stats.values()])
    rows, note = _condensed(_rows(logs.stats, each), bool(args.log_dir))
    title = f"{fidelity(args)}: parameter server {policy.describe()} (1 server + {n} workers)"
    text = summary_text(title, rows, gap, _times_line(ctx), avg_loss=avg_loss, avg_acc=avg_acc, bound=bound,
                        model_label="server model", bound_label=f"bound of --sync {policy.sync}")
    if note:
        text += "\n" + note
    text += (f"\nserver: {policy.version} updates, {sim.server.dropped} gradients dropped, {elapsed:.6g} "
             f"virtual s")
    checked = ("" if check is None else f"; the sync model's gap bound held at all {sim.q.events} events")
    text += "\n" + _footer(ctx, sim, wall, checked)
    if args.log_dir:
        text += f"\nlogs: {args.log_dir}/rank*.jsonl"
    print(text, file=ctx["out"], flush=True)
    return dict(text=text, sim=sim, max_gap=gap, bound=bound, avg_loss=avg_loss, avg_acc=avg_acc,
                evals=evals, wall_s=wall, events=sim.q.events, virtual_s=elapsed, rows=_rows(logs.stats),
                stats=logs.stats, policy=policy)
