"""Speed of the simulator, timing only: wall and CPU time, µs per worker-iteration, events/s and memory.

    python3 experiments/bench_sim.py [--only NAME,...|scale|all] [--iterations K] [--repeat 1]
                                     [--profile NAME] [--count NAME,... [--count-iterations LO,HI]]
                                     [--opcodes NAME,... [--count-iterations LO,HI]]

Each case is one ``hopdec sim`` run (``hopdec.sim.run.simulate``, the same code as the command, with
``--invariants off``: the per-event check is O(n^2)), in a fresh Python process of its own so that its
peak memory is its own and no case warms another's caches. Times exclude Python start-up and imports but
include building the topology, the cores and the summary. Per case it prints: workers x iterations,
virtual seconds simulated, events, wall s (the whole run), of which the event loop's s, CPU s,
µs of CPU per worker-iteration, events per CPU second, and the process's peak resident memory.

``scale`` (the default) is the ring-based graph at 128, 1024, 4096 and 10,000 workers, 1000 iterations
each (``--iterations`` shortens them): the goals are 1024 x 1000 under 30 s and 10,000 x 1000 under
5 minutes on this 2-core machine, and a cost per worker-iteration that does not grow with n. The load
average is printed before and after (the machine is shared; compare runs only at similar loads).

``--profile NAME`` runs that case under cProfile in this process and prints the 30 functions with the most
own time (how much is the simulator, how much the protocol cores and loops).

``--count NAME,...`` counts instead of timing: each case runs under valgrind's cachegrind (a simulated
32 KiB L1 data cache and a 32 MiB last-level cache, this machine's L3) at two lengths, ``--count-iterations
LO,HI`` (default 5 and 5 + ceil(20480 / workers)), both at once, and it prints per worker-iteration of the
difference (the steady state: start-up and imports cancel) the instructions, data references, L1 data
misses and last-level misses. The counts do not depend on the load or on the machine's pace that day (two
runs of the same code agree to 0.3%), so two versions of the code compare where timings move by 15-50%;
they take 50-100x the run's time.

``--opcodes NAME,...`` says where the work is, in a unit that does not move with the load either: Python
bytecode instructions per worker-iteration, per function (the same two lengths, traced with
``sys.settrace`` opcode events in a fresh process each; about 30x the run's time). cProfile's own times
inflate small functions (its hook runs on every call); this counts what each function's body executes,
and the total shows how far a change of design would have to go (cachegrind's instructions per
worker-iteration divided by it is what one bytecode costs in the interpreter, allocation included).
"""

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NORMAL = "normal:mean=0.25,std=0.02"


def _ring(n):
    return ["--topology", "ring-based", "-n", str(n)]


CASES = {
    # name: (argv without --iterations and --compute-time, workers, default iterations)
    "ring128": (_ring(128), 128, 1000),
    "ring1024": (_ring(1024), 1024, 1000),
    "ring4096": (_ring(4096), 4096, 1000),
    "ring10k": (_ring(10000), 10000, 1000),
    "ring1024-slow": (_ring(1024) + ["--slowdown", "random:factor=6,prob=1/n", "--backup-workers", "1"],
                      1024, 1000),
    "ps-bsp256": (["--mode", "ps", "--sync", "bsp", "-n", "256"], 256, 200),
    "ps-asp1024": (["--mode", "ps", "--sync", "asp", "-n", "1024"], 1024, 50),
    "ps-asp10k": (["--mode", "ps", "--sync", "asp", "-n", "10000"], 10000, 20),
    "ps-bsp10k": (["--mode", "ps", "--sync", "bsp", "-n", "10000"], 10000, 20),
    "allreduce1024": (["--mode", "allreduce", "-n", "1024"], 1024, 1000),
    "allreduce10k": (["--mode", "allreduce", "-n", "10000"], 10000, 100),
}
SCALE = ("ring128", "ring1024", "ring4096", "ring10k")


def argv_of(name, iterations=None):
    argv, n, iters = CASES[name]
    iters = iterations or iters
    return argv + ["--iterations", str(iters), "--compute-time", NORMAL, "--invariants", "off"], n, iters


def run_case(name, iterations=None, profile=False):
    """One case in this process: its figures as a dict."""
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    argv, n, iters = argv_of(name, iterations)
    args = parse(argv)
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    w0, c0 = time.perf_counter(), time.process_time()
    res = simulate(args, out=io.StringIO())
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if prof is not None:
        import pstats
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return dict(name=name, n=n, iters=iters, virtual=res["virtual_s"], events=res["events"], wall=wall,
                cpu=cpu, loop_wall=res["wall_s"],
                peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def run_child(name, iterations):
    """One case in a fresh process (its own peak memory, cold caches)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name]
    if iterations:
        cmd += ["--iterations", str(iterations)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"case {name} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


COUNTED = ("I   refs", "D   refs", "D1  misses", "LL misses")
"""cachegrind's summary lines that ``--count`` reads (LL misses: instructions' and data's)."""


def count_child(name, iterations):
    """cachegrind's totals for one case of ``iterations`` in a fresh process: {line: count}."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--LL={32 * 2 ** 20},16,64",
           "--cachegrind-out-file=/dev/null", sys.executable, os.path.abspath(__file__), "--child", name,
           "--iterations", str(iterations)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _totals(proc, name):
    err = proc.communicate()[1]
    if proc.returncode != 0:
        raise SystemExit(f"case {name} failed under valgrind: {err.strip()[-2000:]}")
    got = {}
    for line in err.splitlines():
        for key in COUNTED:
            if f"{key}:" in line:
                got[key] = int(line.split(":", 1)[1].split("(")[0].replace(",", ""))
    return got


def count(names, lengths=None):
    """``--count``: cachegrind's counts per worker-iteration, between two lengths of each case."""
    import shutil
    if shutil.which("valgrind") is None:
        raise SystemExit("--count: valgrind not found (apt install valgrind)")
    print(f"{'case':>14} {'workers':>8} {'iterations':>11} {'instructions':>13} {'data refs':>10} "
          f"{'L1d misses':>11} {'LL misses':>10}   (per worker-iteration)", flush=True)
    for name in names:
        n = CASES[name][1]
        lo, hi = lengths or (5, 5 + max(1, -(-20480 // n)))
        a, b = count_child(name, lo), count_child(name, hi)
        ta, tb = _totals(a, name), _totals(b, name)
        per = {k: (tb[k] - ta[k]) / (n * (hi - lo)) for k in COUNTED}
        print(f"{name:>14} {n:>8} {f'{lo}..{hi}':>11} {per['I   refs']:>13,.0f} {per['D   refs']:>10,.0f} "
              f"{per['D1  misses']:>11,.1f} {per['LL misses']:>10,.1f}", flush=True)


def trace_opcodes(name, iterations):
    """``--child NAME --opcodes-of``: run the case with every bytecode counted; {"file:line function": count}
    of the functions that ran (printed as JSON by the child)."""
    from collections import Counter
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    argv, _, _ = argv_of(name, iterations)
    args = parse(argv + ["--no-progress"])
    counts = Counter()

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[code] += 1
        return tracer
    sys.settrace(tracer)
    try:
        simulate(args, out=io.StringIO())
    finally:
        sys.settrace(None)
    return {f"{_short(c.co_filename)}:{c.co_firstlineno} {c.co_name}": k for c, k in counts.items()}


def _short(path):
    """A source path from the repository's root (hopdec/sim/hop.py), or as it is outside it."""
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def opcodes_child(name, iterations):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--opcodes-of", "--iterations",
           str(iterations)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _opcode_counts(proc, name):
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"case {name} failed while counting bytecodes: {err.strip()[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def per_function(a, b, per):
    """``(total, [(count, function), ...])``: bytecodes per worker-iteration between two runs' counts ``a``
    (shorter) and ``b`` (``per`` worker-iterations more), most first; functions under 0.5 are left out of
    the list (their sum is in the total)."""
    diff = {f: (b.get(f, 0) - a.get(f, 0)) / per for f in set(a) | set(b)}
    total = sum(diff.values())
    return total, sorted(((v, f) for f, v in diff.items() if v >= 0.5), key=lambda x: (-x[0], x[1]))


def opcodes(names, lengths=None, top=40):
    """``--opcodes``: Python bytecodes per worker-iteration, per function, between two lengths of each case."""
    for name in names:
        n = CASES[name][1]
        lo, hi = lengths or (5, 5 + max(1, -(-20480 // n)))
        a, b = opcodes_child(name, lo), opcodes_child(name, hi)
        total, rows = per_function(_opcode_counts(a, name), _opcode_counts(b, name), n * (hi - lo))
        print(f"{name}: {total:,.0f} bytecodes per worker-iteration ({n} workers, iterations {lo}..{hi}); "
              f"the {min(top, len(rows))} functions that run the most:", flush=True)
        for v, f in rows[:top]:
            print(f"{v:>10,.1f}  {100 * v / total:5.1f}%  {f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="scale", help=f"cases (of {', '.join(CASES)}), scale or all")
    ap.add_argument("--iterations", type=int, default=None, help="iterations of every case (default: its own)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case (the one with the least CPU is shown)")
    ap.add_argument("--profile", default=None, metavar="NAME", help="profile one case and exit")
    ap.add_argument("--count", default=None, metavar="NAME,...",
                    help="count instructions and cache misses per worker-iteration under valgrind instead")
    ap.add_argument("--opcodes", default=None, metavar="NAME,...",
                    help="count Python bytecodes per worker-iteration, per function, instead")
    ap.add_argument("--count-iterations", default=None, metavar="LO,HI",
                    help="--count's and --opcodes' two lengths (default 5 and 5 + ceil(20480 / workers))")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--opcodes-of", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or args.profile:
        import networkx  # noqa: F401  imports outside the timings (torch is not one: a timing-only
        import hopdec.sim.run  # noqa: F401  run never imports it, and its objects would slow the collector)
        if args.profile:
            run_case(args.profile, args.iterations, profile=True)
            return
        if args.opcodes_of:
            print(json.dumps(trace_opcodes(args.child, args.iterations)))
            return
        print(json.dumps(run_case(args.child, args.iterations)))
        return
    if args.count and args.opcodes:
        raise SystemExit("--count and --opcodes: one at a time (each runs every case twice)")
    option = "--count" if args.count else "--opcodes" if args.opcodes else "--only"
    chosen = args.count or args.opcodes or args.only
    names = ({"all": list(CASES), "scale": list(SCALE)}.get(chosen)
             or [s.strip() for s in chosen.split(",")])
    for name in names:
        if name not in CASES:
            raise SystemExit(f"{option}: unknown case {name!r} (cases: {', '.join(CASES)})")
    if args.count or args.opcodes:
        lengths = None
        if args.count_iterations:
            try:
                lengths = tuple(int(x) for x in args.count_iterations.split(","))
            except ValueError:
                lengths = ()
            if len(lengths) != 2 or not 1 <= lengths[0] < lengths[1]:
                raise SystemExit(f"--count-iterations {args.count_iterations}: two lengths LO,HI with "
                                 f"1 <= LO < HI")
        if args.opcodes:
            opcodes(names, lengths)
        else:
            count(names, lengths)
        return
    print(f"load average {os.getloadavg()[0]:.1f}; timing only, --invariants off", flush=True)
    print(f"{'case':>14} {'workers x iters':>16} {'virtual s':>10} {'events':>10} {'wall s':>8} {'loop s':>8} "
          f"{'CPU s':>8} {'µs/w-it':>8} {'events/s':>10} {'peak MB':>8}", flush=True)
    for name in names:
        best = min((run_child(name, args.iterations) for _ in range(args.repeat)), key=lambda r: r["cpu"])
        wi = best["n"] * best["iters"]
        print(f"{name:>14} {best['n']:>7} x {best['iters']:<6} {best['virtual']:>10.1f} {best['events']:>10} "
              f"{best['wall']:>8.1f} {best['loop_wall']:>8.1f} {best['cpu']:>8.1f} {1e6 * best['cpu'] / wi:>8.1f} "
              f"{best['events'] / best['cpu']:>10,.0f} {best['peak_mb']:>8.0f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
