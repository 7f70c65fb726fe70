"""``hopdec report``: one self-contained HTML page comparing runs (plots embedded as PNG, no scripts).

The page, top to bottom: a table with one row per run (what it was, how long it took, final loss and
accuracy, the largest iteration gap against its bound, how much of the workers' time was waiting);
loss against time and against iterations for every run; test accuracy over time where runs evaluated;
consensus distance; then one section per run (each worker's iteration over time, the gap over time
against the bound, where each worker's time went, the gap matrix or the staleness of applied
gradients, mechanism counters, the run's settings). Simulated runs are labelled as such and their
times are virtual seconds.
"""

import base64
import datetime
import html
import io
import json
import math

from hopdec.report import plots
from hopdec.report.data import _num


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(fig, alt):
    return f'<img alt="{html.escape(alt)}" src="{_png(fig)}">'


def _fmt(v, digits=4):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "∞" if v > 0 else "–"
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple, dict)):
        return html.escape(json.dumps(v))
    return html.escape(str(v))


def _table(headers, rows, cls=""):
    out = [f'<table class="{cls}"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def glance_rows(runs):
    rows = []
    for run in runs:
        f = run.final()
        _, gaps = run.gap_over_time()
        biggest = int(gaps.max()) if len(gaps) else None
        b = run.breakdown()
        total = sum(sum(p.values()) for p in b.values())
        waiting = sum(v for p in b.values() for k, v in p.items() if k.startswith("wait") or k == "push")
        cons = run.consensus()
        unit = run.time_unit
        gap_txt = "–" if biggest is None else f"{biggest}" + (f" / {run.bound:g}" if run.bound is not None else "")
        if run.bound is not None and biggest is not None and biggest > run.bound:
            gap_txt = f'<b class="bad">{gap_txt} EXCEEDED</b>'
        cond = run.conditions()
        rows.append([
            f"<b>{html.escape(run.label)}</b>" + (f'<br><span class="sim">{html.escape(run.simulated)}</span>'
                                                   if run.simulated else "")
            + (f'<br><span class="{"sub" if run.simulated else "sim"}">{html.escape(cond)}</span>' if cond else "")
            + (f'<br><span class="sub">{html.escape(run.resumed())}</span>' if run.resumed() else ""),
            html.escape(run.describe()),
            str(len(run.records)) + (f'<br><b class="bad">{html.escape(run.missing.split(":")[0])}</b>'
                                     if run.missing else ""),
            _iterations(run),
            (_fmt(f["duration"]) + f" {unit}") if f["duration"] is not None else "–",
            _rate(run, f["rate"], f.get("batch_rate")),
            _fmt(f["train_loss"]),
            _fmt(f["test_acc"]),
            gap_txt,
            f"{100 * waiting / total:.0f}%" if total else "–",
            f"{_fmt(cons[-1]['dist_mean'])} at {cons[-1]['at']}" if cons else "–",
        ])
    return rows


def _rate(run, rate, batch_rate=None):
    """Iterations per second per worker; a ``--local-steps H`` run's are rounds, and it says so, with the
    mini-batches per second beside (``batch_rate``: the inner steps of the rounds each worker computed
    between its first and last round's start). It read "4.717" beside a plain run's "25.95" iter/s, a run
    computing 18.9 gradients a second against one computing 26; and it was H x the rounds/s, which counts
    the rounds a jump (--skip) passes without computing them: 4.08 mini-batches/s where 3.48 were computed."""
    if rate is None or not run.local_steps:
        return _fmt(rate)
    return f"{_fmt(rate)} rounds/s ({_fmt(batch_rate if batch_rate is not None else rate * run.local_steps)} " \
           f"mini-batches/s)"


def _iterations(run):
    """The iterations a run was asked for (a ``--local-steps`` run's are rounds, and it says so), and how far
    it got when it stopped before (Ctrl-C, a failure)."""
    text = _planned(run)
    if not run.local_steps or text == "–":
        return text
    unit = f" rounds of {run.local_steps}"
    return text.replace(" (stopped early)", unit + " (stopped early)") if text.endswith("(stopped early)") \
        else text + unit


def _planned(run):
    """The iterations a run was asked for, and how far it got when it stopped before (Ctrl-C, a failure);
    PS runs count mini-batches against a shared budget, so theirs is the planned figure, and one whose server
    wrote no summary (killed) says how much of the budget was pushed; a loop of your own plans none: how far
    it got."""
    planned, ran = run.iterations, run.iterations_run()
    unfinished = run.ps_unfinished()
    if unfinished and planned is not None:
        done, budget = unfinished
        return f"{_fmt(planned)} (stopped early: {done:,} of {budget:,} gradients)"
    if run.stopped_early():
        return f"{ran} of {_fmt(planned)} (stopped early)"
    if planned is None and ran is not None and run.mode != "ps":   # a user's loop: nothing was planned
        return _fmt(ran)
    return _fmt(planned)


GLANCE = ["run", "what", "workers", "iterations", "duration", "iter/s per worker", "final train loss",
          "test accuracy", "largest gap / bound", "time waiting", "consensus distance (last round)"]


def run_section(run, idx):
    plt = plots.matplotlib()
    parts = [f'<h2 id="run{idx}">{html.escape(run.label)} <small>{html.escape(run.describe())}</small></h2>']
    if run.simulated:
        parts.append(f'<p class="sim">{html.escape(run.simulated)}: every time on this page is virtual '
                     f'(seconds of the simulator\'s clock), not measured.</p>')
    cond = run.conditions()
    if cond and not run.simulated:
        parts.append(f'<p class="sim">{html.escape(cond)}: this run\'s times were measured under these '
                     f'emulated conditions.</p>')
        measured = run.measured_links()
        if measured:
            parts.append(f'<p class="cap">The emulated links as measured before the run (TCP, one pair per '
                         f'distinct setting): {html.escape(measured)}.</p>')
    elif cond:
        parts.append(f'<p class="sub">Simulated conditions: {html.escape(cond)}.</p>')
    if run.resumed():
        cut = ("; what had run after that checkpoint was cut from the logs and ran again" if run.paused else "")
        parts.append(f'<p class="note">{html.escape(run.resumed())} (the run was stopped or killed, then '
                     f'resumed from a checkpoint{cut}).</p>')
    if run.missing:
        parts.append(f'<p class="note">{html.escape(run.missing[0].upper() + run.missing[1:])}.</p>')
    parts.append(_failures_html(run))
    if run.bad_lines:
        parts.append(f'<p class="note">{run.bad_lines} unreadable log line(s) skipped (a rank killed while '
                     f'writing its last record).</p>')
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.6))
    plots.timeline(axes[0, 0], run)
    plots.gap(axes[0, 1], run)
    plots.breakdown(axes[1, 0], run)
    if run.mode == "ps":
        plots.staleness(axes[1, 1], run)
    elif not plots.consensus(axes[1, 1], [run], single=True):
        if not plots.gap_matrix(axes[1, 1], run):
            axes[1, 1].set_visible(False)
    fig.tight_layout()
    parts.append(_img(fig, f"{run.label}: timeline, gap, time breakdown"))
    parts.append('<p class="cap">Top left: a worker whose line falls behind is a straggler; flat steps are '
                 'waits. Top right: the largest gap between any two workers at each moment; it must stay '
                 'under the dashed bound. Bottom left: where each worker\'s time went (waits are split by '
                 'what the protocol waited for; "wait sends": a Reduce waiting for the last sends of its parameters '
                 'to complete, i.e. for a slow receiver; "poll": handing over the messages that arrived between '
                 'actions -- with more ranks than cores MPI yields the core to another rank there, so it is '
                 'large on an oversubscribed host; "watching": live progress, consensus rounds and rank 0\'s evaluations on '
                 'the rank\'s own path, as the observer measured them; "other": logging, the loop, scheduling). '
                 + ('Bottom right: how stale the gradients the server applied were.' if run.mode == "ps" else
                    'Bottom right: how far the workers\' models are from their average (lower is better '
                    'agreement).' if run.consensus() else 'Bottom right: the largest gap seen per pair.')
                 + '</p>')
    if run.mode != "ps" and run.consensus() and len(run.records) <= 64:
        fig, ax = plt.subplots(figsize=(4.2, 3.6))
        plots.gap_matrix(ax, run)
        parts.append('<div class="row">' + _img(fig, "gap matrix") + '<div class="side">'
                     + _counters_html(run) + "</div></div>")
    else:
        parts.append(_counters_html(run))
    parts.append(_ps_decisions(run) if run.mode == "ps" else "")
    parts.append(_settings_html(run))
    return "\n".join(parts)


def _since(t, run):
    """A logged time as seconds into the run (a real run logs seconds since the epoch)."""
    return _fmt(t - run.t0 if isinstance(t, (int, float)) and not isinstance(t, bool) else None)


def _failures_html(run):
    """The heals of a ``--fault-tolerance`` run (a survivor's ``heal`` events; simulated deaths say so)."""
    heals = next((h for h in (run.events_of("heal", r) for r in sorted(run.events)) if h), [])
    what = "Simulated deaths" if run.simulated else "Failures"
    dropped = [e for e in run.events_of("note", 0) if e.get("what") == "failure"] if run.mode == "ps" else []
    if dropped:                         # the parameter server: no heal, the server drops the worker
        items = "".join(f"<li>worker {html.escape(str(e.get('worker')))} "
                        + (f"died at {_since(e.get('died_at'), run)} {run.time_unit}; " if "died_at" in e else "")
                        + f"the server dropped it at {_since(e.get('time'), run)} {run.time_unit}, after its "
                        f"{_fmt(e.get('work'))} mini-batches</li>" for e in dropped[:20])
        more = f"<li>… {len(dropped) - 20} more</li>" if len(dropped) > 20 else ""
        return f'<p class="note">{what} ({len(dropped)} worker(s), times from the start; the server drops a ' \
               f'dead worker once it finds it and the others go on, as --fault-tolerance does; no recovery ' \
               f'stall):</p>' \
               f'<ul>{items}{more}</ul>'
    if not heals:
        return ""
    items = "".join(f"<li>rank(s) {html.escape(', '.join(map(str, h.get('failed', []))))} died; "
                    f"{len(h.get('survivors', []))} survivors healed the graph at {_since(h.get('time'), run)} "
                    f"{run.time_unit}, a stall of {_fmt(h.get('stall_s'))} {run.time_unit}</li>"
                    for h in heals[:20])
    more = f"<li>… {len(heals) - 20} more</li>" if len(heals) > 20 else ""
    return f'<p class="note">{what} ({len(heals)} heal(s), healed by the survivors as --fault-tolerance ' \
           f'does; a dead rank\'s records stop at its death):</p><ul>{items}{more}</ul>'


COUNTER_COLS = {
    "decentralized": [("iterations", "iterations"), ("jumps", "jumps"), ("updates_used", "updates used"),
                      ("updates_dropped", "dropped"), ("messages_sent", "messages sent"),
                      ("sends_skipped", "sends skipped"), ("bytes_sent", "MiB sent"),
                      ("tokens_min", "fewest tokens"), ("held_max", "most updates held")],
    "ps": [("iterations", "mini-batches"), ("staleness_mean", "mean staleness"),
           ("staleness_max", "max staleness"), ("dropped", "dropped"), ("push_interval_s", "push interval s")],
    "allreduce": [("iterations", "iterations"), ("wait_s", "wait all-reduce s"),
                  ("bytes_reduced", "MiB all-reduced (gradient)")],
}


MIB = 2 ** 20
BYTE_COLS = ("bytes_sent", "bytes_reduced")
"""Counters that are bytes: shown in MiB (2^20 bytes), the unit of hopdec sim's ``--message-mb`` and times
line (they were 10^6 bytes under "MB", 4.9% apart from the simulator's figures without a word)."""


def _counters_html(run):
    rows_by = run.counters()
    cols = COUNTER_COLS.get(run.mode, COUNTER_COLS["decentralized"])
    ranks = sorted(rows_by)
    shown = ranks
    note = ""
    if len(ranks) > 24:     # a large run: the first and last 12 workers, and each column's extremes (the
        shown = set(ranks[:12] + ranks[-12:])          # straggler of 1,024 is rarely among the first 12)
        for key, _ in cols:
            have = [w for w in ranks if _num(rows_by[w].get(key))]
            if have:
                shown.add(min(have, key=lambda w: rows_by[w][key]))
                shown.add(max(have, key=lambda w: rows_by[w][key]))
        shown = sorted(shown)
        note = (f'<p class="cap">{len(shown)} of {len(ranks)} workers: the first and last 12 and, for each '
                f'column, a worker with its smallest and one with its largest value.</p>')
    rows = []
    for i, w in enumerate(shown):
        if note and i and w != shown[i - 1] + 1:
            rows.append(["…"] * (len(cols) + 1))
        c = rows_by[w]
        row = [f"rank {w}"]
        for key, _ in cols:
            v = c.get(key)
            if key in BYTE_COLS and v is not None:
                v = v / MIB
            row.append(_fmt(v))
        rows.append(row)
    obs = [e for e in run.events_of("observer") if e.get("records")]
    cost = ""
    if obs:
        per = max(e.get("per_record_ms", 0.0) for e in obs)
        what = ", ".join(k for k in ("progress", "consensus", "tensorboard", "trace") if obs[0].get(k))
        cost = (f'<p class="cap">Watching this run ({what or "nothing"}) cost the workers at most {per:.3g} ms '
                f'per iteration on their own path (measured in the run; polls made while a rank waited '
                f'anyway are not counted).</p>')
    units = ""
    more = {w: c["messages_sent"] - c["messages_logged"] for w, c in rows_by.items()
            if c.get("messages_logged") is not None and c["messages_sent"] != c["messages_logged"]}
    if more:
        listed = ", ".join(f"rank {w} {d:+d}" for w, d in sorted(more.items())[:12]) + (" ..." if len(more) > 12 else "")
        why = (" -- a loop of your own sends its next iteration's parameters before <code>finish()</code> ends "
               "the run" if run.header.get("driver") == "hopdec.optim.HopOptimizer" else "")
        units += (f'<p class="cap">Messages and MiB sent are what each rank\'s transport counted, not the sum of its '
                  f'iteration records ({html.escape(listed)} messages): sent outside a logged iteration{why}.</p>')
    if any(key in BYTE_COLS for key, _ in cols):
        units += ('<p class="cap">MiB = 2^20 bytes (1,048,576), as <code>hopdec sim --message-mb</code> and its '
                 'times line count them; ' + ('what each worker put on the wire (coded, with '
                                              '<code>--compress</code>).' if run.mode != "allreduce" else
                                              'the gradient each worker all-reduced, not the ring\'s traffic.')
                 + '</p>')
    return ("<h3>Mechanism counters</h3>" + _table(["worker"] + [c for _, c in cols], rows, "num") + note + units
            + cost)


def unused_pushes(unfinished, discarded):
    """How the summary line and the report name the mini-batches computed but not applied at the stop:
    ", 2 pushed into a step the stop left unfinished, 1 computed after the stop (not used)" ("" for none)."""
    return ((f", {unfinished} pushed into a step the stop left unfinished" if unfinished else "")
            + (f", {discarded} computed after the stop (not used)" if discarded else ""))


def _ps_decisions(run):
    notes = run.events_of("note", 0)
    drops = run.events_of("drop", 0)
    applies = run.events_of("apply", 0)
    if not (notes or drops or applies):
        return ""
    kinds = {}
    for n in notes:
        kinds.setdefault(n.get("what"), []).append(n)
    ends = run.events_of("summary", 0)
    after = unused_pushes(*(sum(e.get(k) or 0 for e in ends) for k in ("unfinished", "discarded")))
    lines = [f"<li>{len(applies)} server updates, {len(drops)} gradients dropped{after}</li>"]
    for what, ns in kinds.items():
        sample = {k: v for k, v in ns[-1].items() if k not in ("event", "what", "time")}
        lines.append(f"<li><b>{html.escape(str(what))}</b>: {len(ns)} decisions; last: {_fmt(sample)}</li>")
    return "<h3>Server decisions</h3><ul>" + "".join(lines) + "</ul>"


SKIP_SETTINGS = {"pid", "host", "hparams", "cost_model", "settings", "worker_ranks"}


def _settings_html(run):
    h = run.header
    rows = [[html.escape(k), _fmt(v)] for k, v in h.items() if k not in SKIP_SETTINGS and v is not None]
    for k in ("hparams", "settings"):
        if isinstance(h.get(k), dict) and h[k]:
            rows.append([k, html.escape(", ".join(f"{a}={b}" for a, b in h[k].items()))])
    if isinstance(h.get("cost_model"), dict):
        rows.append(["cost model", _fmt(h["cost_model"])])
    return ('<details><summary>Settings of this run</summary>'
            + _table(["setting", "value"], rows, "settings") + "</details>")


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1250px;
color:#222;padding:0 16px}
h1{margin-bottom:4px} h2{border-top:2px solid #ddd;padding-top:14px;margin-top:34px}
h2 small{font-weight:normal;color:#666;font-size:60%} h3{margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} table.num td{text-align:right} table.num td:first-child,table.glance td:nth-child(2){text-align:left}
.sim{color:#b35900;font-weight:bold} .bad{color:#c00} .note{color:#a00}
.cap{color:#555;font-size:13px;max-width:1100px} img{max-width:100%}
.row{display:flex;gap:20px;align-items:flex-start} .side{flex:1}
details{margin:8px 0} summary{cursor:pointer;color:#444}
.sub{color:#666;font-size:13px}
"""


def render(runs, title="hopdec report"):
    """The report page (a string) for ``runs`` (:class:`hopdec.report.data.Run`)."""
    plt = plots.matplotlib()
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = [f"<h1>{html.escape(title)}</h1>",
            f'<p class="sub">{len(runs)} run(s) · made {now} by <code>hopdec report</code> · '
            + " · ".join(f'<a href="#run{i}">{html.escape(r.label)}</a>' for i, r in enumerate(runs)) + "</p>"]
    if any(r.simulated for r in runs):
        body.append('<p class="sim">Runs marked SIMULATED come from <code>hopdec sim</code>: their times are '
                    'virtual seconds, not measurements.</p>')
    body.append("<h2>At a glance</h2>")
    body.append(_table(GLANCE, glance_rows(runs), "num glance"))
    body.append('<p class="cap">Duration: from the first worker\'s start to the last iteration (PS: the '
                'server\'s time). Iter/s per worker: the mean over the workers (the survivors, where some '
                'died). Largest gap: max over time of the slowest-to-fastest iteration spread, '
                'against Hop Table 1\'s bound (PS: the sync model\'s). Time waiting: the share of the '
                'workers\' time spent waiting for updates, tokens, ACKs, the server or the all-reduce.'
                + (' Under a run\'s name: what its times were taken under (simulated, or emulated slowdowns, '
                   'padded compute or links).' if any(r.conditions() or r.simulated for r in runs) else "")
                + '</p>')
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8))
    plots.loss_curves(a, b, runs)
    fig.tight_layout()
    body.append("<h2>Training</h2>" + _img(fig, "loss curves"))
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.4))
    has_acc = plots.accuracy_curves(a, runs)
    has_cons = plots.consensus(b, runs)
    if has_acc or has_cons:
        if not has_acc:
            a.set_visible(False)
        if not has_cons:
            b.set_visible(False)
        fig.tight_layout()
        body.append(_img(fig, "accuracy and consensus distance"))
        body.append('<p class="cap">Accuracy: the PS server\'s model or the all-reduce workers\' (identical) '
                    'model (<code>--eval-interval</code>), or the '
                    'average of the workers\' models (decentralized runs with <code>--consensus-every</code> and '
                    '<code>--eval-interval</code>, or the simulator with <code>--math</code>). Consensus distance '
                    '(<code>--consensus-every K</code>): how far the workers\' models are from their '
                    'average, mean and farthest worker.</p>')
    else:
        plt.close(fig)
    for i, run in enumerate(runs):
        body.append(run_section(run, i))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title)
            + f"</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
