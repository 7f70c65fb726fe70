"""Reading a run directory (``--log-dir``) into the figures a report shows.

A run directory holds ``rank{r}.jsonl`` (a header line ``{"rank": r, "run": {...}}``, iteration
records with an ``iter`` key, events with an ``event`` key) and, from the simulator and the
decentralized evaluations, ``eval.jsonl``. The same reader takes real runs, parameter-server runs and
simulated runs: a header with ``simulated`` makes every time a *virtual* time, and every label says so.

Logs are read as defensively as topology files (:mod:`hopdec.files`): only regular files of at most
:data:`MAX_LOG_BYTES` (a FIFO or ``/dev/zero`` as a rank log is named and left out, never opened for
reading without end), lines of at most :data:`MAX_LINE_BYTES`, only JSON (never executed or unpickled),
nesting at most :data:`MAX_DEPTH` deep, and every field the figures use checked for its type
(:data:`RECORD_FIELDS`, :data:`EVENT_FIELDS`, :data:`HEADER_FIELDS`; numbers finite). A line that fails
-- the last line of a killed rank, or anything hostile -- is skipped and counted (``Run.bad_lines``,
``Run.notes``), so what the report draws has the types it expects and no time is NaN.
"""

import glob
import json
import math
import os
import re

import numpy as np

from hopdec.errors import ConfigError
from hopdec.files import open_regular, shown

WAIT_KINDS = ("updates", "tokens", "acks")
_REST_OF_WAIT = {"ps": "wait for server", "allreduce": "wait all-reduce"}
MAX_LOG_BYTES = 2 ** 30
"""Largest log file read (1 GiB: 100,000 iterations of a rank with a trace are about 100 MiB)."""
MAX_LINE_BYTES = 2 ** 20
MAX_DEPTH = 12
MAX_INT = 2 ** 53
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def printable(text):
    """``text`` with every lone surrogate (half a UTF-16 pair: a JSON ``"\\udcff"``, or a byte of a path or
    argument that is not UTF-8, as Python holds it) replaced by U+FFFD: neither the page's UTF-8 nor
    matplotlib can take one."""
    return _SURROGATE.sub("\ufffd", text)


def _printable_all(obj):
    """``obj`` (parsed JSON) with :func:`printable` applied to every string in it, keys too."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {_printable_all(k): _printable_all(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_printable_all(v) for v in obj]
    return obj


# ---- what a record may hold --------------------------------------------------------------------------------
def _num(v):
    """A finite number (not a bool; an int small enough to be a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) < MAX_INT if isinstance(v, int) else math.isfinite(v)


MAX_TIME = 2.0 ** 53
"""Largest clock time (seconds, either sign) a log may give: 285 million years, and two such times' difference
stays finite (``time`` 1.7e308 beside -1.7e308, both finite, put an infinite span on a figure's axis and the
tick locator raised)."""


def _time(v):
    """A clock time: a finite number of at most :data:`MAX_TIME` seconds either way."""
    return _num(v) and abs(v) <= MAX_TIME


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < MAX_INT


def _nat(v):
    return _int(v) and v >= 0


def _opt(check):
    return lambda v: v is None or check(v)


def _list_of(check, n=None):
    return lambda v: isinstance(v, list) and (n is None or len(v) == n) and all(check(x) for x in v)


def _str(v):
    return isinstance(v, str)


def _dict(v):
    return isinstance(v, dict)


def _span(v):
    """``[kind, start offset, seconds, detail]`` (see :func:`hopdec.runtime.hop_loop.worker_loop`), the detail
    of the kind the trace reads: send -> ranks, wait -> [what, ranks], jump -> [from, to]."""
    if not (isinstance(v, list) and len(v) == 4 and _str(v[0]) and _num(v[1]) and _num(v[2])):
        return False
    kind, detail = v[0], v[3]
    if kind == "send":
        return detail is None or _list_of(_int)(detail)
    if kind == "wait":
        return isinstance(detail, list) and len(detail) == 2 and _str(detail[0]) and _list_of(_int)(detail[1])
    if kind == "jump":
        return _list_of(_int, 2)(detail)
    return True


_term = _list_of(_num, 3)
RECORD_FIELDS = dict(
    iter=_nat, time=_time, loss=_opt(_num), jumped_from=_opt(_int), jump=_opt(_list_of(_int, 2)),
    staleness=_opt(_int), tokens=_opt(_num), held=_opt(_num), used_total=_opt(_num), dropped_total=_opt(_num),
    sent=_num, send_skipped=_num, version=_opt(_int), sent_to=_opt(_list_of(_int)),
    spans=_opt(_list_of(_span)), reduced=_opt(_list_of(_list_of(_term))),
    **{f"{k}_s": _opt(_num) for k in ("compute", "wait", "wait_updates", "wait_tokens", "wait_acks",
                                       "wait_sends", "reduce", "send", "apply", "push", "poll")},
    t_push=_opt(_time), t_recv=_time, allreduce_s=_opt(_num), sent_bytes=_opt(_num))
"""Iteration records: each field the report, plots and trace read, and what it must be (``iter`` and ``time``
are required; a field summed or compared -- ``sent``, ``send_skipped`` -- may be absent, never null)."""
EVENT_FIELDS = dict(
    event=_str, time=_time, at=_int, dist_mean=_opt(_num), dist_max=_opt(_num), test_acc=_opt(_num),
    test_loss=_opt(_num), elapsed=_opt(_num), records=_opt(_num), per_record_ms=_num, what=_opt(_str),
    dur=_opt(_num), worker=_opt(_int), workers=_opt(lambda v: _int(v) or _list_of(_int)(v)))
"""Event lines (and ``eval.jsonl`` rows, which need ``time``): the fields read, where present (``time``,
``at`` and ``per_record_ms``, which are sorted by or computed with, never null)."""
HEADER_FIELDS = dict(
    mode=lambda v: v in ("decentralized", "ps", "allreduce"), simulated=lambda v: v is None or isinstance(v, (str, bool)),
    iterations=_opt(_nat), gap_bound=_opt(lambda v: _num(v) or v == float("inf")), message_bytes=_opt(_num),
    sync=_opt(_str), setting=_opt(_str), protocol=_opt(_str), topology=_opt(_str), settings=_opt(_dict),
    hparams=_opt(_dict), cost_model=_opt(_dict), emulation=_opt(_str), network=_opt(_dict), workers=_opt(_nat),
    worker_ranks=_opt(_list_of(_nat)), budget=_opt(_nat))
"""The run header: a field of the wrong type is dropped (and counted); the rest of the header is kept."""


def _depth_ok(obj, limit=MAX_DEPTH):
    stack = [(obj, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (list, dict)):
            if d >= limit:
                return False
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return True


def _fits(obj, fields, required=()):
    return all(k in obj for k in required) and all(check(obj[k]) for k, check in fields.items() if k in obj)


def _json_lines(fh):
    """Parsed JSON objects of a binary file, and how many lines were not one (too long, not UTF-8 JSON,
    nested too deeply, not an object)."""
    rows, bad = [], 0
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            break
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            bad += 1
            while line and not line.endswith(b"\n"):          # the rest of the overlong line
                line = fh.readline(MAX_LINE_BYTES)
            continue
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            bad += 1
            continue
        # a container at depth d needs d + 1 opening brackets in the text: a line with at most MAX_DEPTH of
        # them (nearly every record) cannot be too deep, and is not walked
        if isinstance(obj, dict) and (line.count(b"[") + line.count(b"{") <= MAX_DEPTH or _depth_ok(obj)):
            # (a pair is one character once parsed: only halves are left, and only where escaped)
            rows.append(_printable_all(obj) if _ESCAPED_SURROGATE.search(line) else obj)
        else:
            bad += 1
    return rows, bad


def read_jsonl(path):
    """``(objects, bad lines)`` of one log file; ConfigError (one line naming it) when it is not a regular
    file of at most :data:`MAX_LOG_BYTES`, or cannot be read."""
    fh, _ = open_regular(path, MAX_LOG_BYTES, "a JSON-lines log (--log-dir)")
    try:
        with fh:
            return _json_lines(fh)
    except OSError as err:
        raise ConfigError(f"{shown(path)}: cannot read ({err.strerror or err})") from None


def split_rank_log(rows, resumes=None):
    """``(header, records, events, bad)`` of one rank's parsed lines, each checked against the fields above.
    ``resumes``: a list that gets ``(records before, events before, where, its iterations or None)`` for each
    later header -- a resumed run continues the log (``hopdec train --resume``, a user's loop that loads a
    state dict); ``where`` is :func:`_resumed_at` of that header."""
    header, records, events, bad = None, [], [], 0
    for x in rows:
        if "event" in x:
            if _fits(x, EVENT_FIELDS):
                events.append(x)
            else:
                bad += 1
        elif "iter" in x:
            if _fits(x, RECORD_FIELDS, required=("iter", "time")):
                records.append(x)
            else:
                bad += 1
        elif "run" in x and header is not None:
            where = _resumed_at(x["run"])
            if resumes is not None and where is not None:
                it = x["run"].get("iterations")      # --resume may raise --iterations
                resumes.append((len(records), len(events), where,
                                it if it is not None and HEADER_FIELDS["iterations"](it) else None))
        elif "run" in x and header is None:
            if isinstance(x["run"], dict):
                header = {k: v for k, v in x["run"].items() if k not in HEADER_FIELDS or HEADER_FIELDS[k](v)}
                bad += len(x["run"]) - len(header)
            else:
                bad += 1
        elif "run" not in x:
            bad += 1
    return header or {}, records, events, bad


def _resumed_at(run_header):
    """Where a resumed run's header says it resumed: ``"iteration K"`` (decentralized and all-reduce runs),
    ``"checkpoint cut K"`` (parameter-server runs), or None (not a resume, or not readable)."""
    if not isinstance(run_header, dict):
        return None
    for key, what in (("resumed_from", "iteration"), ("resumed_from_cut", "checkpoint cut")):
        k = run_header.get(key)
        if isinstance(k, int) and not isinstance(k, bool):
            return f"{what} {k}"
    return None


def pause_text(where, gap):
    """How a report says what it left out of a resumed run's times."""
    return f"resumed at {where}: the {gap:.1f} s pause before it is left out of the times"


def began_text(where):
    """How a report says its logs begin at a resume (``--resume`` with another ``--log-dir``): the duration,
    times and rates are of what ran after it; the iterations before are not in these logs."""
    return (f"the logs begin at the resume from {where}: what ran before it was logged in the earlier run's "
            f"--log-dir; the duration and rates here are of what ran after it")


def _shift(rows, keys, gap):
    for x in rows:
        for key in keys:
            v = x.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                x[key] = v - gap


RECORD_TIMES = ("time", "t_recv", "t_push", "t_released")
"""The clock times a record holds (a PS worker's receive, push and release besides its start): a resumed
run's pause is left out of each of them."""


def join_resumed(records, events, evals, cuts):
    """Leave out of every time the pause of a resumed run: between its checkpoint (an iteration after the
    last record kept before the resume) and the restart (the first record after it, on the earliest rank),
    every rank, event and evaluation alike -- else a run resumed the next morning reads as one of 10 hours at
    a tenth of its speed. ``cuts[rank]``: :func:`split_rank_log`'s resumes (only those every rank with
    records has, at the same place). Returns ``(where, seconds left out)`` per pause."""
    ranks = [r for r, v in records.items() if v]
    if not ranks or any(not cuts.get(r) for r in ranks):
        return []
    paused = []
    for j in range(min(len(cuts[r]) for r in ranks)):
        if len({cuts[r][j][2] for r in ranks}) != 1:
            break
        at = {r: cuts[r][j][0] for r in ranks}
        before = [records[r][at[r] - 1]["time"] for r in ranks if at[r] > 0]
        after = [records[r][at[r]]["time"] for r in ranks if at[r] < len(records[r])]
        if not before or not after:
            continue
        steps = [b["time"] - a["time"] for r in ranks for a, b in zip(records[r][:at[r]], records[r][1:at[r]])]
        restart = min(after)
        gap = restart - max(before) - max(float(np.median(steps)) if steps else 0.0, 0.0)
        if gap <= 0:
            continue
        for r, c in cuts.items():               # (the PS server: events only)
            if j < len(c):
                _shift(records.get(r, [])[c[j][0]:], RECORD_TIMES, gap)
                _shift(events.get(r, [])[c[j][1]:], ("time", "t_first"), gap)
        _shift([e for e in evals if e["time"] >= restart], ("time",), gap)
        paused.append((cuts[ranks[0]][j][2], gap))
    return paused


ITERATION_PARTS = ("compute", "wait", "wait_sends", "reduce", "send", "apply", "poll")
"""The parts of an iteration's time a record splits it into (``{part}_s``; ``hopdec.runtime.hop_loop``)."""


def record_end(rec):
    """When the iteration a record starts ends, from the record alone (a worker's last has no next record):
    its start plus every part of its time (:data:`ITERATION_PARTS`)."""
    return rec["time"] + sum((rec.get(f"{k}_s") or 0.0) for k in ITERATION_PARTS)


def expected_ranks(headers):
    """The ranks the run had, as its headers say (``headers[rank]``): a parameter server's ``worker_ranks``
    and the server, rank 0; else ``workers`` ranks 0..n-1 (a PS run's ``workers`` counts the workers, the
    server apart). None where no header says (logs older than these fields)."""
    server = headers.get(0) or {}
    if server.get("mode") == "ps" and isinstance(server.get("worker_ranks"), list):
        return {0, *server["worker_ranks"]}
    for h in headers.values():
        if h and isinstance(h.get("workers"), int):
            return range(h["workers"] + (h.get("mode") == "ps"))
    return None


def missing_ranks(expected, logged, most=8):
    """``(count, the first `most` of them)``: the ranks in ``expected`` without a log in ``logged`` (a set),
    found in O(len(logged) + most) steps whatever a hostile header's rank count."""
    if expected is None:
        return 0, []
    count = len(expected) - sum(1 for r in logged if r in expected)
    first = []
    for r in sorted(expected) if isinstance(expected, set) else expected:
        if len(first) == min(most, count):
            break
        if r not in logged:
            first.append(r)
    return count, first


def missing_text(count, first, total):
    """The note on a run whose directory lacks some of its ranks' logs."""
    listed = ", ".join(f"rank{r}.jsonl" for r in first) + (f" and {count - len(first)} more" if count > len(first)
                                                           else "")
    return (f"logs of {total - count} of the run's {total} ranks: {listed} missing or empty; figures and tables "
            f"cover the logged ranks only (a run across hosts writes each host's ranks' logs on that host unless "
            f"--log-dir is shared: gather them into one directory)")


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
        self.label = printable(label or "run")
        self.path = path
        self.bad_lines = bad_lines
        self.notes = []
        self.paused = []            # (where, seconds): pauses of resumed runs left out (join_resumed)
        self.missing = None         # the note on ranks of the run without a log (missing_text), or None
        self.ranks_logged = None    # (ranks with a log, the run's ranks) when some have none, else None
        self.began = None           # where the logs begin when a resume opened them afresh ("iteration K")
        self.resumed_ranks = set()  # ranks whose log continues after a resume (a later header)
        if self.mode == "ps":
            self.evals += [e for e in self.events.get(0, []) if e.get("event") == "eval"]
        self.evals.sort(key=lambda e: e.get("time", 0.0))

    @classmethod
    def load(cls, path, label=None):
        """The run in directory ``path``. A rank log that cannot be read (not a regular file, too large) is
        left out and named in ``notes``; ConfigError when no rank log is left."""
        files = glob.glob(os.path.join(glob.escape(path), "rank*.jsonl"))
        ranked = sorted((int(m.group(1)), f) for f in files
                        if (m := re.fullmatch(r"rank([0-9]{1,9})\.jsonl", os.path.basename(f))))
        # (ASCII digits: int() reads any script's, and rank\u0661.jsonl -- an Arabic-Indic one -- was read as
        # rank 1 too, sorted after rank1.jsonl and silently replacing its header and records)
        if not ranked:
            raise ConfigError(f"{shown(path)}: no rank*.jsonl (a --log-dir of hopdec train or hopdec sim)")
        headers, records, events, bad, notes, cuts = {}, {}, {}, 0, [], {}
        for r, f in ranked:
            try:
                rows, b = read_jsonl(f)
            except ConfigError as err:
                notes.append(f"{err}: left out")
                continue
            cuts[r] = []
            headers[r], records[r], events[r], b2 = split_rank_log(rows, cuts[r])
            bad += b + b2
        if not headers:
            raise ConfigError(f"{shown(path)}: no rank log could be read ({notes[0]})")
        evals = []
        ev_path = os.path.join(path, "eval.jsonl")
        if os.path.lexists(ev_path):
            try:
                rows, b = read_jsonl(ev_path)
            except ConfigError as err:
                notes.append(f"{err}: left out")
                rows, b = [], 0
            evals = [e for e in rows if "time" in e and _fits(e, EVENT_FIELDS) and e["time"] is not None]
            bad += b + len(rows) - len(evals)
        ids = {}
        for r, h in headers.items():                # one run per directory: never merge two runs' ranks
            if isinstance(h, dict) and isinstance(h.get("run_id"), str):
                ids.setdefault(h["run_id"], r)
        if len(ids) > 1:
            (a, ra), (b, rb) = sorted(ids.items(), key=lambda kv: kv[1])[:2]
            raise ConfigError(f"{shown(path)}: rank files of {len(ids)} different runs (rank{ra}.jsonl is run {a}, "
                              f"rank{rb}.jsonl run {b}); give each run its own --log-dir")
        expected = expected_ranks(headers)
        count, first = missing_ranks(expected, {r for r in headers if headers[r] or records[r] or events[r]})
        missing = missing_text(count, first, len(expected)) if count else None
        if missing:
            notes.append(f"{shown(path)}: {missing}")
        paused = join_resumed(records, events, evals, cuts)
        notes += [f"{shown(path)}: {pause_text(where, gap)}" for where, gap in paused]
        first = 0 if headers.get(0) else next(iter(headers))
        header = dict(headers[first])
        began = _resumed_at(header)     # a resume into another --log-dir: this one holds the last leg only
        if began:
            notes.append(f"{shown(path)}: {began_text(began)}")
        if cuts.get(first) and cuts[first][-1][3] is not None:    # the target the last resume was given
            header["iterations"] = cuts[first][-1][3]
        run = cls(header, records, events, evals, label=label or os.path.basename(os.path.normpath(path)),
                  path=path, bad_lines=bad, headers=headers)
        run.notes, run.paused, run.missing, run.began = notes, paused, missing, began
        run.ranks_logged = (len(expected) - count, len(expected)) if count else None
        run.resumed_ranks = {r for r, c in cuts.items() if c}
        return run

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

    def conditions(self):
        """What the run's times were measured under, for every figure's side: a real run's emulated compute
        and slowdowns (``EMULATED: ...``, as its summary's ``times:`` line) and emulated network
        (``hopdec.testbed``); a simulated run's compute model (its times are virtual anyway). None: a real run
        with nothing emulated."""
        from hopdec.launcher import network_label
        emu = self.header.get("emulation")
        if emu is None and self.mode == "ps":      # the server's header has none: its workers' have it
            emu = next((h["emulation"] for r, h in sorted(self.headers.items())
                        if r != 0 and isinstance(h, dict) and isinstance(h.get("emulation"), str)), None)
        emu = emu if emu and not emu.startswith("no emulation") else None
        if self.simulated:      # its compute, messages and network: what its virtual times came from
            return "; ".join(x for x in (emu, self._simulated_network()) if x) or None
        parts = [f"EMULATED: {emu}"] if emu else []
        over = self.overruns(emu)
        if over:                                   # the summary's words: the pad did not hold everywhere
            n, ranks, top = over
            parts.append(f"measured compute exceeded the pad in {n} iterations on {ranks} rank(s), up to "
                         f"{top:.3g} s (there the slowdowns multiplied the measured time)")
        net = self.header.get("network")
        if net:
            try:
                parts.append(network_label(net))
            except (AttributeError, TypeError, ValueError):     # a hostile log's conditions: a label only
                parts.append("network EMULATED (conditions not readable)")
        return "; ".join(parts) or None

    def overruns(self, emulation):
        """``(iterations, ranks, largest measured compute)`` of the records whose measured compute exceeded
        the ``--compute-time`` pad ``emulation`` names (``compute padded to 0.03 s/iter``), or None. The
        summary says it ("measured compute exceeded the pad in 307 iterations on 4 rank(s), up to 0.163 s"),
        the report said only "compute padded to 0.03 s/iter" of a run whose compute took 0.097 s. A round of
        ``--local-steps`` counts when its measured compute exceeded the pad of its inner steps."""
        m = re.search(r"compute padded to ([0-9.eE+-]+) s/iter", emulation or "")
        try:
            pad = float(m.group(1)) if m else None
        except ValueError:
            pad = None
        if pad is None or not math.isfinite(pad):
            return None
        count, ranks, top = 0, set(), 0.0
        for w, recs in self.records.items():
            for r in recs:
                mc, n = r.get("measured_compute_s"), r.get("inner_steps")
                if _num(mc) and mc > pad * (n if _int(n) and n > 0 else 1) * (1 + 1e-9):
                    count += 1
                    ranks.add(w)
                    top = max(top, mc / (n if _int(n) and n > 0 else 1))
        return (count, len(ranks), top) if count else None

    def _simulated_network(self):
        """The simulator's messages and network from the header's cost model, as its summary's times line says
        them (``messages of 0.5772 MiB; NICs 10 Gb/s per direction (full duplex), latency 5e-05 s``); None
        where the header has no readable one. (The report said only the compute, so a simulated run's times
        read as if the network were nothing.)"""
        cm = self.header.get("cost_model")
        if not isinstance(cm, dict):
            return None
        parts = []
        mb, coded = cm.get("message_mb"), cm.get("message_mb_coded")
        if _num(mb):
            parts.append(f"messages of {mb:.4g} MiB" + (f" coded to {coded:.4g} MiB" if _num(coded) else ""))
        net = cm.get("network")
        if isinstance(net, dict):
            bw, lat = net.get("bandwidth_gbps"), net.get("latency_s")
            nic = "NICs " + (f"{bw:g} Gb/s" if _num(bw) else "of infinite bandwidth") + " per direction"
            if isinstance(net.get("duplex"), str):
                nic += f" ({net['duplex']} duplex)"
            if _num(lat):
                nic += f", latency {lat:g} s"
            for key, what in (("node_bandwidth_gbps", "node(s) with a NIC of their own"),
                              ("links", "link(s) with a bandwidth or latency of their own"),
                              ("machines", "machine(s) sharing a NIC")):
                if isinstance(net.get(key), dict) and net[key]:
                    nic += f", {len(net[key])} {what}"
            parts.append(nic)
        return "; ".join(parts) or None

    def measured_links(self):
        """What ``hopdec.testbed`` measured of its links before the run, beside what they were configured
        for: ``m0->m1 19.8 Mbit/s (configured 20), RTT median 4.35 ms (configured 4)``; None without."""
        net = self.header.get("network")
        out = []
        for m in (net.get("measured") if isinstance(net, dict) else None) or []:
            if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in ("src", "dst")) \
                    or not _num(m.get("mbit")) or not _num(m.get("rtt_ms_median")):
                continue
            c = m.get("configured") if isinstance(m.get("configured"), dict) else {}
            bw = c.get("mbit")
            out.append(f"{m['src']}->{m['dst']} {m['mbit']:.3g} Mbit/s ("
                       + (f"configured {bw:g}" if _num(bw) else "unshaped") + f"), RTT median "
                       f"{m['rtt_ms_median']:.3g} ms" + (f" (configured {c['rtt_ms']:g})" if _num(c.get("rtt_ms")) else ""))
        return "; ".join(out[:20]) + (f"; ... {len(out) - 20} more" if len(out) > 20 else "") if out else None

    def resumed(self):
        """What the times leave out (a resumed run's pauses, :func:`join_resumed`, and what ran before logs
        that begin at a resume), or None."""
        parts = ([began_text(self.began)] if self.began else []) + [pause_text(w, gap) for w, gap in self.paused]
        return "; ".join(parts) or None

    @property
    def kind(self):
        """``SIMULATED``, ``EMULATED`` (a real run under emulated conditions) or "" (measured as it ran)."""
        return "SIMULATED" if self.simulated else "EMULATED" if self.conditions() else ""

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

    def iterations_run(self):
        """How many iterations the furthest worker entered (its last record's + 1); None without records."""
        last = [recs[-1]["iter"] for recs in self.records.values() if recs]
        return max(last) + 1 if last else None

    def ps_unfinished(self):
        """A parameter-server run whose server never wrote its summary (killed, or stopped by Ctrl-C before
        its budget): (gradients the workers pushed, the budget); None for a run that finished, another mode,
        or logs without the server's (nothing to tell by)."""
        if self.mode != "ps" or not (self.headers.get(0) or self.events.get(0)) or self.events_of("summary", 0):
            return None
        budget = self.header.get("budget")
        if not _nat(budget):
            budget = (self.iterations or 0) * len(self.header.get("worker_ranks") or self.records)
        return sum(len(recs) for recs in self.records.values()), budget

    @property
    def local_steps(self):
        """H of a ``--local-steps H`` run (its iterations are rounds of H inner steps), else None."""
        h = self.header.get("local_steps")
        return h if _int(h) and h > 1 else None

    @property
    def bound(self):
        b = self.header.get("gap_bound")
        return None if b is None or (isinstance(b, float) and not math.isfinite(b)) else b

    @property
    def t0(self):
        """The start: the earliest record, server event or evaluation time (an all-reduce run evaluates
        before its first iteration, every worker waiting for it: that evaluation sat at -0.37 s, before the
        run's start, and the duration left it out)."""
        ts = [v[0]["time"] for v in self.records.values() if v and "time" in v[0]]
        ts += [e["time"] for e in self.events.get(0, []) if isinstance(e.get("time"), (int, float))]
        ts += [e["time"] for e in self.evals if _num(e.get("time"))]
        return min(ts) if ts else 0.0

    def events_of(self, name, rank=None):
        ranks = [rank] if rank is not None else sorted(self.events)
        return [e for r in ranks for e in self.events.get(r, []) if e.get("event") == name]

    def describe(self):
        h = self.header
        if self.mode == "allreduce":
            return f"synchronous all-reduce ({h.get('workers', len(self.records))} workers)"
        if self.mode == "ps":
            s = f"PS --sync {h.get('sync')}"
            st = h.get("settings") or {}
            if st:
                s += " " + " ".join(f"{k}={v}" for k, v in st.items())
        else:
            s = f"{h.get('setting', 'decentralized')} ({h.get('protocol')}) on {h.get('topology')}"
            for key, opt in (("staleness", "--staleness"), ("backup_workers", "--backup-workers"),
                             ("skip", "--skip")):                              # the mechanisms (Hop sec. 4.3-5)
                if h.get(key) not in (None, 0, "none", False):
                    s += f", {opt} {h[key]}"
            if h.get("compress") not in (None, "none"):                     # --compress
                s += f", --compress {h['compress']}"
            if h.get("local_steps"):                        # --local-steps: iterations are rounds
                o = h.get("outer") or {}
                s += (f", rounds of {h['local_steps']} local steps (outer {o.get('optimizer')} lr {o.get('lr')}"
                      f" momentum {o.get('momentum')}; iterations count rounds)")
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
        """Mean training loss over workers against mini-batches: a ``--local-steps`` round's mean loss sits at
        its middle inner step, so runs with and without local steps compare at equal gradient computations."""
        h, by = self.local_steps, {}
        for recs in self.records.values():
            for r in recs:
                if r.get("loss") is not None:
                    by.setdefault(self._step_of(r, h) if h else r["iter"], []).append(r["loss"])
        its = sorted(by)
        return np.array(its), np.array([np.mean(by[k]) for k in its])

    @staticmethod
    def _step_of(rec, h):
        """The middle inner step of a round's record: from its ``first_step`` (else round x H) and its
        ``inner_steps`` (else H; ``HopOptimizer``'s records have no ``first_step``)."""
        first, n = rec.get("first_step"), rec.get("inner_steps")
        first = first if _int(first) and first >= 0 else rec["iter"] * h
        n = n if _int(n) and n >= 1 else h
        return first + (n - 1) / 2

    def timeline(self):
        """{rank: (times since start, iterations entered)}."""
        t0 = self.t0
        return {w: (np.array([r["time"] - t0 for r in recs]), np.array([r["iter"] for r in recs]))
                for w, recs in self.records.items()}

    def removed_at(self):
        """{rank: when it stops counting in the gap} for the workers the run declared dead (``--fault-tolerance``
        runs, real or simulated): a decentralized worker at the heal, or at the end of its last logged
        iteration if that came first (a record is written when its iteration ends, so a killed worker's log
        stops one iteration before it died: after it nobody knows where it was, and it counted one behind);
        a PS worker when the server's ``failure`` note dropped it (:meth:`_entries` adds the mini-batches the
        server released it into meanwhile)."""
        out = {}
        for t, ws in self._deaths():
            for w in ws:
                if w in self.records:
                    out[w] = min(out.get(w, t), t)
        for w in (out if self.mode != "ps" else ()):
            out[w] = min(out[w], record_end(self.records[w][-1]))
        return out

    def _deaths(self):
        """``[(time, [workers])]`` of the deaths the run logged: the survivors' ``heal`` events
        (decentralized), the server's ``failure`` notes (PS)."""
        out = []
        for e in self.events_of("heal") + [n for n in self.events_of("note", 0) if n.get("what") == "failure"]:
            t = e.get("time")
            if not _num(t):
                continue
            ws = e.get("failed") if e.get("event") == "heal" else [e.get("worker")]
            out.append((t, [w for w in (ws if isinstance(ws, list) else []) if _int(w)]))
        return out

    def _entries(self, removed):
        """Each worker's ``[(time, iteration entered)]``; a PS worker that died also in the mini-batches the
        server released it into after its last record (a record is logged at the next weights, so the one it
        died in, and one whose weights were on the way, never are)."""
        out = [[(r["time"], r["iter"]) for r in self.records[w]] for w in self.workers]
        if self.mode != "ps" or not removed:
            return out
        for w, ev in zip(self.workers, out):
            t, k = ev[-1] if ev else (-math.inf, -1)
            if w in removed:
                released = sorted(e["time"] for e in self.events_of("release", 0)
                                  if w in (e.get("workers") or ()) and isinstance(e.get("time"), (int, float))
                                  and not isinstance(e.get("time"), bool) and t < e["time"] <= removed[w])
                ev.extend((r, k + 1 + i) for i, r in enumerate(released))
        return out

    def gap_over_time(self):
        """(t, largest Iter(i) - Iter(j) at t) after each iteration entered, once every worker started
        (:func:`hopdec.report.gaps.gap_sweep`); a worker declared dead counts until its heal."""
        from hopdec.report.gaps import gap_sweep
        removed = self.removed_at()
        sweep = list(gap_sweep(self._entries(removed), [removed.get(w) for w in self.workers]))
        t0 = self.t0                # (a scan of every worker's first record and the server's events:
        return np.array([t - t0 for t, _ in sweep]), np.array([g for _, g in sweep])  # once, not per point)

    def gap_matrix(self, limit=64):
        """Largest observed Iter(i) - Iter(j) for every ordered pair of workers (None above ``limit``)."""
        if len(self.records) > limit:
            return None
        from hopdec.report.gaps import max_iteration_gap
        removed = self.removed_at()
        return max_iteration_gap(self._entries(removed), [removed.get(w) for w in self.workers])

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
                    # what the core waited for when it is none of the Hop kinds: the server (PS), the
                    # slowest worker and the gradient's ring (all-reduce)
                    key = _REST_OF_WAIT.get(self.mode, "wait (other)")
                    parts[key] = parts.get(key, 0.0) + rest
                if r.get("wait_sends_s"):
                    parts["wait sends"] = parts.get("wait sends", 0.0) + r["wait_sends_s"]
                for key in ("reduce", "send", "apply", "push", "poll"):
                    v = r.get(f"{key}_s")
                    if v:
                        parts[key] = parts.get(key, 0.0) + v
            if len(recs) > 1 and self.mode != "ps":
                span = recs[-1]["time"] - recs[0]["time"]
                inside = sum(parts.values()) - (record_end(recs[-1]) - recs[-1]["time"])   # (the last one's)
                parts["other"] = max(0.0, span - inside)
                # what watching the run cost on this rank's own path between iterations (progress, consensus
                # rounds, rank 0's evaluations: the observer measures it, hook_s) was in "other", so rank 0's
                # evaluations read as unexplained time
                hooks = [e.get("hook_s") for e in self.events_of("observer", w)]
                watched = min(sum(h for h in hooks if _num(h) and h > 0), parts["other"])
                if watched > 0:
                    parts["watching"] = watched
                    parts["other"] -= watched
            out[w] = parts
        return out

    # ---- counters ----
    @property
    def message_bytes(self):
        """Bytes of one message (all-reduce: one worker's gradient): the header's, else the simulator's cost
        model's (``message_mb_coded`` with --compress), else None."""
        mb = self.header.get("message_bytes")
        if mb is not None:
            return mb
        cm = self.header.get("cost_model") or {}
        v = cm.get("message_mb_coded", cm.get("message_mb"))
        return v * 2 ** 20 if _num(v) and v >= 0 else None

    def server_drops(self):
        """{worker: gradients the server dropped}, from the server's ``drop`` events; None without a server
        log. A worker's last gradient that came after the budget was reached is *discarded*, not dropped:
        its record says staleness -1 too, but the server never logs it as a drop."""
        if not self.events.get(0) and 0 not in self.headers:
            return None
        out = {}
        for e in self.events_of("drop", 0):
            if _int(e.get("worker")):
                out[e["worker"]] = out.get(e["worker"], 0) + 1
        return out

    def staleness_of(self):
        """{worker: [staleness of each gradient it pushed, -1 for a dropped one]} (PS): from its records, or
        where they have none -- ESync's workers push a round's model delta -- from the server's ``apply``
        events, which list each applied update's worker and staleness (the panel and counters were blank)."""
        out = {w: [r["staleness"] for r in recs if _int(r.get("staleness"))] for w, recs in self.records.items()}
        if any(out.values()):
            return out
        for e in self.events_of("apply", 0):
            ws, st = e.get("workers"), e.get("staleness")
            if isinstance(ws, list) and isinstance(st, list) and len(ws) == len(st):
                for w, x in zip(ws, st):
                    if _int(w) and _int(x) and w in out:
                        out[w].append(x)
        return out

    def push_times(self, w):
        """Worker ``w``'s push times (PS): its records' ``t_push``, else the server's applies of its updates."""
        pushes = [r["t_push"] for r in self.records.get(w, []) if r.get("t_push") is not None]
        if pushes:
            return pushes
        return [e["time"] for e in self.events_of("apply", 0) if isinstance(e.get("workers"), list)
                and w in e["workers"] and _num(e.get("time"))]

    def counters(self):
        """Mechanism counters summed or taken over the run, per worker and in total."""
        rows = {}
        mb = self.message_bytes
        drops = self.server_drops() if self.mode == "ps" else None
        stale = self.staleness_of() if self.mode == "ps" else None
        for w, recs in self.records.items():
            last = recs[-1] if recs else {}
            c = dict(iterations=len(recs), jumps=sum(1 for r in recs if "jumped_from" in r))
            if self.mode == "ps":
                st = stale[w]
                applied = [s for s in st if s >= 0]
                c["staleness_mean"] = float(np.mean(applied)) if applied else None
                c["staleness_max"] = max(applied) if applied else None
                c["dropped"] = drops.get(w, 0) if drops is not None else sum(1 for s in st if s == -1)
                pushes = self.push_times(w)
                c["push_interval_s"] = float(np.mean(np.diff(pushes))) if len(pushes) > 1 else None
            elif self.mode == "allreduce":
                c["wait_s"] = sum((r.get("wait_s") or 0.0) for r in recs)
                c["bytes_reduced"] = len(recs) * mb if mb is not None else None
            else:
                c["updates_used"] = last.get("used_total")
                c["updates_dropped"] = last.get("dropped_total")
                c["messages_sent"] = sum(r.get("sent", 0) for r in recs)
                c["sends_skipped"] = sum(r.get("send_skipped", 0) for r in recs)
                if any("sent_bytes" in r for r in recs):        # what each iteration put on the wire
                    c["bytes_sent"] = float(sum(r.get("sent_bytes") or 0 for r in recs))
                else:
                    c["bytes_sent"] = c["messages_sent"] * mb if mb else None
                wire = self.transport_counts(w)
                if wire is not None:    # the transport's own count: also what went out after the last record
                    c["messages_logged"] = c["messages_sent"]
                    c["messages_sent"], c["bytes_sent"] = wire
                toks = [r["tokens"] for r in recs if r.get("tokens") is not None]
                c["tokens_min"] = min(toks) if toks else None
                held = [r["held"] for r in recs if r.get("held") is not None]
                c["held_max"] = max(held) if held else None
            rows[w] = c
        return rows

    def transport_counts(self, w):
        """``(updates, bytes)`` rank ``w``'s transport counted over the run (its ``messages`` event: what
        ``hopdec train``'s traffic line prints), or None: no such event (the simulator, a killed rank), more
        than one, or a log resumed (an event of the first session may be cut). A loop of your own sends its
        next iteration's parameters before ``finish()`` ends the run: sent, never a record (183 updates on
        the wire where the records listed 180)."""
        if w in self.resumed_ranks:
            return None
        ev = self.events_of("messages", w)
        if len(ev) != 1:
            return None
        n, b = ev[0].get("updates"), ev[0].get("bytes")
        return (n, float(b)) if _nat(n) and _num(b) and b >= 0 else None

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
        ends = [record_end(recs[-1]) for recs in self.records.values() if recs]
        duration = (max(ends) - self.t0) if ends else None
        if summary and summary[-1].get("elapsed") is not None and not self.paused:
            duration = summary[-1]["elapsed"]       # (a resumed run's is its last process's alone)
        rates, batches, h = [], [], self.local_steps
        dead = {w for _, ws in self._deaths() for w in ws}     # (the survivors' rate, as the summary's rows)
        for w, recs in self.records.items():
            if w in dead and len(dead) < len(self.records):
                continue
            if len(recs) > 1 and recs[-1]["time"] > recs[0]["time"]:
                dt = recs[-1]["time"] - recs[0]["time"]
                rates.append((recs[-1]["iter"] - recs[0]["iter"]) / dt)
                if h:       # the mini-batches of the rounds computed in dt (a jump passes rounds computing none)
                    batches.append(sum(self._inner_steps(r, h) for r in recs[:-1]) / dt)
        return dict(train_loss=float(np.mean(last_losses)) if last_losses else None, test_acc=acc,
                    test_loss=loss, duration=duration, rate=float(np.mean(rates)) if rates else None,
                    batch_rate=float(np.mean(batches)) if batches else None)

    def stopped_early(self):
        """``(iterations entered, iterations planned)`` of a run whose furthest worker stopped before its
        ``--iterations`` (killed, Ctrl-C, a failure; rounds with ``--local-steps``), else None: a finished
        run, a PS run (its workers share the server's budget), a loop of your own (it plans none)."""
        planned, ran = self.iterations, self.iterations_run()
        if self.mode == "ps" or not _int(planned) or ran is None or ran >= planned:
            return None
        return ran, planned

    @staticmethod
    def _inner_steps(rec, h):
        """The inner steps a round's record computed: none when it mixed without a gradient (``serving``: a
        loop of your own that finished first), else its ``inner_steps`` (0 too), else H."""
        if rec.get("serving"):
            return 0
        n = rec.get("inner_steps")
        return n if _int(n) and n >= 0 else h
