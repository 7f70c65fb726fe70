"""How long ``hopdec topo analyze`` takes on large graphs (goal: 10,000 nodes of any shape in < 30 s).

    python3 experiments/bench_analyze.py [--sizes 1000,10000] [--kinds ring,exponential,torus,...]
                                         [--skip-size 100000]

Each graph is generated, written as node-link JSON, and analysed end to end by the command a user
runs (``hopdec topo analyze FILE --json``, a fresh process: loading the file included). Prints the
wall time and the figures that show what was computed (diameter, spectral gap, what was skipped).
Besides the generators of ``hopdec.topology`` it builds graphs of other shapes, both directions of
every edge (seeded): ``random-3-regular``, ``random-4-regular``, ``small-world`` (Watts-Strogatz, 4
neighbours, 10% rewired) and ``two-expanders`` (two random 4-regular halves joined by one edge: a tiny
gap without a sparse factorisation). ``--skip-size`` adds one graph beyond ``ALL_PAIRS_MAX_N`` to show
the all-pairs figures skipped. The load average is printed before and after, and the CPU time of each analysis beside its wall time
(this machine is shared: under load the wall time is mostly waiting for a core).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from hopdec import topology as T  # noqa: E402
from hopdec.topology.generators import _from_edges  # noqa: E402


def _random(kind, n):
    import networkx as nx
    if kind == "small-world":
        edges = nx.connected_watts_strogatz_graph(n, 4, 0.1, seed=1).edges()
    elif kind == "two-expanders":
        h = n // 2
        a, b = nx.random_regular_graph(4, h, seed=1), nx.random_regular_graph(4, n - h, seed=2)
        edges = list(a.edges()) + [(u + h, v + h) for u, v in b.edges()] + [(0, h)]
    else:                                           # random-D-regular
        edges = nx.random_regular_graph(int(kind.split("-")[1]), n, seed=1).edges()
    return _from_edges(n, list(edges), f"{kind}_{n}", bidirectional=True)


SHAPES = ("random-3-regular", "random-4-regular", "small-world", "two-expanders")


def build(kind, n):
    return _random(kind, n) if kind in SHAPES else T.GENERATORS[kind](n)


def _children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def analyze(path):
    """Wall and CPU seconds of ``hopdec topo analyze PATH --json`` in a fresh process, and its output."""
    t0, c0 = time.perf_counter(), _children_cpu()
    r = subprocess.run([sys.executable, "-m", "hopdec.cli", "topo", "analyze", str(path), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if r.returncode != 0:
        raise SystemExit(f"analyze {path} failed: {r.stderr.strip()}")
    return wall, cpu, json.loads(r.stdout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--kinds", default="ring,exponential,torus,double-ring," + ",".join(SHAPES))
    p.add_argument("--skip-size", type=int, default=100_000,
                   help="one ring and torus of this size beyond the all-pairs limit (0: none)")
    a = p.parse_args(argv)
    cases = [(k, int(n)) for n in a.sizes.split(",") for k in a.kinds.split(",")]
    if a.skip_size:
        cases += [("ring", a.skip_size), ("torus", a.skip_size)]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'graph':<26}{'edges':>9}{'wall s':>8}{'CPU s':>8}{'diameter':>10}{'spectral gap':>14}"
          f"{'Laplacian gap':>15}  skipped")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n in cases:
            path = os.path.join(tmp, f"{kind}_{n}.json")
            T.save(build(kind, n), path)
            wall, cpu, s = analyze(path)
            gap = s["spectral_gap"]
            lap = s["normalized_laplacian_gap"]
            print(f"{kind + ' ' + str(n):<26}{s['edges']:>9}{wall:>8.1f}{cpu:>8.1f}{str(s['diameter']):>10}"
                  f"{'-' if gap is None else format(gap, '.3g'):>14}"
                  f"{'-' if lap is None else format(lap, '.3g'):>15}  {s.get('skipped') or ''}",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
