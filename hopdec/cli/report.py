"""``hopdec report RUN_DIR... -o report.html`` and ``hopdec plot RUN_DIR... -o out.png``.

Both read the per-rank JSONL logs a run wrote with ``--log-dir`` (``hopdec train`` or ``hopdec sim``):
real, parameter-server and simulated runs alike. ``report`` writes one self-contained HTML page
comparing the runs; ``plot`` one PNG of the loss against time and against iterations (``--what`` for
other figures); ``trace`` a Perfetto/Chrome trace of one run from its logs (complete timelines when the
run had ``--trace``, which records the spans).
"""

import argparse
import os
import sys

from hopdec.cli.helpfmt import HelpFormatter
from hopdec.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(f"{message} (see {self.prog} --help)")


def _load(paths, labels):
    from hopdec.report.data import Run
    if labels is not None:
        labels = labels.split(",")
        if len(labels) != len(paths):
            raise ConfigError(f"--labels: {len(labels)} labels for {len(paths)} run directories")
    runs = []
    for i, p in enumerate(paths):
        if not os.path.isdir(p):
            raise ConfigError(f"{p}: not a directory (give the --log-dir of a run)")
        try:
            run = Run.load(p, label=labels[i] if labels else None)
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
        if not run.records:
            raise ConfigError(f"{p}: the logs hold no iteration record")
        runs.append(run)
    if labels is None:                     # folder names that repeat get their parent too
        names = [r.label for r in runs]
        for r in runs:
            if names.count(r.label) > 1:
                r.label = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(r.path))), r.label)
    return runs


def report_main(argv):
    args = report_parser().parse_args(argv)
    runs = _load(args.runs, args.labels)
    from hopdec.report.html import render
    page = render(runs, title=args.title)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {args.output} ({len(page) // 1024} KiB, {len(runs)} run(s))")
    return 0


def report_parser():
    p = _Parser(prog="hopdec report", formatter_class=HelpFormatter, description="One HTML page comparing runs from their --log-dir logs "
                "(real, parameter-server or simulated).")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a --log-dir of hopdec train or hopdec sim")
    p.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    p.add_argument("--labels", default=None, help="comma-separated names for the runs (default: folder names)")
    p.add_argument("--title", default="hopdec report", help="the page's title (default 'hopdec report')")
    return p


WHAT = ("loss", "gap", "consensus", "timeline", "breakdown")


def plot_main(argv):
    args = plot_parser().parse_args(argv)
    return _plot(args)


def plot_parser():
    p = _Parser(prog="hopdec plot", formatter_class=HelpFormatter, description="Figures from run logs as one PNG: loss against time and "
                "against iterations (the shape of Hop Figs. 14, 15, 19), or another figure with --what.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a --log-dir of hopdec train or hopdec sim")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--what", choices=WHAT, default="loss",
                   help="loss: against time and iterations (default); gap: the largest iteration gap over "
                        "time against the bound; consensus: consensus distance; timeline: each worker's "
                        "iteration over time; breakdown: where each worker's time went")
    p.add_argument("--smooth", type=int, default=10, help="loss: moving-average window in points (default 10)")
    p.add_argument("--labels", default=None, help="comma-separated names for the runs (default: folder names)")
    p.add_argument("--title", default=None, help="a title over the figure (default none)")
    return p


def _plot(args):
    if args.smooth < 1:
        raise ConfigError(f"--smooth {args.smooth}: must be >= 1")
    runs = _load(args.runs, args.labels)
    from hopdec.report import plots
    plt = plots.matplotlib()
    if args.what == "loss":
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        plots.loss_curves(a, b, runs, smooth_k=args.smooth)
    elif args.what == "consensus":
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if not plots.consensus(ax, runs):
            raise ConfigError("no run has consensus-distance rounds (train with --consensus-every K)")
    else:
        draw = {"gap": plots.gap, "timeline": plots.timeline, "breakdown": plots.breakdown}[args.what]
        fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
        for ax, run in zip(axes[0], runs):
            draw(ax, run)
            ax.set_title(f"{run.label}: {ax.get_title()}")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


def trace_main(argv):
    args = trace_parser().parse_args(argv)
    return _trace(args)


def trace_parser():
    p = _Parser(prog="hopdec trace", formatter_class=HelpFormatter, description="A Perfetto/Chrome trace (Trace Event JSON) of one run "
                "from its --log-dir logs.")
    p.add_argument("run", metavar="RUN_DIR", help="a --log-dir of hopdec train or hopdec sim")
    p.add_argument("-o", "--output", default="trace.json", help="JSON file to write (default trace.json)")
    return p


def _trace(args):
    run = _load([args.run], None)[0]
    from hopdec.report.trace import write_trace
    obj = write_trace(run, args.output)
    spans = any(r.get("spans") for recs in run.records.values() for r in recs)
    print(f"wrote {args.output} ({len(obj['traceEvents'])} events"
          + ("" if spans or run.mode == "ps" else "; iterations only: train with --trace for their parts")
          + "); open it in ui.perfetto.dev", file=sys.stdout)
    return 0
