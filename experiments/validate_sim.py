"""The simulator against real runs: throughput ratios and iteration gaps, sim vs ``mpirun``.

    python3 experiments/validate_sim.py [--repeats 3] [--iterations 60] [--out /tmp/hopdec_validate]
                                        [--latency SECONDS] [--zero-copy]

Runs the cases of :mod:`hopdec.sim.validate` (8 ranks, mlp on digits, compute padded to 0.05 s; the
decentralized cases on ring_based_8 with a random 6x slowdown of probability 1/n: standard, backup
workers 1, staleness 3; the PS cases 1 server + 7 workers with rank 3 three times slower: BSP and
sync SGD with 1 backup worker) ``--repeats`` times in ONE ``mpirun -n 8`` job (a driver calls ``hopdec train`` once per case and
repeat, each with its own seed), then simulates each with the same options and seed (``hopdec sim``
is deterministic). Prints, per case, the median iterations/s over workers and the largest iteration gap
of every real run and of the simulation, then the throughput ratios (backup/standard,
staleness/standard, ps-backup/ps-bsp) with the simulation's relative error against each real run. The
validation test (tests/test_sim_mpi.py) asserts the tolerance chosen from these figures.
"""

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hopdec.sim import validate as V  # noqa: E402

def with_seed(argv, seed):
    i = argv.index("--seed")
    return argv[:i + 1] + [str(seed)] + argv[i + 2:]


def real_runs(out, repeats, iterations, timeout, send_path="copy"):
    runs = []
    for rep in range(repeats):
        for case in V.CASES:
            runs.append(with_seed(V.train_argv(case, iterations, os.path.join(out, f"real{rep}_{case}")), 1 + rep))
    driver = os.path.join(out, "driver.py")
    with open(driver, "w") as f:
        f.write(V.DRIVER)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(V.RANKS), sys.executable, driver,
           json.dumps(runs), send_path]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        sys.exit(f"mpirun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.time() - t0


def sim_runs(out, repeats, iterations, latency):
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    for rep in range(repeats):
        for case in V.CASES:
            d = os.path.join(out, f"sim{rep}_{case}")
            argv = with_seed(V.sim_argv(case, iterations, d, latency=latency), 1 + rep)
            simulate(parse(argv), out=io.StringIO())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--latency", type=float, default=None, help="the simulator's --latency (default: its own)")
    ap.add_argument("--out", default="/tmp/hopdec_validate")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--report-only", action="store_true", help="re-read the logs in --out")
    ap.add_argument("--zero-copy", action="store_true", help="real runs with the default zero-copy sends "
                    "(default: the copying send path, see hopdec/sim/validate.py)")
    args = ap.parse_args(argv)
    if not args.report_only:
        shutil.rmtree(args.out, ignore_errors=True)
        os.makedirs(args.out)
        wall = real_runs(args.out, args.repeats, args.iterations, args.timeout,
                         "zero-copy" if args.zero_copy else "copy")
        print(f"mpirun: {len(V.CASES) * args.repeats} runs in {wall:.0f} s", flush=True)
    sim_runs(args.out, args.repeats, args.iterations, args.latency)
    real = [{c: V.metrics(os.path.join(args.out, f"real{r}_{c}")) for c in V.CASES} for r in range(args.repeats)]
    sim = [{c: V.metrics(os.path.join(args.out, f"sim{r}_{c}")) for c in V.CASES} for r in range(args.repeats)]
    print(f"\n{'case':>10}  " + "  ".join(f"{'real' + str(r) + ' it/s':>11} {'sim':>6} {'gap r/s':>7}"
                                         for r in range(args.repeats)))
    for c in V.CASES:
        print(f"{c:>10}  " + "  ".join(f"{real[r][c]['rate']:>11.3f} {sim[r][c]['rate']:>6.3f} "
                                       f"{real[r][c]['gap']:>3}/{sim[r][c]['gap']:<3}" for r in range(args.repeats)))
    print(f"\n{'ratio':>22}  " + "  ".join(f"{'real' + str(r):>7} {'sim':>6} {'err':>6}" for r in range(args.repeats)))
    worst = 0.0
    for key in V.ratios(real[0]):
        cells = []
        for r in range(args.repeats):
            a, b = V.ratios(real[r])[key], V.ratios(sim[r])[key]
            err = b / a - 1
            worst = max(worst, abs(err))
            cells.append(f"{a:>7.3f} {b:>6.3f} {err:>+6.1%}")
        print(f"{key:>22}  " + "  ".join(cells))
    gaps = max(abs(real[r][c]["gap"] - sim[r][c]["gap"]) for r in range(args.repeats) for c in V.CASES)
    print(f"\nlargest |ratio error|: {worst:.1%}; largest |gap difference|: {gaps}")


if __name__ == "__main__":
    main()
