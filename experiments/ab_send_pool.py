"""The pool of send stores, before and after, on real runs: interleaved A/B ``mpirun`` jobs.

    git archive <commit before the pool> | tar -x -C /tmp/before
    python3 experiments/ab_send_pool.py --before /tmp/before [--pairs 3] [--iterations 60] [--out DIR]

The case where the two-store wait was largest: ``hopdec train`` on the 2x4 torus, 8 MPI ranks on this
host (shared memory: 38 KB mlp messages are rendezvous), ``--model mlp --compute-time 0.05``, a 4x straggler on rank 2,
max_ig 3, with backup workers 1 + skipping and with staleness 3 + skipping (the fixed validation cases of
:func:`hopdec.testbed.validate.fixed`). Each job runs both variants (one ``mpirun``, the validation's
driver); jobs alternate between the code tree ``--before`` and this one, so the shared machine's load
falls on both alike. Prints, per variant and side, the fast workers' iterations/s (median over the ranks
other than the straggler, from iteration 5 on) and the mean ``wait_sends_s`` per iteration of the
straggler's in-neighbours (ranks 1, 3, 6), per job and the median over jobs; writes ``DIR/ab.json``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hopdec.runtime.metrics import read_log  # noqa: E402
from hopdec.testbed import validate as V  # noqa: E402

NAMES = ("torus-backup-skip", "torus-stale-skip")
STRAGGLER, NEIGHBOURS = 2, (1, 3, 6)


def job(tree, out, iterations):
    """Both variants in one ``mpirun -n 8`` job with the code in ``tree``."""
    cases = [c for c in V.fixed() if c.name in NAMES]
    runs = [V.train_argv(c, iterations, os.path.join(out, c.name)) for c in cases]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump(runs, f)
    with open(os.path.join(out, "driver.py"), "w") as f:
        f.write(V.DRIVER)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONPATH=tree)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(V.RANKS), sys.executable,
           os.path.join(out, "driver.py"), os.path.join(out, "runs.json")]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        sys.exit(f"mpirun failed ({tree}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {name: measure(os.path.join(out, name)) for name in NAMES}


def measure(log_dir):
    rates, waits, stores = [], [], {}
    for r in range(V.RANKS):
        recs = [x for x in read_log(os.path.join(log_dir, f"rank{r}.jsonl")) if "iter" in x]
        if r != STRAGGLER:
            late = [x for x in recs if x["iter"] >= V.SKIP]
            rates.append((len(late) - 1) / (late[-1]["time"] - late[0]["time"]))
        if r in NEIGHBOURS:
            waits.append(sum(x.get("wait_sends_s", 0.0) for x in recs) / len(recs))
            stores[r] = max([2] + [x["send_stores"] for x in recs if "send_stores" in x])
    return dict(rate=statistics.median(rates), wait_sends_ms=1e3 * statistics.mean(waits), stores=stores)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a code tree without the pool (git archive of the commit)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--out", default="/tmp/ab_send_pool")
    a = p.parse_args()
    sides = {"before": os.path.abspath(a.before), "pool": ROOT}
    rows = []
    for i in range(a.pairs):
        for side in (("before", "pool") if i % 2 == 0 else ("pool", "before")):
            t0 = time.time()
            got = job(sides[side], os.path.join(a.out, f"{i}_{side}"), a.iterations)
            load = os.getloadavg()[0]
            for name, m in got.items():
                rows.append(dict(pair=i, side=side, case=name, load=load, **m))
                print(f"pair {i} {side:6s} {name:18s} fast workers {m['rate']:6.2f} it/s   wait sends "
                      f"{m['wait_sends_ms']:6.1f} ms/it   stores {m['stores']}   ({time.time() - t0:.0f} s, "
                      f"load {load:.1f})", flush=True)
    with open(os.path.join(a.out, "ab.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("\n| case | side | fast workers it/s (median of jobs) | per job | wait sends ms/it | stores (in-neighbours) |")
    print("|---|---|---|---|---|---|")
    for name in NAMES:
        for side in ("before", "pool"):
            rs = [r for r in rows if r["case"] == name and r["side"] == side]
            each = ", ".join(f"{r['rate']:.2f}" for r in rs)
            print(f"| {name} | {side} | {statistics.median(r['rate'] for r in rs):.2f} | {each} | "
                  f"{statistics.median(r['wait_sends_ms'] for r in rs):.1f} | "
                  f"{max(max(r['stores'].values()) for r in rs)} |")


if __name__ == "__main__":
    main()
