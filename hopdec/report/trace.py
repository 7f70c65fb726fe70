"""A run as a timeline: Chrome/Perfetto Trace Event JSON, one track per rank.

Open the file in https://ui.perfetto.dev (or chrome://tracing). Format: the JSON Object Format of the
Trace Event spec -- ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` with
complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds from the run's start), instant events
(``"i"``), counters (``"C"``), flow arrows (``"s"``/``"f"``, bound to the enclosing slices) and
metadata (``"M"``: process and thread names, sort order).

Each rank is a process named ``rank r`` with one thread track. Decentralized runs (records with
``spans``, :func:`hopdec.runtime.hop_loop.worker_loop` with ``spans=True``): one slice per iteration with
its parts nested inside -- ``compute``, ``send -> 1,2``, ``wait updates (3)`` (what the core waited for,
and on whom), ``reduce``, ``apply`` --, an instant per jump, an arrow from each update's send to the
Reduce that used it, counters for the token count and the updates held. Parameter-server runs: the
workers' wait for the server, compute and push, the server's applies, drops and barrier decisions.
A ``whole run`` process carries the consensus distance and the largest iteration gap as counters;
failures are global instants. A simulated run's times are virtual seconds, and the trace says so.
"""

import json
import math

from hopdec.report.data import record_end


def _us(t, t0):
    return round((t - t0) * 1e6, 3)


def build_trace(run):
    """The Trace Event JSON object (a dict) of a :class:`hopdec.report.data.Run`."""
    t0 = run.t0
    ev = []
    ranks = sorted(set(run.records) | ({0} if run.mode == "ps" else set()))
    whole = (max(ranks) if ranks else 0) + 2

    def meta(pid, name, sort):
        ev.append(dict(ph="M", name="process_name", pid=pid, tid=1, args=dict(name=name)))
        ev.append(dict(ph="M", name="process_sort_index", pid=pid, tid=1, args=dict(sort_index=sort)))
        ev.append(dict(ph="M", name="thread_name", pid=pid, tid=1, args=dict(name=name)))

    for r in ranks:
        meta(r + 1, "rank 0 (server)" if run.mode == "ps" and r == 0 else f"rank {r}", r)
    meta(whole, f"whole run -- {run.simulated}: virtual seconds" if run.simulated else "whole run", -1)

    if run.mode == "ps":
        _ps_workers(run, ev, t0)
        _ps_server(run, ev, t0)
    else:
        _hop_workers(run, ev, t0)

    for e in run.consensus():
        ts = _us(e["time"], t0)
        ev.append(dict(ph="C", name="consensus distance", pid=whole, tid=1, ts=ts,
                       args=dict(mean=e["dist_mean"], max=e["dist_max"])))
    ts, gaps = run.gap_over_time()
    last = None
    for t, g in zip(ts, gaps):
        if g != last:
            ev.append(dict(ph="C", name="largest iteration gap", pid=whole, tid=1, ts=round(t * 1e6, 3),
                           args=dict(gap=int(g))))
            last = g
    _failures(run, ev, t0)
    other = dict(tool="hopdec", run=run.label, mode=run.mode,
                 time="virtual seconds (simulated)" if run.simulated else "wall-clock seconds",
                 describe=run.describe())
    if run.simulated:
        other["simulated"] = run.simulated
    if run.conditions():
        other["conditions"] = run.conditions()
    if run.stopped_early():                 # (the timeline of a killed run ends as a finished one's does)
        other["stopped_early"] = "at iteration {:,} of {:,}".format(*run.stopped_early())
    elif run.ps_unfinished():               # (a PS run whose server wrote no summary)
        other["stopped_early"] = "{:,} of {:,} gradients pushed".format(*run.ps_unfinished())
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": other}


def _failures(run, ev, t0):
    """One global instant per failure: the live trace's ``failure`` events, else (a trace rebuilt from logs)
    the ``heal`` events every survivor logged, each heal once."""
    seen = set()
    for kind in ("failure", "heal"):
        for r, evs in sorted(run.events.items()):
            for e in evs:
                t = e.get("time")
                if e.get("event") != kind or not isinstance(t, (int, float)) or isinstance(t, bool):
                    continue
                failed = e.get("failed") if isinstance(e.get("failed"), list) else []
                key = (round(t, 6), tuple(x for x in failed if isinstance(x, int)))
                if key in seen:
                    continue
                seen.add(key)
                who = ", ".join(map(str, key[1])) or "?"
                surv = e.get("survivors") if isinstance(e.get("survivors"), list) else []
                name = f"failure: rank(s) {who} died; {len(surv)} survivors healed" if kind == "heal" or \
                    not e.get("what") else f"failure: {e.get('what')}"
                ev.append(dict(ph="i", s="g", name=name[:120], cat="failure", pid=r + 1, tid=1,
                               ts=_us(t, t0), args={k: v for k, v in e.items() if k != "event"}))


def _hop_workers(run, ev, t0):
    send_at = {}                                      # (rank, iteration) -> ts inside its send slice
    flows = []
    for w, recs in run.records.items():
        pid = w + 1
        for i, rec in enumerate(recs):
            start = rec["time"]
            spans = rec.get("spans") or []
            end = recs[i + 1]["time"] if i + 1 < len(recs) else \
                max([start + s[1] + s[2] for s in spans] + [record_end(rec), start + 1e-6])   # (the last)
            ev.append(dict(ph="X", name=f"iteration {rec['iter']}", cat="iteration", pid=pid, tid=1,
                           ts=_us(start, t0), dur=max(round((end - start) * 1e6, 3), 0.001),
                           args=dict(iteration=rec["iter"], loss=rec.get("loss"))))
            reduces = iter(rec.get("reduced") or [])
            for kind, off, dur, detail in spans:
                ts = _us(start + off, t0)
                d = max(round(dur * 1e6, 3), 0.001)
                args = {}
                if kind == "send":
                    name = "send -> " + ",".join(map(str, detail or []))
                    args["to"] = detail
                    send_at[(w, rec["iter"])] = ts + d / 2
                elif kind == "wait":
                    what, on = detail
                    short = what.split()[0].lower()
                    name = f"wait {short} ({','.join(map(str, on))})"
                    args.update(waiting_for=what, on=on)
                elif kind == "reduce":
                    name = "reduce"
                    terms = next(reduces, [])
                    args["terms"] = terms
                    for sender, k, _ in terms:
                        if sender != w:
                            flows.append(((sender, k), pid, ts + d / 2))
                elif kind == "jump":
                    ev.append(dict(ph="i", s="t", name=f"jump {detail[0]} -> {detail[1]}", cat="jump",
                                   pid=pid, tid=1, ts=ts))
                    continue
                else:
                    name = kind
                ev.append(dict(ph="X", name=name, cat=kind, pid=pid, tid=1, ts=ts, dur=d, args=args))
            counters = {k: rec[k] for k in ("tokens", "held") if isinstance(rec.get(k), (int, float))}
            if counters:
                ev.append(dict(ph="C", name="queues", pid=pid, tid=1, ts=_us(start, t0), args=counters))
    for n, (src, pid, ts) in enumerate(flows):
        if src not in send_at:
            continue
        ev.append(dict(ph="s", name="update", cat="update", id=n, pid=src[0] + 1, tid=1, ts=send_at[src]))
        ev.append(dict(ph="f", bp="e", name="update", cat="update", id=n, pid=pid, tid=1, ts=ts))


def _ps_workers(run, ev, t0):
    for w, recs in run.records.items():
        pid = w + 1
        prev_end = None
        for rec in recs:
            begin = rec.get("t_recv", rec["time"])
            if prev_end is not None and begin > prev_end:
                ev.append(dict(ph="X", name="wait for server", cat="wait", pid=pid, tid=1,
                               ts=_us(prev_end, t0), dur=round((begin - prev_end) * 1e6, 3)))
            c = rec.get("compute_s") or 0.0
            ev.append(dict(ph="X", name=f"compute {rec['iter']}", cat="compute", pid=pid, tid=1,
                           ts=_us(begin, t0), dur=max(round(c * 1e6, 3), 0.001),
                           args=dict(iteration=rec["iter"], version=rec.get("version"), loss=rec.get("loss"),
                                     staleness=rec.get("staleness"))))
            prev_end = begin + c
            if rec.get("t_push") is not None:
                p = rec.get("push_s") or 0.0
                ev.append(dict(ph="X", name="push", cat="send", pid=pid, tid=1, ts=_us(rec["t_push"], t0),
                               dur=max(round(p * 1e6, 3), 0.001)))
                prev_end = rec["t_push"] + p


def _ps_server(run, ev, t0):
    for e in run.events.get(0, []):
        t = e.get("time")
        if not isinstance(t, (int, float)):
            continue
        kind = e.get("event")
        ts = _us(t, t0)
        if kind == "apply":
            ev.append(dict(ph="X", name=f"apply v{e.get('version')} <- {e.get('workers')}", cat="apply", pid=1,
                           tid=1, ts=ts, dur=max(round((e.get("dur") or 0.0) * 1e6, 3), 0.001),
                           args=dict(workers=e.get("workers"), staleness=e.get("staleness"))))
        elif kind in ("drop", "note", "release", "stop"):
            name = {"drop": f"drop rank {e.get('worker')}", "note": f"{e.get('what')}",
                    "release": f"send weights -> {e.get('workers')}", "stop": "stop"}[kind]
            ev.append(dict(ph="i", s="t", name=name[:120], cat=kind, pid=1, tid=1, ts=ts,
                           args={k: v for k, v in e.items() if k not in ("event", "time")}))
        elif kind == "eval" and e.get("test_acc") is not None:
            ev.append(dict(ph="C", name="server test accuracy", pid=1, tid=1, ts=ts,
                           args=dict(acc=e["test_acc"])))


def write_trace(run, path):
    """Write :func:`build_trace` of ``run`` to ``path`` (strict JSON: no NaN or Infinity)."""
    from hopdec.files import writing
    obj = _clean(build_trace(run))
    with writing(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"), allow_nan=False)
    return obj


def _clean(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)
