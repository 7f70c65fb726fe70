"""Churn at 1,024 workers in the simulator: what worker deaths, healed by the ``--fault-tolerance`` code,
cost in time per iteration (``hopdec sim --fault-tolerance --churn-mttf``).

Timing only, ring-based graph, tokens, max_ig 2, compute 0.1 virtual s per iteration, 1 MiB messages,
10 Gb/s NICs; every worker's lifetime is exponential with the given mean (seeded, ``--seed``). A row per
mean time to failure (and one with a hung worker's detection: ULFM's 30 s heartbeat timeout instead of a
crash's 0.06 s). Prints a markdown table (virtual time per iteration, deaths, heals, wall time).

    python3 experiments/sim_churn.py --workers 1024 --iterations 100 --json churn.json
"""

import argparse
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hopdec.cli.sim import parse  # noqa: E402
from hopdec.sim.run import simulate  # noqa: E402

CASES = [("no deaths", []),
         ("MTTF 5,000 s", ["--churn-mttf", "5000"]),
         ("MTTF 1,000 s", ["--churn-mttf", "1000"]),
         ("MTTF 500 s", ["--churn-mttf", "500"]),
         ("MTTF 5,000 s, hangs (found after 30 s)", ["--churn-mttf", "5000", "--failure-detection", "30"])]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    base = ["--topology", "ring-based", "-n", str(args.workers), "--iterations", str(args.iterations),
            "--compute-time", "0.1", "--message-mb", "1", "--seed", str(args.seed), "--invariants", "off",
            "--fault-tolerance"]
    rows = []
    for name, more in CASES:
        t0 = time.perf_counter()
        res = simulate(parse(base + more), out=io.StringIO())
        wall = time.perf_counter() - t0
        churn = res["churn"]
        died = len(churn.died) if churn else 0
        row = dict(case=name, virtual_s=res["virtual_s"], per_iteration_s=res["virtual_s"] / args.iterations,
                   deaths=died, heals=len(churn.heals) if churn else 0,
                   survivors=len(churn.alive) if churn else args.workers, wall_s=wall)
        rows.append(row)
        print(f"{name}: {row}", file=sys.stderr, flush=True)
    ref = rows[0]["per_iteration_s"]
    print(f"| case ({args.workers} workers, {args.iterations} iterations) | virtual s per iteration | vs no deaths "
          f"| deaths | heals | survivors | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['per_iteration_s']:.4f} | {100 * (r['per_iteration_s'] / ref - 1):+.1f}% | "
              f"{r['deaths']} | {r['heals']} | {r['survivors']} | {r['wall_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
