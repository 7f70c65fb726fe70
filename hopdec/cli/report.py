"""``hopdec report RUN_DIR... -o report.html`` and ``hopdec plot RUN_DIR... -o out.png``.

Both read the per-rank JSONL logs a run wrote with ``--log-dir`` (``hopdec train`` or ``hopdec sim``):
real, parameter-server and simulated runs alike. ``report`` writes one self-contained HTML page
comparing the runs; ``plot`` one PNG of the loss against time and against iterations (``--what`` for
other figures); ``trace`` a Perfetto/Chrome trace of one run from its logs (complete timelines when the
run had ``--trace``, which records the spans).
"""

import os
import re
import stat
import sys

from hopdec.cli.helpfmt import HelpFormatter
from hopdec.cli.helpfmt import Parser as _Parser
from hopdec.errors import ConfigError
from hopdec.files import shown


def _load(paths, labels, prog):
    from hopdec.report.data import Run, printable
    if labels is not None:
        labels = printable(labels).split(",")
        if len(labels) != len(paths):
            raise ConfigError(f"--labels: {len(labels)} labels for {len(paths)} run directories")
    runs = []
    for i, p in enumerate(paths):
        if not os.path.isdir(p):
            raise ConfigError(f"{shown(p)}: not a directory (give the --log-dir of a run)")
        run = Run.load(p, label=labels[i] if labels else None)
        if not run.records:     # (the simulator writes its records in batches, and at the end or a Ctrl-C)
            why = (" (hopdec sim writes its records in batches and at its end or a Ctrl-C: a simulation killed "
                   "before its first batch leaves its headers only)" if run.simulated else "")
            raise ConfigError(f"{shown(p)}: the logs hold no iteration record{why}")
        for note in run.notes:
            print(f"{prog}: note: {note}", file=sys.stderr)
        if run.bad_lines:
            print(f"{prog}: note: {shown(p)}: {run.bad_lines} log line(s) or field(s) unreadable or of the wrong "
                  f"type, skipped (a rank killed mid-line leaves one)", file=sys.stderr)
        runs.append(run)
    if labels is None:                     # folder names that repeat get their parent too
        names = [r.label for r in runs]
        for r in runs:
            if names.count(r.label) > 1:
                r.label = printable(os.path.join(os.path.basename(os.path.dirname(os.path.abspath(r.path))), r.label))
    return runs


def output_path(path, default_suffix=None, option="-o"):
    """Where a command writes its output: ``path`` (plus ``default_suffix`` when it has no suffix), checked
    before any work -- its folder exists, and it is not a directory, FIFO or device (writing to those
    fails late or blocks). ConfigError naming the path (given as ``option``) otherwise."""
    if path == "":
        raise ConfigError(f"{option} '': an empty output path")
    if os.path.isdir(path):                # (before a suffix is added: not dir.png beside the folder)
        raise ConfigError(f"{option} {shown(path)}: is a directory; give a file name")
    if path.endswith(os.sep):
        raise ConfigError(f"{option} {shown(path)}: names a folder (it ends in {os.sep}); give a file name")
    if default_suffix and not os.path.splitext(os.path.basename(path))[1]:
        path += default_suffix
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ConfigError(f"{option} {shown(path)}: folder {shown(folder)} does not exist")
    if os.path.lexists(path):
        st = os.stat(path) if os.path.exists(path) else os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{option} {shown(path)}: is a directory; give a file name")
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"{option} {shown(path)}: not a regular file (a FIFO or device would block or "
                              f"swallow the output)")
    return path


def not_a_log(path, run_dirs, option="-o"):
    """Refuse an output ``path`` that is a log the runs are read from (``RUN_DIR/rank0.jsonl``, its
    ``eval.jsonl``, by name or through a link): writing there destroyed the log it was made from."""
    logs = re.compile(r"rank\d{1,9}\.jsonl|eval\.jsonl")
    folder = os.path.realpath(os.path.dirname(path) or ".")
    for d in run_dirs:
        if not os.path.isdir(d):
            continue
        same_dir = folder == os.path.realpath(d)
        try:
            linked = os.path.exists(path) and any(
                os.path.samefile(path, os.path.join(d, f)) for f in os.listdir(d) if logs.fullmatch(f))
        except OSError:
            linked = False
        if linked or (same_dir and logs.fullmatch(os.path.basename(path))):
            raise ConfigError(f"{option} {shown(path)}: a log of {shown(d)} (rank*.jsonl, eval.jsonl) that this "
                              f"would overwrite or add to; give another file")
    return path


def figure_path(path, option="-o"):
    """:func:`output_path` for a matplotlib figure: ``.png`` added to a name without a suffix, and a suffix
    matplotlib cannot write (``.txt``) refused before any work; the figure is written in the suffix's format."""
    out = output_path(path, ".png", option)
    from hopdec.report import plots
    plt = plots.matplotlib()
    fmt = os.path.splitext(out)[1][1:].lower()
    try:
        if fmt not in plt.gcf().canvas.get_supported_filetypes():
            raise ConfigError(f"{option} {shown(out)}: matplotlib cannot write .{fmt} files (png, pdf, svg, ... can)")
    finally:
        plt.close("all")
    return out


def _written(path, write):
    """Run ``write()``; an OSError (full disk, no permission) becomes one line naming the path."""
    try:
        return write()
    except OSError as err:
        raise ConfigError(f"-o {shown(path)}: cannot write ({err.strerror or err})") from None


def report_main(argv):
    args = report_parser().parse_args(argv)
    out = not_a_log(output_path(args.output), args.runs)
    runs = _load(args.runs, args.labels, "hopdec report")
    from hopdec.report.data import printable
    from hopdec.report.html import render
    page = printable(render(runs, title=printable(args.title)))
    data = page.encode("utf-8")         # (before the file is opened: a failure leaves no empty page)

    def write():
        with open(out, "wb") as f:
            f.write(data)
    _written(out, write)
    print(f"wrote {out} ({len(page) // 1024} KiB, {len(runs)} run(s))")
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
PER_ROW = 3         # --what gap|timeline|breakdown: panels per row of the figure


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
    out = not_a_log(figure_path(args.output), args.runs)
    from hopdec.report import plots
    plt = plots.matplotlib()
    runs = _load(args.runs, args.labels, "hopdec plot")
    if args.what == "loss":
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
        plots.loss_curves(a, b, runs, smooth_k=args.smooth, raw_hint="; --smooth 1: raw")
    elif args.what == "consensus":
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if not plots.consensus(ax, runs):
            raise ConfigError("no run has consensus-distance rounds (hopdec train --consensus-every K or "
                              "HopOptimizer(consensus_every=K) logs them)")
    else:       # one panel per run, at most PER_ROW to a row (12 runs in one row made a 7920 px wide strip)
        cols = min(len(runs), PER_ROW)
        rows = -(-len(runs) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.5 * rows), squeeze=False)
        for ax, run in zip(axes.flat, runs):
            plots.per_run(ax, run, args.what)
        for ax in list(axes.flat)[len(runs):]:
            ax.set_visible(False)
    if args.title:
        from hopdec.report.data import printable
        fig.suptitle(printable(args.title))
    fig.tight_layout()
    _written(out, lambda: fig.savefig(out, dpi=110))
    print(f"wrote {out}")
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
    out = not_a_log(output_path(args.output), [args.run])
    run = _load([args.run], None, "hopdec trace")[0]
    from hopdec.report.trace import write_trace
    obj = _written(out, lambda: write_trace(run, out))
    spans = any(r.get("spans") for recs in run.records.values() for r in recs)
    print(f"wrote {out} ({len(obj['traceEvents'])} events"
          + ("" if spans or run.mode == "ps" else "; iterations only: train with --trace for their parts")
          + "); open it in ui.perfetto.dev", file=sys.stdout)
    return 0
