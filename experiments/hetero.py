"""Hop sec. 7.3 on 16 workers: backup workers, staleness and iteration skipping under emulated slowdowns.

    python3 experiments/hetero.py [--runs /tmp/hetero_runs] [--compute-time 0.15] [--only a|b]

Runs every configuration as its own ``mpirun -n 16 --oversubscribe hopdec train ... --log-dir``, one
after the other (never two at once), then reads the JSONL logs (:func:`hopdec.runtime.metrics.read_log`) and
prints two tables:

(a) random slowdown (``--slowdown random:factor=6,prob=1/n``, Hop Figs. 14-17) on ring_based_16 and
    double_ring_16: standard vs ``--backup-workers 1`` vs ``--staleness 5`` vs hybrid (both), all with
    ``--max-ig 4``; iterations/s and speed-up over standard.
(b) one deterministic 4x straggler (``--slowdown rank=0,factor=4``, Hop Figs. 18-19) on ring_based_16:
    mean iteration duration relative to the same graph without slowdown, for standard, backup 1, and
    backup 1 with ``--skip max-jump=2,trigger=2`` and ``--skip max-jump=10,trigger=2``, all with
    ``--max-ig 10`` (a straggler can only jump as far as its out-neighbours are ahead, which the token
    queues cap at max_ig: with max_ig 4, max-jump 10 would act as max-jump 4).

Measures (per worker, on records from iteration ``--skip-first`` on, to skip the start-up transient):
iterations/s = (last iter - first iter) / (last time - first time), median over workers; mean iteration
duration = the inverse per worker, mean over workers. ``overruns`` counts iterations where the real
compute exceeded ``--compute-time`` (from the run summary): it should be near 0, else the table measures
CPU contention of 16 ranks on few cores rather than the protocol.

The compute is emulated: ``--model mlp`` on digits (cheap real compute, ~1 ms) padded by sleeping to
``--compute-time`` seconds per iteration, slowed down as above. The run folders can be plotted with
``hopdec plot``.
"""

import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import time

from hopdec.runtime.metrics import read_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANDOM = "random:factor=6,prob=1/n"
STRAGGLER = "rank=0,factor=4"


def configs(only):
    """(part, name, topology, extra args) of every run."""
    runs = []
    if only in (None, "a"):
        for topo in ("ring_based_16", "double_ring_16"):
            for name, extra in (("standard", []), ("backup1", ["--backup-workers", "1"]),
                                ("staleness5", ["--staleness", "5"]),
                                ("hybrid", ["--backup-workers", "1", "--staleness", "5"])):
                runs.append(("a", name, topo, ["--max-ig", "4", "--slowdown", RANDOM] + extra))
    if only in (None, "b"):
        topo = "ring_based_16"
        b = ["--max-ig", "10"]
        runs += [("b", "no-slowdown", topo, b),
                 ("b", "standard", topo, b + ["--slowdown", STRAGGLER]),
                 ("b", "backup1", topo, b + ["--slowdown", STRAGGLER, "--backup-workers", "1"]),
                 ("b", "backup1+skip2", topo, b + ["--slowdown", STRAGGLER, "--backup-workers", "1",
                                                   "--skip", "max-jump=2,trigger=2"]),
                 ("b", "backup1+skip10", topo, b + ["--slowdown", STRAGGLER, "--backup-workers", "1",
                                                    "--skip", "max-jump=10,trigger=2"])]
    return runs


def run_one(part, name, topo, extra, args):
    out = os.path.join(args.runs, f"{part}_{topo}_{name}")
    cmd = ["mpirun", "-n", "16", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    iters = args.iters_a if part == "a" else args.iters_b
    cmd += [sys.executable, "-m", "hopdec.cli", "train", "--no-progress", "--threads", "1",
            "--topology", os.path.join(ROOT, "topologies", f"{topo}.json"), "--model", args.model,
            "--iterations", str(iters), "--compute-time", str(args.compute_time),
            "--seed", str(args.seed), "--log-dir", out] + extra
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    with open(os.path.join(args.runs, f"{part}_{topo}_{name}.out"), "w") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(f"FAILED ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return out, proc.stdout, time.time() - t0


def measure(log_dir, summary, skip_first):
    logs = [read_log(p) for p in sorted(glob.glob(os.path.join(log_dir, "rank*.jsonl")))]
    rates, durs = [], []
    for recs in logs:
        recs = [r for r in recs if r["iter"] >= skip_first] or recs
        di, dt = recs[-1]["iter"] - recs[0]["iter"], recs[-1]["time"] - recs[0]["time"]
        if di > 0 and dt > 0:
            rates.append(di / dt)
            durs.append(dt / di)
    overruns = sum(int(m) for m in re.findall(r"exceeded it in (\d+) iterations", summary))
    total = sum(len(r) for r in logs)
    jumps = sum(1 for recs in logs for r in recs if "jumped_from" in r)
    acc = re.search(r"test accuracy ([0-9.]+)", summary)
    return dict(rate=statistics.median(rates), dur=statistics.mean(durs), overruns=overruns,
                total=total, jumps=jumps, acc=float(acc.group(1)) if acc else None,
                slow_rate=min(rates))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="/tmp/hetero_runs", help="folder for the run logs")
    p.add_argument("--compute-time", type=float, default=0.15)
    p.add_argument("--model", default="mlp")
    p.add_argument("--iters-a", type=int, default=80)
    p.add_argument("--iters-b", type=int, default=60)
    p.add_argument("--skip-first", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=["a", "b"], default=None)
    p.add_argument("--filter", default=None, help="only runs whose part_topology_setting contains this")
    p.add_argument("--report-only", action="store_true", help="only read existing logs in --runs")
    args = p.parse_args()
    os.makedirs(args.runs, exist_ok=True)
    results = {}
    t_all = time.time()
    for part, name, topo, extra in configs(args.only):
        key = (part, topo, name)
        if args.filter and args.filter not in f"{part}_{topo}_{name}":
            continue
        out = os.path.join(args.runs, f"{part}_{topo}_{name}")
        if args.report_only:
            try:
                with open(out + ".out") as f:
                    summary = f.read()
            except OSError:
                continue
            results[key] = measure(out, summary, args.skip_first)
            continue
        r = run_one(part, name, topo, extra, args)
        if r is None:
            continue
        results[key] = m = measure(r[0], r[1], args.skip_first)
        print(f"  {part} {topo:<15} {name:<15} {m['rate']:6.2f} it/s  (run {r[2]:.0f} s, "
              f"overruns {m['overruns']}/{m['total']})", flush=True)

    print(f"\nHop sec. 7.3 emulation: 16 ranks, model {args.model}, compute padded to "
          f"{args.compute_time:g} s/iter; figures from iteration {args.skip_first} on; "
          f"total {time.time() - t_all:.0f} s; logs in {args.runs}")
    a = [(k, v) for k, v in results.items() if k[0] == "a"]
    if a:
        print(f"\n(a) random slowdown {RANDOM}, --max-ig 4, {args.iters_a} iterations")
        print(f"{'topology':<15} {'setting':<12} {'iter/s':>7} {'speed-up':>8} {'slowest':>8} "
              f"{'overruns':>9} {'test acc':>8}")
        for (_, topo, name), m in a:
            base = results.get(("a", topo, "standard"))
            sp = m["rate"] / base["rate"] if base else float("nan")
            print(f"{topo:<15} {name:<12} {m['rate']:>7.2f} {sp:>7.2f}x {m['slow_rate']:>8.2f} "
                  f"{m['overruns']:>4}/{m['total']:<4} {m['acc'] if m['acc'] is not None else '-':>8}")
    b = [(k, v) for k, v in results.items() if k[0] == "b"]
    if b:
        base = results.get(("b", "ring_based_16", "no-slowdown"))
        print(f"\n(b) deterministic straggler {STRAGGLER}, ring_based_16, --max-ig 10, "
              f"{args.iters_b} iterations")
        print(f"{'setting':<15} {'mean iter s':>11} {'vs no slowdown':>14} {'iter/s':>7} {'jumps':>5} "
              f"{'overruns':>9} {'test acc':>8}")
        for (_, topo, name), m in b:
            rel = m["dur"] / base["dur"] if base else float("nan")
            print(f"{name:<15} {m['dur']:>11.3f} {rel:>13.2f}x {m['rate']:>7.2f} {m['jumps']:>5} "
                  f"{m['overruns']:>4}/{m['total']:<4} {m['acc'] if m['acc'] is not None else '-':>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
