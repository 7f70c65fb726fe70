"""What watching a run costs: iterations/s with and without live progress and consensus distance.

    python3 experiments/bench_observe.py [--ranks 4] [--iterations 150] [--repeats 2]

Runs the same short decentralized training under mpirun with observers off, with live progress, with
progress + consensus distance every 10 iterations, and every iteration (the worst case: a reduction of
all parameters per iteration). Prints each setting's mean iterations/s per worker and the time the
observer hooks took on the workers' own path, as every run logs it (``observer`` events).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {
    "nothing": ["--no-progress"],
    "progress": ["--progress-interval", "1"],
    "progress + consensus K=10": ["--progress-interval", "1", "--consensus-every", "10"],
    "progress + consensus K=1": ["--progress-interval", "1", "--consensus-every", "1"],
}


def run(ranks, iterations, extra, log_dir, compute_time):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(ranks), sys.executable, "-m",
           "hopdec.cli", "train", "--threads", "1", "--iterations", str(iterations), "--log-dir", log_dir]
    if compute_time:
        cmd += ["--compute-time", str(compute_time)]
    p = subprocess.run(cmd + extra, cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stdout[-2000:] + p.stderr[-2000:])
    rates, per = [], []
    for r in range(ranks):
        rows = [json.loads(x) for x in open(os.path.join(log_dir, f"rank{r}.jsonl"))]
        recs = [x for x in rows if "iter" in x and "event" not in x]
        rates.append((recs[-1]["iter"] - recs[0]["iter"]) / (recs[-1]["time"] - recs[0]["time"]))
        per += [x["per_record_ms"] for x in rows if x.get("event") == "observer"]
    return float(np.mean(rates)), (max(per) if per else 0.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4, help="MPI ranks (default 4)")
    p.add_argument("--iterations", type=int, default=150, help="iterations per run (default 150)")
    p.add_argument("--repeats", type=int, default=2, help="runs per setting, alternated (default 2)")
    p.add_argument("--compute-time", type=float, default=0.0,
                   help="pad compute to this many seconds (default 0: as measured)")
    args = p.parse_args(argv)
    out = {k: [] for k in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, extra in SETTINGS.items():
                d = os.path.join(tmp, f"{rep}-{len(out[name])}-{name.replace(' ', '_')}")
                out[name].append(run(args.ranks, args.iterations, extra, d, args.compute_time))
    base = np.mean([r for r, _ in out["nothing"]])
    print(f"{args.ranks} ranks, {args.iterations} iterations, {args.repeats} run(s) each")
    print(f"{'setting':28s} {'iter/s':>8s} {'vs nothing':>10s} {'hook ms/iter (max rank)':>24s}")
    for name, rs in out.items():
        rate = np.mean([r for r, _ in rs])
        print(f"{name:28s} {rate:8.2f} {rate / base - 1:+10.1%} {np.mean([c for _, c in rs]):24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
