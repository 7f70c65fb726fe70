"""Time to a target accuracy: the PS synchronization models vs decentralized Hop.

    python3 experiments/ps_compare.py [--workers 8] [--compute-time 0.1] [--slow-factor 2]
                                      [--iterations 80] [--target 0.9] [--out DIR] [--only a,b]

Setting (after DSSP's heterogeneous cluster): ``--workers`` workers on the default data (digits,
cnn, the model's preset lr/momentum/batch), every iteration's compute padded to ``--compute-time``
seconds so that contention for this machine's few cores does not dominate, and one worker
(``--slow-rank``) ``--slow-factor`` times slower. Each run trains ``--iterations`` mini-batches per
worker (the same work for every mode) under ``mpirun --oversubscribe``:

* PS modes: ``hopdec train --mode ps`` with 1 server + ``--workers`` ranks; the server evaluates its
  model every ``--eval-interval`` s of wall time (``eval`` events in its ``rank0.jsonl``).
* Hop: ``hopdec train --topology topologies/ring_based_8.json`` (``--workers`` ranks). The
  decentralized engine logs no accuracy over time, so this script runs it through a small driver
  that saves each rank's flat parameters every ``--snap-every`` iterations; afterwards the average
  of all ranks' parameters at iteration k is evaluated (time: when the last rank reached k).

Times are measured from the start of training (after the start barrier; startup excluded). Prints
one table and writes it to ``DIR/table.md``.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HOP_DRIVER = r'''
import json, os, sys, time
import numpy as np
import hopdec.runtime.backend as T
snap_dir, every = sys.argv[1], int(sys.argv[2])
_orig = T.TorchBackend.compute

def compute(self, iteration):
    if iteration % every == 0:
        from mpi4py import MPI
        r = MPI.COMM_WORLD.Get_rank()
        np.save(os.path.join(snap_dir, f"snap_r{r}_i{iteration}.npy"), self.t.write_params())
        with open(os.path.join(snap_dir, f"snap_r{r}.jsonl"), "a") as f:
            f.write(json.dumps({"iter": iteration, "time": time.time()}) + "\n")
    return _orig(self, iteration)

T.TorchBackend.compute = compute
from hopdec.cli.train import main
sys.exit(main(sys.argv[3:]))
'''


def configs(args):
    ps = [
        ("BSP", ["--sync", "bsp"]),
        ("ASP", ["--sync", "asp"]),
        ("SSP s=3", ["--sync", "ssp", "--staleness", "3"]),
        ("DSSP sL=3,sU=15", ["--sync", "dssp", "--staleness-range", "3,15"]),
        ("ElasticBSP R=15", ["--sync", "elastic", "--lookahead", "15"]),
        ("backup b=1", ["--sync", "backup", "--backup-workers", "1"]),
        ("ESync", ["--sync", "esync"]),
        # the paper's rule with epsilon 0 stops a fast device before a step that would end after
        # the slowest; at an exact 2x ratio per-step overheads make that every second step
        ("ESync eps=-20ms", ["--sync", "esync", "--esync-epsilon", "-0.02"]),
    ]
    out = [(name, "ps", argv) for name, argv in ps]
    out.append((f"Hop {os.path.basename(args.topology).replace('.json', '')}", "hop",
                ["--topology", args.topology]))
    if args.only:
        keep = [k.strip().lower() for k in args.only.split(",")]
        out = [c for c in out if any(c[0].lower().startswith(k) for k in keep)]
    return out


def run_dir(out, name):
    return os.path.join(out, name.replace(" ", "_").replace("=", "").replace(",", "_"))


def run_one(name, kind, argv, args, out):
    d = run_dir(out, name)
    if args.report_only:
        if not os.path.exists(os.path.join(d, "stdout.txt")):
            return None
        res = ps_result(d) if kind == "ps" else hop_result(d, args)
        res["wall"] = float("nan")
        return res
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    common = ["--no-progress", "--threads", "1", "--seed", str(args.seed), "--iterations",
              str(args.iterations), "--compute-time", str(args.compute_time),
              "--slowdown", f"rank={args.slow_rank},factor={args.slow_factor}", "--log-dir", d]
    mpirun = [shutil.which("mpirun") or "mpirun", "--oversubscribe", "--allow-run-as-root"]
    if kind == "ps":
        cmd = mpirun + ["-n", str(args.workers + 1), sys.executable, "-m", "hopdec.cli", "train",
                        "--mode", "ps", "--eval-interval", str(args.eval_interval)] + common + argv
    else:
        driver = os.path.join(d, "hop_driver.py")
        with open(driver, "w") as f:
            f.write(HOP_DRIVER)
        cmd = mpirun + ["-n", str(args.workers), sys.executable, driver, d, str(args.snap_every)] \
            + common + argv
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    rc, stdout, stderr = bounded(cmd, env, args.timeout)
    wall = time.time() - t0
    with open(os.path.join(d, "stdout.txt"), "w") as f:
        f.write(stdout + "\n--- stderr ---\n" + stderr)
    if rc != 0:
        why = f"killed after {args.timeout:g} s (--timeout)" if rc is None else f"exit {rc}"
        print(f"  {name}: FAILED ({why}); see {d}/stdout.txt", file=sys.stderr)
        return None
    res = ps_result(d) if kind == "ps" else hop_result(d, args)
    res["wall"] = wall
    return res


def bounded(cmd, env, timeout):
    """``(exit code, stdout, stderr)`` of the mpirun job ``cmd``, run in a session of its own: past
    ``timeout`` s (exit code None) or on Ctrl-C the whole session is killed, its ranks with it."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def check_args(ap, args, chosen):
    """Refuse, in one line before any run, what no chosen run could use: a slow worker that is not a
    worker of every chosen mode (PS workers are ranks 1..W, Hop's 0..W-1), a topology file whose node
    count is not --workers. A relative --topology is the checkout's (the runs start there)."""
    kinds = {kind for _, kind, _ in chosen}
    lo, hi = (1 if "ps" in kinds else 0), (args.workers - 1 if "hop" in kinds else args.workers)
    if args.workers < 1:
        ap.error(f"--workers {args.workers}: at least 1")
    if not lo <= args.slow_rank <= hi:
        ap.error(f"--slow-rank {args.slow_rank}: the chosen runs' slow worker must be one of {lo}..{hi} with "
                 f"--workers {args.workers}" + (" (rank 0 is the parameter server)" if "ps" in kinds else ""))
    if "hop" in kinds:
        path = args.topology if os.path.exists(args.topology) else os.path.join(ROOT, args.topology)
        if os.path.isfile(path):
            from hopdec import topology as T
            try:
                nodes = T.load(path).number_of_nodes()
            except Exception as err:            # (the loader's own one-line error)
                ap.error(f"--topology {args.topology}: {err}")
            if nodes != args.workers:
                ap.error(f"--topology {args.topology} has {nodes} nodes but --workers is {args.workers}: "
                         f"give a topology of {args.workers} nodes or a generator kind (ring, ring-based, ...)")
            args.topology = os.path.abspath(path)


def _records(d, ranks):
    recs = []
    for r in ranks:
        p = os.path.join(d, f"rank{r}.jsonl")
        if os.path.exists(p):
            with open(p) as f:
                recs += [x for x in map(json.loads, f) if "iter" in x]
    return recs


def ps_result(d):
    with open(os.path.join(d, "rank0.jsonl")) as f:
        ev = [json.loads(line) for line in f][1:]
    evals = [(e["elapsed"], e["test_acc"]) for e in ev if e["event"] == "eval"]
    summary = [e for e in ev if e["event"] == "summary"][0]
    return dict(curve=evals, final_acc=summary["test_acc"], train_time=summary["elapsed"],
                updates=summary["version"], dropped=summary["dropped"])


def hop_result(d, args):
    import torch

    from hopdec.cli.train import parse
    from hopdec.modes.work import resolve

    torch.set_num_threads(1)
    recs = _records(d, range(args.workers))
    start = min(x["time"] for x in recs)
    end = max(x["time"] for x in recs)
    snaps = {}
    for r in range(args.workers):
        with open(os.path.join(d, f"snap_r{r}.jsonl")) as f:
            for x in map(json.loads, f):
                snaps.setdefault(x["iter"], {})[r] = x["time"]
    t = resolve(parse(["--seed", str(args.seed)]).work, args.workers).trainer(0, args.workers)
    curve = []
    for it in sorted(snaps):
        if len(snaps[it]) < args.workers:
            continue
        avg = np.mean([np.load(os.path.join(d, f"snap_r{r}_i{it}.npy")) for r in range(args.workers)], axis=0)
        curve.append((max(snaps[it].values()) - start, t.evaluate(avg)[1]))
    final_acc = None
    with open(os.path.join(d, "stdout.txt")) as f:
        for line in f:
            if line.startswith("averaged model:"):
                final_acc = float(line.rsplit(" ", 1)[1])
    if final_acc is not None:
        curve.append((end - start, final_acc))
    return dict(curve=curve, final_acc=final_acc, train_time=end - start, updates=None, dropped=None)


def time_to(curve, target):
    for t, acc in curve:
        if acc >= target:
            return t
    return None


def time_to_range(curve, target):
    """(evaluation before, first evaluation at or above ``target``): when the model crossed it."""
    from repro_common import time_to_range as ranged
    return ranged({"evals": [(t, acc) for t, acc in curve]}, target)


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--compute-time", type=float, default=0.1)
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--slow-rank", type=int, default=3, help="the slow worker (worker index / Hop rank)")
    ap.add_argument("--iterations", type=int, default=80, help="mini-batches per worker")
    ap.add_argument("--target", default="0.8,0.9", help="target test accuracies (comma-separated)")
    ap.add_argument("--eval-interval", type=float, default=0.5)
    ap.add_argument("--snap-every", type=int, default=4)
    ap.add_argument("--topology", default="topologies/ring_based_8.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="comma-separated name prefixes, e.g. bsp,esync")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="/tmp/hopdec_ps_compare")
    ap.add_argument("--report-only", action="store_true", help="rebuild the table from the logs in --out")
    args = ap.parse_args(argv)
    targets = [float(x) for x in str(args.target).split(",")]
    chosen = configs(args)
    if not args.report_only:
        check_args(ap, args, chosen)
    os.makedirs(args.out, exist_ok=True)
    print(f"{args.workers} workers, digits/cnn presets, compute padded to {args.compute_time} s/iter, "
          f"worker {args.slow_rank} {args.slow_factor:g}x slower, {args.iterations} mini-batches per "
          f"worker, target test accuracies {targets}", flush=True)
    results = []
    for name, kind, argv in chosen:
        res = run_one(name, kind, argv, args, args.out)
        results.append((name, res))
        if res:
            print(f"  {name}: time to {targets[-1]}: {fmt(time_to(res['curve'], targets[-1]))} s, "
                  f"final acc {fmt(res['final_acc'], '{:.3f}')}, train {res['train_time']:.1f} s "
                  f"(mpirun {res['wall']:.0f} s)", flush=True)
    from repro_common import range_ratio
    ranges = {(n, tg): time_to_range(r["curve"], tg) for n, r in results if r for tg in targets}
    bases = [ranges.get(("BSP", tg)) for tg in targets]
    head = ["mode"]
    for tg in targets:
        head += [f"time to acc {tg} (s)", "vs BSP"]
    head += ["final acc", "train time (s)", "server updates", "dropped"]
    rows = []
    for name, r in results:
        if r is None:
            rows.append([name, "failed"] + ["-"] * (len(head) - 2))
            continue
        row = [name]
        for tg, base in zip(targets, bases):
            t = time_to(r["curve"], tg)
            row += [fmt(t), range_ratio(base, ranges[name, tg]) if t is not None else "-"]
        row += [fmt(r["final_acc"], "{:.3f}"), fmt(r["train_time"]),
                "-" if r["updates"] is None else str(r["updates"]),
                "-" if r["dropped"] is None else str(r["dropped"])]
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    failed = [name for name, r in results if r is None]
    if failed:
        why = "have no logs there" if args.report_only else "failed: their stdout.txt there say why"
        print(f"ps_compare: {len(failed)} of {len(results)} runs failed ({', '.join(failed)}) -- in {args.out}, "
              f"they {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
