"""Shared helpers of the paper reproductions (``experiments/repro_*.py``): run ``hopdec sim`` in-process,
reduce a run to the figures the tables need, cache them, print markdown tables.

Every run is one ``hopdec sim`` command line (``argv``); :func:`run` executes it with
:func:`hopdec.sim.run.simulate` (the same code as the CLI) and returns a dict of figures, cached in a
JSON file keyed by the command line, so ``--report-only`` re-prints the tables without simulating and a
changed command line is always simulated again. ``hopdec sim ARGV`` on the command line gives the same
run (deterministic for its seed).

Figures (all in virtual seconds):

* ``rate``: steady-state iterations/s per worker -- (iteration at the end - iteration at the first record
  at or after ``warm`` of the run's iterations) / (time between them), so the start-up transient is not
  counted; ``rate_med`` / ``rate_min`` / ``rate_mean``: median / slowest / mean over workers;
  ``iter_s``: the mean over workers of 1 / rate (mean iteration duration). Skipped iterations count as
  progress (a jump of J counts J).
* ``gap``: the largest iteration gap observed (the summary's figure).
* ``virtual_s``: the virtual time of the whole run; PS runs also give ``updates`` (server model
  updates), ``dropped``, ``grads_per_s`` (gradients pushed per virtual second by all workers),
  ``work`` (mini-batches computed; ESync: local steps) and ``work_per_s``;
  ``data_messages`` / ``data_bytes``: what the network carried (parameters, gradients, weights);
  ``step_s``: the time between consecutive server updates (PS runs of at most 5000 updates).
* ``evals``: ``[(time, test_acc, test_loss, iteration)]`` of ``--math`` runs (decentralized: the average model;
  PS: the server's model; iteration: the workers' mean iteration, or the server's version);
  :func:`time_to` reads the first time a target accuracy is reached.

Times to an accuracy are read off the evaluation grid (``--eval-interval``): the first evaluation at or
above the target, so the model crossed it at some time since the evaluation before. :func:`time_to_range`
keeps both ends, and :func:`range_ratio` prints a ratio of two such times with the range the two grids
allow and no more digits than that range supports ("6.4x (6.28-7.50)", not "6.43x"). Ratios of rates
measured over whole runs are not quantized that way and keep two decimals (:func:`ratio`).
"""

import argparse
import contextlib
import io
import json
import math
import os
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WARM = 0.1
"""Fraction of a run's iterations skipped before rates are measured (start-up transient)."""


class Runner:
    """Runs simulations one at a time (never in parallel: the machine is shared), with a JSON cache."""

    def __init__(self, cache_path, report_only=False, fresh=False, verbose=True):
        self.path = cache_path
        self.report_only = report_only
        self.verbose = verbose
        self.cache = {}
        if cache_path and os.path.exists(cache_path) and not fresh:
            with open(cache_path) as f:
                self.cache = json.load(f)
        self.wall = 0.0          # wall seconds simulated by this process
        self.ran = 0

    def key(self, argv):
        return shlex.join(str(a) for a in argv)

    def run(self, argv, patch=None, tag=None):
        """Figures of ``hopdec sim ARGV`` (cached). ``patch``: a context manager factory wrapped around
        the simulation (experiment-local policy variants); ``tag`` then names it in the cache key."""
        k = self.key(argv) + (f"  [{tag}]" if tag else "")
        if k in self.cache:
            return self.cache[k]
        if self.report_only:
            raise SystemExit(f"--report-only: no cached result for: hopdec sim {k}")
        t0 = time.perf_counter()
        if self.verbose:
            print(f"  sim: hopdec sim {k}", file=sys.stderr, flush=True)
        with (patch() if patch else contextlib.nullcontext()):
            fig = simulate(argv)
        fig["wall_s"] = time.perf_counter() - t0
        self.wall += fig["wall_s"]
        self.ran += 1
        self.cache[k] = fig
        self.save()
        return fig

    def save(self):
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.cache, f)
        os.replace(tmp, self.path)


def simulate(argv):
    """Run ``hopdec sim argv`` in this process and reduce it to the figures (see module doc)."""
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate as sim_run
    out = io.StringIO()
    res = sim_run(parse([str(a) for a in argv]), out=out, entries=True)     # rates from (time, iteration)
    stats = res["stats"]
    rates = {}
    for r, s in stats.items():
        ent = s.entries
        if len(ent) < 3:
            continue
        last_it = ent[-1][1]
        start = WARM * last_it
        i0 = next((i for i, (_, k) in enumerate(ent) if k >= start), 0)
        t0, k0 = ent[i0]
        t1, k1 = ent[-1]
        if t1 > t0 and k1 > k0:
            rates[str(r)] = (k1 - k0) / (t1 - t0)
    vals = list(rates.values())
    fig = dict(virtual_s=res["virtual_s"], gap=res["max_gap"], bound=res.get("bound"),
               rate_med=statistics.median(vals) if vals else None,
               rate_min=min(vals) if vals else None, rate_max=max(vals) if vals else None,
               rate_mean=sum(vals) / len(vals) if vals else None,
               iter_s=sum(1 / v for v in vals) / len(vals) if vals else None,
               jumps=sum(s.jumps for s in stats.values()),
               iterations=sum(s.iterations for s in stats.values()),
               avg_acc=res.get("avg_acc"), avg_loss=res.get("avg_loss"),
               events=res["events"], sim_wall_s=res["wall_s"],
               data_messages=res["sim"].net.transfers, data_bytes=res["sim"].net.bytes)
    pol = res.get("policy")
    if pol is not None:
        srv = res["sim"].server
        fig.update(updates=pol.version, dropped=srv.dropped, pushes=sum(pol.pushes.values()),
                   grads_per_s=sum(pol.pushes.values()) / res["virtual_s"] if res["virtual_s"] else None,
                   work=srv.work, work_per_s=srv.work / res["virtual_s"] if res["virtual_s"] else None)
        applies = [d["time"] for d in res["sim"].logged("apply")]
        if 2 <= len(applies) <= 5000:
            fig["step_s"] = [round(b - a, 6) for a, b in zip(applies, applies[1:])]
        if getattr(pol, "local_steps", None):
            ls = pol.local_steps
            fig["esync_local_steps"] = [sum(x) / len(ls) for x in zip(*ls)]
            fig["esync_local_steps_median"] = [statistics.median(x) for x in zip(*ls)]
            fig["esync_rounds"] = len(ls)
    evals = res.get("evals") or []
    fig["evals"] = [(e["time"], e["test_acc"], e["test_loss"], e.get("iter_mean", e.get("version")))
                    for e in evals]
    return fig


def time_to(fig, target):
    """First virtual time the evaluated model reached test accuracy ``target`` (None: never)."""
    for t, acc, *_ in fig.get("evals") or []:
        if acc >= target - 1e-12:
            return t
    return None


def iters_to(fig, target):
    """Mean worker iteration (decentralized) or server version (PS) when ``target`` was first reached."""
    for t, acc, _, it in fig.get("evals") or []:
        if acc >= target - 1e-12:
            return it
    return None


def time_to_range(fig, target):
    """``(lo, hi)``: the model first reached ``target`` after evaluation time ``lo`` and by ``hi`` (the
    first evaluation at or above it; ``lo`` the evaluation before, or ``hi`` itself when the first one
    already reached it). Never reached: ``(time of the last evaluation, inf)``; no evaluation: ``(0, inf)``
    (as :func:`median_time_to` counts it: never)."""
    return _first_range(fig, target, 0)


def iters_to_range(fig, target):
    """:func:`time_to_range` in iterations (the mean worker iteration or the server version then)."""
    return _first_range(fig, target, 3)


def _first_range(fig, target, field):
    evals = fig.get("evals") or []
    prev = None
    for e in evals:
        if e[1] >= target - 1e-12:
            return (e[field] if prev is None else prev[field], e[field])
        prev = e
    return (0.0 if prev is None else prev[field]), float("inf")


def median_range(ranges):
    """The median of several seeds' values, each known to lie in ``(lo, hi]``: the median lies in
    ``(median of the lo, median of the hi]`` (a median only grows when any of its values does)."""
    ranges = list(ranges)
    if not ranges:
        return None
    return statistics.median(r[0] for r in ranges), statistics.median(r[1] for r in ranges)


def median_time_to_range(figs, target):
    return median_range([time_to_range(f, target) for f in figs])


def range_ratio(a, b):
    """``a[1] / b[1]`` for two values known only as ranges ``(lo, hi]`` (times read off evaluation grids),
    printed with the range of ``a / b`` they allow: ``"6.4x (6.28-7.50)"`` -- the point value with no more
    decimals than half that range supports, the range one digit finer and rounded outwards. Exact values (lo == hi) print as
    :func:`ratio` does, and so does a range against itself (``a is b``: a baseline row, exactly 1). ``"-"``
    when either is missing or never reached."""
    if a is None or b is None or not b[1] or b[1] == float("inf") or a[1] == float("inf"):
        return "-"
    if a is b:
        return "1.00x"                      # a row against itself (the baseline): exactly 1
    r = a[1] / b[1]
    lo = a[0] / b[1]
    hi = a[1] / b[0] if b[0] > 0 else float("inf")
    if hi - lo <= 0.01 * r:
        return f"{r:.2f}x"
    if hi == float("inf"):
        return f">{lo:.2g}x"
    nd = max(0, min(2, -math.floor(math.log10((hi - lo) / 2))))
    q = 10 ** (nd + 1)                      # the range one digit finer, rounded outwards
    return f"{r:.{nd}f}x ({math.floor(lo * q) / q:.{nd + 1}f}-{math.ceil(hi * q) / q:.{nd + 1}f})"


def grid_note(every, what="Times to an accuracy", ratios=True):
    """The sentence under a table whose times come off an evaluation grid every ``every`` virtual s."""
    return (f"{what} are read at the first evaluation at or above it, every {fmt(every)} virtual s: the "
            f"model crossed it up to {fmt(every)} s earlier" + ("; ratios of them show the range that allows."
                                                                 if ratios else "."))


def median_time_to(figs, target):
    """Median over seeds of :func:`time_to`; a seed that never reached it counts as infinite."""
    ts = [time_to(f, target) for f in figs]
    ts = [float("inf") if t is None else t for t in ts]
    m = statistics.median(ts)
    return None if m == float("inf") else m


def fmt(x, nd=3, none="-"):
    if x is None:
        return none
    if isinstance(x, str):
        return x
    if x == float("inf"):
        return none
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}g}" if abs(x) < 1 else f"{x:.{nd}g}" if abs(x) < 10 ** nd else f"{x:.0f}"


def ratio(a, b, nd=2):
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{nd}f}x"


def table(headers, rows):
    """A markdown table as a string."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def cmd(argv):
    """The command line a reader can paste."""
    return "hopdec sim " + shlex.join(str(a) for a in argv)


def num(cell):
    """The number in a table cell ("1.41x", "6.4x (6.3-7.5)", "1,724", "0.983"); None for "-"."""
    c = str(cell).strip().split(" ")[0].rstrip("x").replace(",", "")
    try:
        return float(c)
    except ValueError:
        return None


class Report:
    """Prints the markdown a script produces and keeps every table (``tables[name] = (headers, rows)``,
    cells as printed) so that tests can read the figures without parsing text."""

    def __init__(self, out=None):
        self.out = out
        self.tables = {}

    def _print(self, text):
        print(text, file=self.out or sys.stdout, flush=True)

    def h(self, text):
        self._print(f"\n### {text}\n")

    def p(self, text=""):
        self._print(text)

    def table(self, name, headers, rows):
        rows = [[str(c) for c in r] for r in rows]
        self.tables[name] = (list(headers), rows)
        self._print(table(headers, rows))

    def cell(self, name, row_label, column):
        """The cell of table ``name`` in the first row whose first cell is ``row_label``."""
        headers, rows = self.tables[name]
        j = headers.index(column)
        for r in rows:
            if r[0] == row_label:
                return r[j]
        raise KeyError(f"{name}: no row {row_label!r}")


def common_args(ap, name):
    ap.add_argument("--quick", action="store_true",
                    help="one seed and short runs (a smoke test of the whole pipeline; the figures are "
                         "rough); cached apart from the full runs")
    ap.add_argument("--cache", default=f"/tmp/hopdec_repro/{name}.json",
                    help="JSON cache of the figures, keyed by command line")
    ap.add_argument("--report-only", action="store_true", help="print the tables from the cache only")
    ap.add_argument("--fresh", action="store_true", help="ignore the cache (simulate everything again)")
    ap.add_argument("--print-commands", action="store_true",
                    help="also print every hopdec sim command line, after the tables (it simulates what the "
                         "cache lacks first, as without it)")
    return ap


def footer(runner):
    return (f"({runner.ran} simulations run now, {runner.wall:.0f} s of wall time; "
            f"{len(runner.cache)} in the cache {runner.path})")


class Session:
    """One script's run: its options (:func:`common_args` plus ``extra(ap)``), the cached :class:`Runner`,
    the :class:`Report` and the command lines it ran (``--print-commands``)."""

    def __init__(self, doc, name, argv, out, quick_note, extra=None):
        ap = common_args(argparse.ArgumentParser(description=doc.splitlines()[0]), name)
        if extra:
            extra(ap)
        self.args = ap.parse_args(argv)
        self.R = Runner(self.args.cache, report_only=self.args.report_only, fresh=self.args.fresh)
        self.rep = Report(out)
        self.cmds = []
        if self.args.quick:
            self.rep.p(f"(--quick: {quick_note}; rough figures)")

    def run(self, argv, note="", **kw):
        """:meth:`Runner.run`, remembering the command line (``note`` is appended to it)."""
        self.cmds.append(cmd(argv) + note)
        return self.R.run(argv, **kw)

    def finish(self):
        if self.args.print_commands:
            self.rep.p("\n" + "\n".join("    " + c for c in self.cmds))
        self.rep.p("\n" + footer(self.R))
        return self.rep
