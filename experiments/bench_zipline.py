"""ZipLine timing and correctness: how fast it is, and how often it agrees with exhaustive search.

    python3 experiments/bench_zipline.py [--n 1000] [--R 150] [--repeats 5] [--small 2000]

Instances follow the ZipLine paper's generator (sec. 6.1): each worker's iteration interval is
uniform in [1000, 1500] ms, its start uniform in [10, 50] ms, and its R future pushes are
t + i * interval (:func:`hopdec.ps.zipline.predict_pushes`). Prints the time of the fast
(heap, O(R n log n)) and the plain (paper's Algorithm 2, O(R n^2)) ZipLine, then the agreement of
both with exhaustive search on many small random instances (real-valued and integer, with ties).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hopdec.ps.zipline import predict_pushes, zipline, zipline_exhaustive, zipline_plain  # noqa: E402


def paper_instance(rng, n, r):
    start = rng.uniform(10, 50, n)
    interval = rng.uniform(1000, 1500, n)
    return predict_pushes(start, interval, r)


def best_time(fn, arr, repeats):
    times = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(arr)
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--R", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small", type=int, default=2000, help="small random instances vs exhaustive")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    print(f"ZipLine timing (best of {args.repeats}), paper-style instances")
    print(f"{'n':>6} {'R':>5} {'fast (heap) s':>14} {'plain s':>10} {'speedup':>8} {'same answer':>12}")
    for n, r in [(100, 15), (1000, 15), (100, 150), (args.n, args.R)]:
        arr = paper_instance(rng, n, r)
        tf, (idx_f, span_f) = best_time(zipline, arr, args.repeats)
        tp, (idx_p, span_p) = best_time(zipline_plain, arr, max(1, args.repeats // 2))
        same = span_f == span_p and np.array_equal(idx_f, idx_p)
        print(f"{n:>6} {r:>5} {tf:>14.4f} {tp:>10.4f} {tp / tf:>8.1f} {str(same):>12}")

    print(f"\nAgreement with exhaustive search on {args.small} random small instances per kind "
          f"(n <= 5, R <= 5)")
    print(f"{'kind':>8} {'instances':>10} {'fast ok':>8} {'plain ok':>9} {'exhaustive s':>13}")
    for kind in ("real", "integer"):
        ok_f = ok_p = 0
        t_ex = 0.0
        for _ in range(args.small):
            n = int(rng.integers(1, 6))
            r = int(rng.integers(1, 6))
            while r ** n > 4000:
                n -= 1
            if kind == "real":
                t = np.sort(rng.uniform(0, 10, (n, r)), axis=1)
            else:
                t = np.sort(rng.integers(0, 3 * r, (n, r)), axis=1).astype(float)
            t0 = time.perf_counter()
            ref = zipline_exhaustive(t)
            t_ex += time.perf_counter() - t0
            for fn, acc in ((zipline, "f"), (zipline_plain, "p")):
                got = fn(t)
                good = got[1] == ref[1] and np.array_equal(got[0], ref[0])
                if acc == "f":
                    ok_f += good
                else:
                    ok_p += good
        print(f"{kind:>8} {args.small:>10} {ok_f:>8} {ok_p:>9} {t_ex:>13.2f}")


if __name__ == "__main__":
    main()
