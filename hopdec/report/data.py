"""Reading a run directory (``--log-dir``) into the figures a report shows.

A run directory holds ``rank{r}.jsonl`` (a header line ``{"rank": r, "run": {...}}``, iteration
records with an ``iter`` key, events with an ``event`` key) and, from the simulator and the
decentralized evaluations, ``eval.jsonl``. The same reader takes real runs, parameter-server runs and
simulated runs: a header with ``simulated`` makes every time a *virtual* time, and every label says so.

Only JSON is read (``json.loads``); a line that does not parse -- the last line of a killed rank -- is
counted and skipped, never executed or unpickled.
"""

import glob
import json
import math
import os
import re

import numpy as np

WAIT_KINDS = ("updates", "tokens", "acks")


def _read_jsonl(path):
    rows, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                bad += 1
    return rows, bad


class Run:
    """One run: ``header`` (rank 0's, or the first rank's), ``records[rank]`` (iteration records, in
    order), ``events[rank]`` (non-iteration lines), ``evals`` (test loss/accuracy over time)."""

    def __init__(self, header, records, events, evals=(), label=None, path=None, bad_lines=0,
                 headers=None):
        self.header = header or {}
        self.headers = headers or {}
        self.records = {int(r): v for r, v in records.items() if v}
        self.events = {int(r): v for r, v in events.items()}
        self.evals = list(evals)
        self.label = label or "run"
        self.path = path
        self.bad_lines = bad_lines
        if self.mode == "ps":
            self.evals += [e for e in self.events.get(0, []) if e.get("event") == "eval"]
        self.evals.sort(key=lambda e: e.get("time", 0.0))

    @classmethod
    def load(cls, path, label=None):
        files = glob.glob(os.path.join(path, "rank*.jsonl"))
        ranked = sorted((int(m.group(1)), f) for f in files
                        if (m := re.fullmatch(r"rank(\d+)\.jsonl", os.path.basename(f))))
        if not ranked:
            raise FileNotFoundError(f"{path}: no rank*.jsonl (a --log-dir of hopdec train or hopdec sim)")
        headers, records, events, bad = {}, {}, {}, 0
        for r, f in ranked:
            rows, b = _read_jsonl(f)
            bad += b
            headers[r] = next((x["run"] for x in rows if isinstance(x.get("run"), dict)), {})
            records[r] = [x for x in rows if "iter" in x and "event" not in x]
            events[r] = [x for x in rows if "event" in x]
        evals = []
        ev_path = os.path.join(path, "eval.jsonl")
        if os.path.exists(ev_path):
            evals, b = _read_jsonl(ev_path)
            bad += b
        ids = {}
        for r, h in headers.items():                # one run per directory: never merge two runs' ranks
            if isinstance(h, dict) and isinstance(h.get("run_id"), str):
                ids.setdefault(h["run_id"], r)
        if len(ids) > 1:
            (a, ra), (b, rb) = sorted(ids.items(), key=lambda kv: kv[1])[:2]
            raise FileNotFoundError(f"{path}: rank files of {len(ids)} different runs (rank{ra}.jsonl is run {a}, "
                                    f"rank{rb}.jsonl run {b}); give each run its own --log-dir")
        header = headers.get(0) or next(iter(headers.values()))
        return cls(header, records, events, evals, label=label or os.path.basename(os.path.normpath(path)),
                   path=path, bad_lines=bad, headers=headers)

    @classmethod
    def from_parts(cls, header, records, events, label=None):
        return cls(header, records, events, label=label)

    # ---- what kind of run ----
    @property
    def mode(self):
        return self.header.get("mode", "decentralized")

    @property
    def simulated(self):
        """The simulator's label (e.g. ``SIMULATED (timing only)``), or None for a real run."""
        s = self.header.get("simulated")
        return s if s else None

    @property
    def time_unit(self):
        return "virtual s" if self.simulated else "s"

    @property
    def time_label(self):
        return "simulated time (virtual s)" if self.simulated else "wall-clock time (s)"

    @property
    def workers(self):
        return sorted(self.records)

    @property
    def iterations(self):
        return self.header.get("iterations")

    @property
    def bound(self):
        b = self.header.get("gap_bound")
        return None if b is None or (isinstance(b, float) and not math.isfinite(b)) else b

    @property
    def t0(self):
        """The start: the earliest record (or server event) time."""
        ts = [v[0]["time"] for v in self.records.values() if v and "time" in v[0]]
        ts += [e["time"] for e in self.events.get(0, []) if isinstance(e.get("time"), (int, float))]
        return min(ts) if ts else 0.0

    def events_of(self, name, rank=None):
        ranks = [rank] if rank is not None else sorted(self.events)
        return [e for r in ranks for e in self.events.get(r, []) if e.get("event") == name]

    def describe(self):
        h = self.header
        if self.mode == "ps":
            s = f"PS --sync {h.get('sync')}"
            st = h.get("settings") or {}
            if st:
                s += " " + " ".join(f"{k}={v}" for k, v in st.items())
        else:
            s = f"{h.get('setting', 'decentralized')} ({h.get('protocol')}) on {h.get('topology')}"
        return s

    # ---- series ----
    def loss_vs_time(self):
        """(t, mean over workers of each one's latest loss), one point per record of any worker."""
        t0 = self.t0
        events = sorted((r["time"], w, r["loss"]) for w, recs in self.records.items() for r in recs
                        if r.get("loss") is not None)
        latest, ts, ys, total = {}, [], [], 0.0
        for t, w, loss in events:
            total += loss - latest.get(w, 0.0)
            latest[w] = loss
            ts.append(t - t0)
            ys.append(total / len(latest))
        return np.array(ts), np.array(ys)

    def loss_vs_iter(self):
        by = {}
        for recs in self.records.values():
            for r in recs:
                if r.get("loss") is not None:
                    by.setdefault(r["iter"], []).append(r["loss"])
        its = sorted(by)
        return np.array(its), np.array([np.mean(by[k]) for k in its])

    def timeline(self):
        """{rank: (times since start, iterations entered)}."""
        t0 = self.t0
        return {w: (np.array([r["time"] - t0 for r in recs]), np.array([r["iter"] for r in recs]))
                for w, recs in self.records.items()}

    def gap_over_time(self):
        """(t, largest Iter(i) - Iter(j) at t) after each iteration entered, once every worker started
        (:func:`hopdec.report.gaps.gap_sweep`)."""
        from hopdec.report.gaps import gap_sweep
        entries = [[(r["time"], r["iter"]) for r in recs] for recs in self.records.values()]
        sweep = list(gap_sweep(entries))
        return np.array([t - self.t0 for t, _ in sweep]), np.array([g for _, g in sweep])

    def gap_matrix(self, limit=64):
        """Largest observed Iter(i) - Iter(j) for every ordered pair of workers (None above ``limit``)."""
        if len(self.records) > limit:
            return None
        from hopdec.report.gaps import max_iteration_gap
        return max_iteration_gap([[(r["time"], r["iter"]) for r in self.records[w]] for w in self.workers])

    def consensus(self):
        """Rank 0's consensus-distance rounds, in iteration order."""
        return sorted(self.events_of("consensus", 0), key=lambda e: e["at"])

    # ---- where the time goes ----
    def breakdown(self):
        """{rank: {part: seconds}} over the run: compute, waits by what, reduce, send, apply (PS: push),
        and ``other`` (the rest of the time between its first and last iteration)."""
        out = {}
        for w, recs in self.records.items():
            parts = {"compute": 0.0}
            for r in recs:
                parts["compute"] += r.get("compute_s", 0.0) or 0.0
                classified = 0.0
                for kind in WAIT_KINDS:
                    v = r.get(f"wait_{kind}_s")
                    if v:
                        parts[f"wait {kind}"] = parts.get(f"wait {kind}", 0.0) + v
                        classified += v
                rest = (r.get("wait_s", 0.0) or 0.0) - classified
                if rest > 1e-9:
                    key = "wait for server" if self.mode == "ps" else "wait (other)"
                    parts[key] = parts.get(key, 0.0) + rest
                if r.get("wait_sends_s"):
                    parts["wait sends"] = parts.get("wait sends", 0.0) + r["wait_sends_s"]
                for key in ("reduce", "send", "apply", "push"):
                    v = r.get(f"{key}_s")
                    if v:
                        parts[key] = parts.get(key, 0.0) + v
            if len(recs) > 1 and self.mode != "ps":
                span = recs[-1]["time"] - recs[0]["time"]
                last = recs[-1]
                inside = sum(parts.values()) - sum((last.get(f"{k}_s") or 0.0) for k in
                                                   ("compute", "wait", "wait_sends", "reduce", "send", "apply"))
                parts["other"] = max(0.0, span - inside)
            out[w] = parts
        return out

    # ---- counters ----
    def counters(self):
        """Mechanism counters summed or taken over the run, per worker and in total."""
        rows = {}
        mb = self.header.get("message_bytes")
        for w, recs in self.records.items():
            last = recs[-1] if recs else {}
            c = dict(iterations=len(recs), jumps=sum(1 for r in recs if "jumped_from" in r))
            if self.mode == "ps":
                st = [r["staleness"] for r in recs if isinstance(r.get("staleness"), int)]
                c["staleness_mean"] = float(np.mean([s for s in st if s >= 0])) if any(s >= 0 for s in st) else None
                c["staleness_max"] = max(st) if st else None
                c["dropped"] = sum(1 for s in st if s == -1)
                pushes = [r["t_push"] for r in recs if r.get("t_push") is not None]
                c["push_interval_s"] = float(np.mean(np.diff(pushes))) if len(pushes) > 1 else None
            else:
                c["updates_used"] = last.get("used_total")
                c["updates_dropped"] = last.get("dropped_total")
                c["messages_sent"] = sum(r.get("sent", 0) for r in recs)
                c["sends_skipped"] = sum(r.get("send_skipped", 0) for r in recs)
                c["bytes_sent"] = c["messages_sent"] * mb if mb else None
                toks = [r["tokens"] for r in recs if r.get("tokens") is not None]
                c["tokens_min"] = min(toks) if toks else None
                held = [r["held"] for r in recs if r.get("held") is not None]
                c["held_max"] = max(held) if held else None
            rows[w] = c
        return rows

    def edges(self):
        """{(sender, receiver): messages} from the records' ``sent_to`` lists (decentralized runs)."""
        out = {}
        for w, recs in self.records.items():
            for r in recs:
                for d in r.get("sent_to", ()):
                    out[(w, d)] = out.get((w, d), 0) + 1
        return out

    def final(self):
        """Final figures: train loss (mean of the workers' last), test accuracy when evaluated, duration."""
        last_losses = [next((r["loss"] for r in reversed(recs) if r.get("loss") is not None), None)
                       for recs in self.records.values()]
        last_losses = [v for v in last_losses if v is not None]
        acc = loss = None
        summary = self.events_of("summary", 0)
        if summary:
            acc, loss = summary[-1].get("test_acc"), summary[-1].get("test_loss")
        elif self.evals:
            acc, loss = self.evals[-1].get("test_acc"), self.evals[-1].get("test_loss")
        ends = [recs[-1]["time"] + sum((recs[-1].get(k) or 0.0) for k in ("compute_s", "wait_s", "reduce_s"))
                for recs in self.records.values() if recs]
        duration = (max(ends) - self.t0) if ends else None
        if summary and summary[-1].get("elapsed") is not None:
            duration = summary[-1]["elapsed"]
        rates = []
        for recs in self.records.values():
            if len(recs) > 1 and recs[-1]["time"] > recs[0]["time"]:
                rates.append((recs[-1]["iter"] - recs[0]["iter"]) / (recs[-1]["time"] - recs[0]["time"]))
        return dict(train_loss=float(np.mean(last_losses)) if last_losses else None, test_acc=acc,
                    test_loss=loss, duration=duration, rate=float(np.mean(rates)) if rates else None)
