"""Loss against wall-clock time and against iterations from hopdec run logs (the shape of Hop Figs. 14, 15, 19).

    python3 experiments/plot_logs.py RUNDIR [RUNDIR...] -o out.png [--smooth 10] [--labels a,b,...]

Each RUNDIR holds ``rank{r}.jsonl`` (``hopdec train --log-dir RUNDIR``). For each run: training loss
averaged over workers, smoothed with a moving average of ``--smooth`` points,
* left: against wall-clock seconds since the run started (earliest first record over workers); the
  records of all workers are merged in time order and the curve is the running mean of each worker's
  latest loss, so a slow worker weighs as much as a fast one;
* right: against the iteration number (mean over the workers that ran that iteration; a worker that
  jumped over an iteration does not count there).
"""

import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hopdec.runtime.metrics import read_log  # noqa: E402


def smooth(y, k):
    y = np.asarray(y, dtype=float)
    if k <= 1 or len(y) < 2:
        return y
    k = min(k, len(y))
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    for i in range(len(y)):                       # trailing window, shorter at the start
        lo = max(0, i - k + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def load_run(run_dir):
    """[(records of one rank)] with a loss, and the run header of rank 0 (or {})."""
    paths = sorted(glob.glob(os.path.join(run_dir, "rank*.jsonl")),
                   key=lambda p: int(os.path.basename(p)[4:-6]))
    if not paths:
        raise SystemExit(f"plot_logs: no rank*.jsonl in {run_dir}")
    header = {}
    with open(paths[0]) as f:
        first = json.loads(f.readline() or "{}")
        header = first.get("run", {})
    logs = [[r for r in read_log(p) if r.get("loss") is not None] for p in paths]
    return [recs for recs in logs if recs], header


def loss_vs_time(logs):
    t0 = min(recs[0]["time"] for recs in logs)
    events = sorted((r["time"], w, r["loss"]) for w, recs in enumerate(logs) for r in recs)
    latest, ts, ys = {}, [], []
    for t, w, loss in events:
        latest[w] = loss
        ts.append(t - t0)
        ys.append(float(np.mean(list(latest.values()))))
    return np.array(ts), np.array(ys)


def loss_vs_iter(logs):
    by_iter = {}
    for recs in logs:
        for r in recs:
            by_iter.setdefault(r["iter"], []).append(r["loss"])
    its = sorted(by_iter)
    return np.array(its), np.array([np.mean(by_iter[k]) for k in its])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUNDIR")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--smooth", type=int, default=10, help="moving-average window (points)")
    p.add_argument("--labels", default=None, help="comma-separated labels (default: folder names)")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r))
                                                         for r in args.runs]
    if len(labels) != len(args.runs):
        raise SystemExit("plot_logs: --labels needs one label per RUNDIR")
    fig, (ax_t, ax_k) = plt.subplots(1, 2, figsize=(12, 4.5))
    for run, label in zip(args.runs, labels):
        logs, header = load_run(run)
        n = len(logs)
        t, y = loss_vs_time(logs)
        # the time curve has one point per record of any worker: scale the window by the worker count
        ax_t.plot(t, smooth(y, args.smooth * n), label=label)
        k, yk = loss_vs_iter(logs)
        ax_k.plot(k, smooth(yk, args.smooth), label=label)
    ax_t.set_xlabel("wall-clock time (s)")
    ax_k.set_xlabel("iteration")
    for ax in (ax_t, ax_k):
        ax.set_ylabel("training loss (mean over workers, smoothed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
