"""Speed of the simulator, timing only: events/s, and wall and CPU time of large runs.

    python3 experiments/bench_sim.py [--only NAME,...] [--repeat 1] [--profile NAME]

Each case is one ``hopdec sim`` run in this process (``hopdec.sim.run.simulate``, the same code as the
command, with ``--invariants off``: the per-event check is O(n^2)). Times exclude Python start-up and
imports but include building the topology, the cores and the summary. Prints one line per case:
workers x iterations, virtual seconds simulated, events, wall s, CPU s, events/s (per CPU second),
worker-iterations per CPU second. Targets: ``ring1024`` under 60 s, ``ring10k`` completes.

``--profile NAME`` runs that case under cProfile and prints the 30 functions with the most own time
(to see how much is the simulator and how much the protocol cores and loops).
"""

import argparse
import io
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NORMAL = "normal:mean=0.25,std=0.02"
CASES = {
    # name: (argv, workers, iterations)
    "ring1024": (["--topology", "ring-based", "-n", "1024", "--iterations", "1000", "--compute-time", NORMAL], 1024, 1000),
    "ring1024-slow": (["--topology", "ring-based", "-n", "1024", "--iterations", "1000", "--compute-time", NORMAL,
                       "--slowdown", "random:factor=6,prob=1/n", "--backup-workers", "1"], 1024, 1000),
    "ring10k": (["--topology", "ring-based", "-n", "10000", "--iterations", "100", "--compute-time", NORMAL],
                10000, 100),
    "ps-bsp256": (["--mode", "ps", "--sync", "bsp", "-n", "256", "--iterations", "200", "--compute-time", NORMAL],
                  256, 200),
    "ps-asp1024": (["--mode", "ps", "--sync", "asp", "-n", "1024", "--iterations", "50", "--compute-time", NORMAL],
                   1024, 50),
}
DEFAULT = ("ring1024", "ring10k")


def run_case(name, profile=False):
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    argv, n, iters = CASES[name]
    args = parse(argv + ["--invariants", "off"])
    out = io.StringIO()
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(args, out=out)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if prof is not None:
        import pstats
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return dict(name=name, n=n, iters=iters, virtual=res["virtual_s"], events=res["events"], wall=wall, cpu=cpu,
                sim_wall=res["wall_s"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(DEFAULT), help=f"cases (of {', '.join(CASES)}), or all")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (the fastest is reported)")
    ap.add_argument("--profile", default=None, metavar="NAME", help="profile one case and exit")
    args = ap.parse_args(argv)
    import networkx  # noqa: F401  imports outside the timings
    import torch  # noqa: F401
    import hopdec.sim.run  # noqa: F401
    if args.profile:
        run_case(args.profile, profile=True)
        return
    names = list(CASES) if args.only == "all" else [s.strip() for s in args.only.split(",")]
    print(f"{'case':>14} {'workers x iters':>16} {'virtual s':>10} {'events':>10} {'wall s':>8} {'CPU s':>8} "
          f"{'events/s':>10} {'worker-iters/s':>14}", flush=True)
    for name in names:
        best = min((run_case(name) for _ in range(args.repeat)), key=lambda r: r["cpu"])
        print(f"{name:>14} {best['n']:>7} x {best['iters']:<6} {best['virtual']:>10.1f} {best['events']:>10} "
              f"{best['wall']:>8.1f} {best['cpu']:>8.1f} {best['events'] / best['cpu']:>10,.0f} "
              f"{best['n'] * best['iters'] / best['cpu']:>14,.0f}", flush=True)


if __name__ == "__main__":
    main()
