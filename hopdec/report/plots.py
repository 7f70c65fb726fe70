"""The report's figures (matplotlib, Agg): each function draws on axes it is given, from :class:`Run` s."""

import numpy as np

PART_COLORS = {"compute": "#4c72b0", "wait updates": "#dd8452", "wait tokens": "#c44e52",
               "wait acks": "#8172b3", "wait sends": "#da8bc3", "wait (other)": "#937860", "wait for server": "#dd8452",
               "wait all-reduce": "#dd8452",
               "reduce": "#55a868", "send": "#64b5cd", "apply": "#8c8c8c", "push": "#64b5cd",
               "poll": "#ccb974", "watching": "#ff9896", "other": "#dddddd"}


def matplotlib():
    import matplotlib as mpl
    mpl.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def smooth(y, k):
    """Trailing moving average over ``k`` points (shorter at the start)."""
    y = np.asarray(y, dtype=float)
    if k <= 1 or len(y) < 2:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(len(y))
    lo = np.maximum(0, idx - k + 1)
    return (c[idx + 1] - c[lo]) / (idx + 1 - lo)


def palette_size(runs):
    """How many colours the runs are drawn in: tab10's up to 10 runs, else tab20's (see :func:`run_colors`)."""
    return 10 if len(runs) <= 10 else 20


def run_colors(runs):
    """A colour per run: tab10's up to 10 runs, tab20's up to 20 (the 11th run was drawn in the 1st's colour,
    two curves a legend could not tell apart), then tab20's again (:func:`run_dashes` tells those apart)."""
    import matplotlib as mpl
    cmap = mpl.colormaps[f"tab{palette_size(runs)}"]
    return [cmap(i % cmap.N) for i in range(len(runs))]


DASHES = ("-", "--", ":", "-.")


def run_dashes(runs):
    """A line style per run, beside :func:`run_colors`: solid while the colours last (20 runs), then dashed,
    dotted, dash-dotted, so no two of up to 80 runs are drawn alike."""
    n = palette_size(runs)
    return [DASHES[(i // n) % len(DASHES)] for i in range(len(runs))]


def named(run):
    """A run's name in a legend or title, with ``(SIMULATED)`` or ``(EMULATED)`` when it was, where it
    stopped when that was before its --iterations (a killed run's curve read as a finished run's), and how
    many of its ranks' logs there are when some are missing (the gap of a 2-rank run with one log was drawn
    as 0 throughout, the timeline and breakdown as the whole run's)."""
    said = [run.kind] if run.kind else []
    stopped, unfinished = run.stopped_early(), run.ps_unfinished()
    if stopped:
        said.append(f"stopped at {stopped[0]:,} of {stopped[1]:,}" + (" rounds" if run.local_steps else ""))
    elif unfinished:                        # (a PS run: its workers share the server's budget)
        said.append("stopped early: {:,} of {:,} gradients".format(*unfinished))
    if run.ranks_logged:
        said.append("logs of {:,} of {:,} ranks".format(*run.ranks_logged))
    return f"{run.label} ({'; '.join(said)})" if said else run.label


def per_run(ax, run, what):
    """``hopdec plot --what gap|timeline|breakdown``: one run's panel, titled with its name."""
    {"gap": gap, "timeline": timeline, "breakdown": breakdown}[what](ax, run)
    ax.set_title(f"{named(run)}:\n{ax.get_title()}")     # (two lines: a long name cut the title off)


def time_label(runs):
    sim = {bool(r.simulated) for r in runs}
    if sim == {True}:
        return "simulated time (virtual s)"
    if sim == {False}:
        return "wall-clock time (s)"
    return "time (s; simulated runs: virtual s)"


def no_loss_reason(run):
    """Why a run logged no training loss, in a few words."""
    if run.simulated:
        return "a timing-only simulation: --math computes it"
    if run.header.get("driver") == "hopdec.optim.HopOptimizer":
        return "a loop of your own: step(loss=...) logs it"
    return "no loss in its records"


def loss_curves(ax_t, ax_k, runs, smooth_k=10, raw_hint="; hopdec plot --smooth 1: raw"):
    lossless = []
    for run, color, ls in zip(runs, run_colors(runs), run_dashes(runs)):
        n = max(len(run.records), 1)
        t, y = run.loss_vs_time()
        if len(t):
            ax_t.plot(t, smooth(y, smooth_k * n), color=color, ls=ls, label=named(run))
        k, yk = run.loss_vs_iter()
        if len(k):
            ax_k.plot(k, smooth(yk, smooth_k), color=color, ls=ls, label=named(run))
        if not len(t):
            lossless.append(run)
    ax_t.set_xlabel(time_label(runs))
    ax_k.set_xlabel("iteration (PS: mini-batches of each worker)" if not any(r.local_steps for r in runs) else
                    "mini-batches of each worker (--local-steps: a round's mean loss at its middle step)")
    # runs without a loss are named with the reason (it said "a timing-only simulation" of a loop of your
    # own that passed no loss to step(), and left such a run out of a mixed legend without a word)
    why = "\n".join(f"{named(r)}: {no_loss_reason(r)}" for r in lossless[:6]) \
        + (f"\n... {len(lossless) - 6} more" if len(lossless) > 6 else "")
    for ax in (ax_t, ax_k):
        ax.set_ylabel("training loss (mean over workers)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
            if lossless:        # under the axis label, where it covers no curve (it was drawn over them)
                ax.annotate("no training loss logged:\n" + why, xy=(0, 0), xycoords=("axes fraction", ax.xaxis.label),
                            xytext=(0, -3), textcoords="offset points", ha="left", va="top", color="0.4", fontsize=7)
        else:
            ax.text(0.5, 0.5, "no training loss in these logs\n" + why, ha="center",
                    va="center", transform=ax.transAxes, color="0.4")
    # (the curves are trailing means: said, so a reader does not take the lag for the logged values)
    how = f" (trailing mean of {smooth_k} iterations{raw_hint})" if smooth_k > 1 else ""
    ax_t.set_title("loss against time" + how, fontsize=10)
    ax_k.set_title("loss against iterations" + how, fontsize=10)


def accuracy_curves(ax, runs):
    drawn = False
    for run, color, ls in zip(runs, run_colors(runs), run_dashes(runs)):
        ev = [e for e in run.evals if e.get("test_acc") is not None and e.get("time") is not None]
        if not ev:
            continue
        t0 = run.t0
        ax.plot([e["time"] - t0 for e in ev], [e["test_acc"] for e in ev], marker="o", ls=ls, ms=3, color=color,
                label=named(run))
        drawn = True
    ax.set_xlabel(time_label(runs))
    ax.set_ylabel("test accuracy")
    ax.set_title("test accuracy of the server / averaged model")
    if drawn:
        ax.legend(fontsize=7)
    return drawn


def timeline(ax, run):
    """Iteration entered against time, one line per worker: a straggler is the line below the others."""
    import matplotlib as mpl
    tl = run.timeline()
    cmap = mpl.colormaps["viridis"]
    ws = sorted(tl)
    for i, w in enumerate(ws):
        t, k = tl[w]
        ax.step(t, k, where="post", lw=1, color=cmap(i / max(len(ws) - 1, 1)),
                label=f"rank {w}" if len(ws) <= 10 else None)
    ax.set_xlabel(run.time_label)
    ax.set_ylabel(f"round ({run.local_steps} local steps each)" if run.local_steps else "iteration")
    ax.set_title("each worker's iteration over time")
    if len(ws) <= 10:
        ax.legend(fontsize=6, ncol=2)


def binned_max(t, y, bins=120):
    """(bin starts, max of ``y`` in each bin, mean of ``y`` in each bin) over ``bins`` equal time bins;
    empty bins carry the previous value (nothing changed there)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    if not len(t):
        return t, y, y
    edges = np.linspace(t.min(), t.max() + 1e-12, bins + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    hi = np.full(bins, np.nan)
    np.fmax.at(hi, idx, y)
    s, c = np.zeros(bins), np.zeros(bins)
    np.add.at(s, idx, y)
    np.add.at(c, idx, 1)
    mean = np.where(c > 0, s / np.maximum(c, 1), np.nan)
    for arr in (hi, mean):
        for i in range(1, bins):
            if np.isnan(arr[i]):
                arr[i] = arr[i - 1]
    return edges[:-1], hi, mean


def gap(ax, run):
    t, g = run.gap_over_time()
    if len(t):
        tb, hi, mean = binned_max(t, g)
        ax.fill_between(tb, 0, hi, step="post", color="#999999", alpha=0.35, label="largest gap in the window")
        ax.step(tb, mean, where="post", color="#333333", lw=1.2, label="mean gap in the window")
    if run.bound is not None:
        ax.axhline(run.bound, color="#c44e52", ls="--", lw=1.2, label=f"bound {run.bound:g}")
    ax.set_xlabel(run.time_label)
    ax.set_ylabel("max Iter(i) - Iter(j)" + (" (rounds)" if run.local_steps else ""))
    ax.set_title("iteration gap against the bound")
    top = max([run.bound or 0] + list(g)) if len(g) else (run.bound or 1)
    ax.set_ylim(-0.2, top + 1)
    ax.legend(fontsize=7)


BREAKDOWN_ROWS = 32
"""Most bars the time breakdown draws: more workers are drawn as groups of consecutive ranks (their mean)."""


def breakdown(ax, run):
    """Stacked horizontal bars: each worker's time by part (above :data:`BREAKDOWN_ROWS` workers, each group
    of consecutive ranks' mean: 1,024 bars and labels were a black smear that took 15 s to draw)."""
    b = run.breakdown()
    ws = sorted(b)
    parts = [p for p in PART_COLORS if any(p in b[w] for w in ws)]
    parts += sorted({p for w in ws for p in b[w]} - set(parts))
    size = -(-len(ws) // BREAKDOWN_ROWS)                # ranks per bar (1 up to BREAKDOWN_ROWS workers)
    groups = [ws[i:i + size] for i in range(0, len(ws), size)]
    left = np.zeros(len(groups))
    # a loop of your own: what hopdec logs as compute is the loop's time between two steps (forward,
    # backward, data, anything else it does), not a gradient hopdec timed -- the legend says so
    loop = run.header.get("driver") == "hopdec.optim.HopOptimizer"
    for p in parts:
        vals = np.array([np.mean([b[w].get(p, 0.0) for w in g]) for g in groups])
        ax.barh(range(len(groups)), vals, left=left, color=PART_COLORS.get(p, None), height=0.7,
                label="your loop (between steps)" if loop and p == "compute" else p)
        left += vals
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([f"rank {g[0]}" if len(g) == 1 else f"ranks {g[0]}-{g[-1]}" for g in groups],
                       fontsize=7 if len(groups) <= 16 else 5)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds{' (virtual)' if run.simulated else ''}")
    ax.set_title("where each worker's time went" if size == 1 else
                 f"where the workers' time went (mean of each {size} ranks)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(len(parts), 5),
              frameon=False)


def consensus(ax, runs, single=False):
    drawn = False
    n = palette_size(runs)      # (past 20 runs the colours repeat: the markers differ)
    for i, (run, color) in enumerate(zip(runs, run_colors(runs))):
        ev = run.consensus()
        if not ev:
            continue
        at = [e["at"] for e in ev]
        ax.plot(at, [e["dist_mean"] for e in ev], "osDP"[i // n % 4] + "-", ms=3, color=color,
                label="mean over workers" if single else f"{named(run)}: mean")
        ax.plot(at, [e["dist_max"] for e in ev], "^v<>"[i // n % 4] + "--", ms=3, color=color, alpha=0.6,
                label="max (farthest worker)" if single else f"{named(run)}: max")
        drawn = True
    without = [named(r) for r in runs if not r.consensus()]
    if drawn and without:       # named in the legend, not left out without a word
        ax.plot([], [], " ", label="no rounds logged: " + ", ".join(without[:6])
                + (f" and {len(without) - 6} more" if len(without) > 6 else ""))
    ax.set_xlabel("iteration")
    ax.set_ylabel("||x_i - mean x||")
    ax.set_title("consensus distance")
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    return drawn


def staleness(ax, run):
    st = [x for xs in run.staleness_of().values() for x in xs]
    applied = [s for s in st if s >= 0]
    if applied:
        ax.hist(applied, bins=np.arange(-0.5, max(applied) + 1.5), color="#4c72b0")
    drops = run.server_drops()           # a last gradient discarded after the stop is not a drop
    dropped = sum(drops.values()) if drops is not None else sum(1 for s in st if s == -1)
    ax.set_xlabel("staleness of an applied gradient (server updates since its weights)")
    ax.set_ylabel("gradients")
    ax.set_title(f"staleness ({dropped} dropped)")


def gap_matrix(ax, run):
    m = run.gap_matrix()
    if m is None:
        return False
    im = ax.imshow(m, cmap="Reds", vmin=0, vmax=max(int(m.max()), int(run.bound or 0), 1))
    ax.set_xlabel("j")
    ax.set_ylabel("i")
    ax.set_title("largest Iter(i) - Iter(j) seen")
    ws = run.workers
    if len(ws) <= 16:
        ax.set_xticks(range(len(ws)))
        ax.set_xticklabels(ws, fontsize=6)
        ax.set_yticks(range(len(ws)))
        ax.set_yticklabels(ws, fontsize=6)
        for i in range(len(ws)):
            for j in range(len(ws)):
                dark = m[i, j] > 0.6 * max(int(m.max()), 1)
                ax.text(j, i, int(m[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.grid(False)
    import matplotlib.pyplot as plt
    plt.colorbar(im, ax=ax, fraction=0.046)
    return True
