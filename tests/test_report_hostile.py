"""``hopdec report|plot|trace`` on damaged and hostile log directories (issue 17 item 4): every case ends in
bounded time with output or one line naming the file, never a traceback or a hang. The files are made
here: FIFOs, ``/dev/zero`` behind a link, directories where files belong, oversized and binary files,
and records whose fields have every wrong type (seeded random mutations of valid logs)."""

import copy
import json
import math
import os
import random
import signal
import stat

import pytest

from conftest import address_space_capped
from hopdec.cli.main import main
from hopdec.report.data import RECORD_FIELDS, Run


# ---- valid logs, as hopdec train writes them -------------------------------------------------------------
def _hop_lines(rank, n=4, iters=12):
    head = {"rank": rank, "run": {"mode": "decentralized", "topology": "ring(4)", "protocol": "tokens",
                                  "setting": "standard", "iterations": iters, "gap_bound": 2, "message_bytes": 4000,
                                  "hparams": {"lr": 0.05}, "cost_model": None, "pid": 1, "host": "h"}}
    lines = [head]
    for k in range(iters):
        t = 0.1 * k + 0.01 * rank
        dests = [(rank + 1) % n, (rank - 1) % n]
        lines.append({"rank": rank, "iter": k, "time": t, "loss": 2.3 - 0.1 * k, "compute_s": 0.05, "wait_s": 0.01,
                      "wait_updates_s": 0.005, "wait_tokens_s": 0.005, "reduce_s": 0.001, "send_s": 0.001,
                      "apply_s": 0.001, "sent": 2, "send_skipped": 0, "tokens": 2, "held": 1, "used_total": k,
                      "dropped_total": 0, "sent_to": dests, "waited_on": [[dests[0], 0.01]],
                      "reduced": [[[rank, k, 0.5], [dests[1], k, 0.5]]],
                      "spans": [["send", 0.0, 0.001, dests], ["compute", 0.001, 0.05, None],
                                ["wait", 0.051, 0.01, ["updates from", dests[:1]]], ["reduce", 0.061, 0.001, k],
                                ["apply", 0.062, 0.001, None]] + ([["jump", 0.063, 0.0, [k, k + 1]]] if k == 5 else [])})
    if rank == 0:
        lines += [{"event": "consensus", "time": 0.5, "at": 5, "dist_mean": 0.1, "dist_max": 0.2},
                  {"event": "observer", "records": iters, "per_record_ms": 0.01, "progress": True},
                  {"event": "failure", "time": 0.7, "what": "rank 3 died"},
                  {"event": "summary", "test_acc": 0.5, "test_loss": 1.0, "elapsed": 1.3}]
    return lines


def _ps_lines(rank, iters=8):
    head = {"rank": rank, "run": {"mode": "ps", "sync": "ssp", "settings": {"staleness": 3}, "iterations": iters}}
    if rank == 0:
        return [head] + [{"event": "apply", "time": 0.1 * k, "version": k + 1, "workers": [1 + k % 2], "dur": 0.001,
                          "staleness": [0]} for k in range(2 * iters)] + [
            {"event": "drop", "time": 0.35, "worker": 2}, {"event": "release", "time": 0.4, "workers": [1, 2]},
            {"event": "note", "time": 0.45, "what": "dssp grants"}, {"event": "stop", "time": 1.0},
            {"event": "eval", "time": 1.0, "test_acc": 0.6, "test_loss": 0.9},
            {"event": "summary", "test_acc": 0.6, "test_loss": 0.9, "elapsed": 1.1}]
    return [head] + [{"rank": rank, "iter": k, "time": 0.1 * k, "t_recv": 0.1 * k, "loss": 2.0 - 0.1 * k,
                      "compute_s": 0.05, "wait_s": 0.02, "push_s": 0.001, "t_push": 0.1 * k + 0.06, "staleness": k % 2,
                      "version": k} for k in range(iters)]


def _write(d, lines_by_rank, evals=None):
    os.makedirs(d, exist_ok=True)
    for r, lines in lines_by_rank.items():
        with open(os.path.join(d, f"rank{r}.jsonl"), "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
    if evals is not None:
        with open(os.path.join(d, "eval.jsonl"), "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in evals))
    return str(d)


def hop_run(d):
    return _write(d, {r: _hop_lines(r) for r in range(4)}, evals=[{"time": 0.6, "test_acc": 0.4, "test_loss": 1.2}])


def ps_run(d):
    return _write(d, {r: _ps_lines(r) for r in range(3)})


# ---- running the commands in-process, bounded -------------------------------------------------------------
class Hung(Exception):
    pass


def run_cmd(argv, capsys, seconds=60):
    """``hopdec ARGV`` in this process: (exit code, stderr). A run past ``seconds`` fails the test (SIGALRM
    interrupts a loop that never ends); any exception escaping main is a failure too."""
    def alarm(*_):
        raise Hung(f"hopdec {' '.join(argv)} ran for more than {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err
    return code, err


def assert_clean(code, err, argv):
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, err
    if code:
        errors = [ln for ln in err.splitlines() if ": error: " in ln]
        assert len(errors) == 1, err


COMMANDS = [["report", "-o", "{out}/r.html"], ["plot", "-o", "{out}/p.png"], ["plot", "--what", "gap", "-o", "{out}/g.png"],
            ["plot", "--what", "consensus", "-o", "{out}/c.png"], ["plot", "--what", "timeline", "-o", "{out}/t.png"],
            ["plot", "--what", "breakdown", "-o", "{out}/b.png"], ["trace", "-o", "{out}/t.json"]]


def every_command(run_dir, out, capsys, commands=COMMANDS):
    for cmd in commands:
        argv = [c.format(out=out) for c in cmd]
        argv.insert(1, run_dir)
        code, err = run_cmd(argv, capsys)
        assert_clean(code, err, argv)


def test_a_consensus_plot_of_runs_without_consensus_rounds_says_where_they_come_from(tmp_path, capsys):
    """The line said "train with --consensus-every K", an option a user's loop does not have; it names
    both ways to log the rounds."""
    d = _write(tmp_path / "run", {r: [x for x in _hop_lines(r) if x.get("event") != "consensus"] for r in range(4)})
    code, err = run_cmd(["plot", d, "--what", "consensus", "-o", str(tmp_path / "c.png")], capsys)
    assert code == 2 and err.strip().endswith("no run has consensus-distance rounds (hopdec train --consensus-every K "
                                              "or HopOptimizer(consensus_every=K) logs them)"), err


# ---- whole files that are not what they should be --------------------------------------------------------
@pytest.mark.parametrize("what", ["fifo", "devzero", "directory", "huge", "binary", "longline", "empty"])
def test_a_rank_log_that_is_not_a_log_is_named_and_never_read_forever(tmp_path, capsys, what):
    d = hop_run(tmp_path / "run")
    victim = os.path.join(d, "rank2.jsonl")
    os.unlink(victim)
    if what == "fifo":
        os.mkfifo(victim)
    elif what == "devzero":
        os.symlink("/dev/zero", victim)
    elif what == "directory":
        os.mkdir(victim)
    elif what == "huge":                                # sparse: 2 GiB of nothing, costs no disk
        with open(victim, "wb") as f:
            f.truncate(2 ** 31)
    elif what == "binary":
        with open(victim, "wb") as f:
            f.write(bytes(random.Random(1).randrange(256) for _ in range(5000)))
    elif what == "longline":
        with open(victim, "w") as f:
            f.write('{"event": "note", "what": "' + "x" * (3 * 2 ** 20) + '"}\n' +
                    json.dumps(_hop_lines(2)[1]) + "\n")
    else:
        open(victim, "w").close()
    with address_space_capped():            # a regression reading 2 GiB fails here, not the machine
        code, err = run_cmd(["trace", d, "-o", str(tmp_path / "t.json")], capsys)
    assert_clean(code, err, what)
    assert code == 0 and os.path.exists(tmp_path / "t.json")
    if what in ("fifo", "devzero", "directory", "huge"):
        assert "rank2.jsonl" in err and "left out" in err, err
    if what in ("binary", "longline"):
        assert "skipped" in err, err


def test_eval_log_and_every_rank_log_unreadable(tmp_path, capsys):
    d = hop_run(tmp_path / "run")
    os.unlink(os.path.join(d, "eval.jsonl"))
    os.mkfifo(os.path.join(d, "eval.jsonl"))
    code, err = run_cmd(["plot", d, "-o", str(tmp_path / "p.png")], capsys)
    assert code == 0 and "eval.jsonl" in err
    for r in range(4):
        os.unlink(os.path.join(d, f"rank{r}.jsonl"))
        os.mkdir(os.path.join(d, f"rank{r}.jsonl"))
    code, err = run_cmd(["trace", d, "-o", str(tmp_path / "t.json")], capsys)
    assert_clean(code, err, "all dirs")
    assert code == 2 and "no rank log could be read" in err


def test_outputs_that_cannot_be_written_are_one_line_before_any_work(tmp_path, capsys):
    d = hop_run(tmp_path / "run")
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    cases = [["report", d, "-o", str(tmp_path / "missing" / "r.html")], ["report", d, "-o", str(tmp_path)],
             ["report", d, "-o", str(fifo)], ["plot", d, "-o", str(tmp_path / "p.xyz")],
             ["trace", d, "-o", str(tmp_path / "no" / "t.json")], ["plot", d, "-o", ""]]
    for argv in cases:
        code, err = run_cmd(argv, capsys)
        assert_clean(code, err, argv)
        assert code == 2 and argv[-1] in err if argv[-1] else code == 2, (argv, err)
    os.chmod(tmp_path, stat.S_IRUSR | stat.S_IXUSR)     # a folder we may not write (as root: still writable)
    try:
        code, err = run_cmd(["trace", d, "-o", str(tmp_path / "t.json")], capsys)
        assert_clean(code, err, "read-only folder")
    finally:
        os.chmod(tmp_path, 0o755)


def test_plot_names_the_file_it_wrote(tmp_path, capsys):
    """-o without a suffix: matplotlib adds .png, and the line says so (it said the name without it)."""
    d = hop_run(tmp_path / "run")
    code = main(["plot", d, "-o", str(tmp_path / "figure")])
    out = capsys.readouterr().out
    assert code == 0 and os.path.exists(tmp_path / "figure.png")
    assert out.strip() == f"wrote {tmp_path / 'figure.png'}"


# ---- records of every wrong type --------------------------------------------------------------------------
def _deep(n):
    x = 1
    for _ in range(n):
        x = [x]
    return x


HOSTILE = [float("nan"), float("inf"), -float("inf"), "7", "", [], {}, None, True, False, -1, 1.5, 10 ** 30,
           2 ** 70, [1, "x"], [[1, 2, 3]], {"a": 1}, _deep(40), [None, None, None, None], ["wait", 0, 0, 5],
           ["send", 0.0, 0.1, [1, "x"]], ["jump", 0, 0, [1]]]


def _mutate(lines_by_rank, rng):
    """One hostile change: a field of a record, event or header gets a wrong value, loses a required
    field, or the line becomes something that is not a record."""
    out = copy.deepcopy(lines_by_rank)
    r = rng.choice(sorted(out))
    i = rng.randrange(len(out[r]))
    line = out[r][i]
    kind = rng.random()
    target = line["run"] if "run" in line and kind < 0.2 else line
    keys = sorted(target) + ["spans", "reduced", "sent_to", "at", "time", "iter", "workers", "worker"]
    if kind < 0.85:
        key = rng.choice(keys)
        value = rng.choice(HOSTILE)
        if key in ("spans", "reduced") and rng.random() < 0.5:
            value = [value]
        target[key] = value
        what = f"rank{r} line {i}: {key} = {json.dumps(value)[:60]}"
    elif kind < 0.93:
        key = rng.choice(sorted(target))
        del target[key]
        what = f"rank{r} line {i}: no {key}"
    else:
        out[r][i] = rng.choice([[1, 2], "x", 3, None, _deep(3000)])
        what = f"rank{r} line {i}: not an object"
    return out, what


def _write_raw(d, lines_by_rank):
    os.makedirs(d, exist_ok=True)
    for r, lines in lines_by_rank.items():
        with open(os.path.join(d, f"rank{r}.jsonl"), "w") as f:
            for x in lines:
                try:
                    f.write(json.dumps(x) + "\n")
                except RecursionError:
                    f.write("[" * 3000 + "]" * 3000 + "\n")
    return str(d)


def _exercise(run, out):
    """Everything the report, the plots and the trace compute from a run, without drawing."""
    from hopdec.report.trace import write_trace
    run.loss_vs_time(), run.loss_vs_iter(), run.timeline(), run.gap_over_time(), run.gap_matrix()
    run.consensus(), run.breakdown(), run.counters(), run.edges(), run.final(), run.describe(), run.t0
    write_trace(run, out)


@pytest.mark.parametrize("mode", ["decentralized", "ps"])
def test_records_of_the_wrong_type_are_skipped_and_counted(tmp_path, capsys, mode):
    """250 seeded mutations per mode: each run loads, every series and the trace compute without an
    exception (a NaN time used to make the gap sweep loop forever), and the first few go through every
    command; only well-typed records remain."""
    rng = random.Random(17 if mode == "ps" else 4)
    base = {r: (_ps_lines(r) if mode == "ps" else _hop_lines(r)) for r in range(3 if mode == "ps" else 4)}
    for n in range(250):
        lines, what = _mutate(base, rng)
        d = _write_raw(tmp_path / f"m{n}", lines)
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Hung(what)))
        signal.alarm(20)
        try:
            run = Run.load(d)
            for recs in run.records.values():
                for rec in recs:
                    assert all(check(rec[k]) for k, check in RECORD_FIELDS.items() if k in rec), what
                    assert math.isfinite(rec["time"]), what
            _exercise(run, str(tmp_path / "t.json"))
        except Hung:
            raise
        except Exception as err:
            from hopdec.errors import HopdecError
            if not isinstance(err, HopdecError):
                raise AssertionError(f"{what}: {type(err).__name__}: {err}") from err
        finally:
            signal.alarm(0)
        if n < 2:
            every_command(d, str(tmp_path), capsys)


def test_a_nan_time_is_skipped_not_swept_forever(tmp_path, capsys):
    lines = {r: _hop_lines(r) for r in range(4)}
    lines[1][3]["time"] = float("nan")
    d = _write_raw(tmp_path / "nan", lines)
    run = Run.load(d)
    assert run.bad_lines == 1 and len(run.records[1]) == 11
    code, err = run_cmd(["plot", d, "--what", "gap", "-o", str(tmp_path / "g.png")], capsys, seconds=60)
    assert code == 0 and "1 log line" in err


def test_a_line_nested_one_level_too_deep_is_refused_and_one_at_the_limit_read(tmp_path):
    """The depth check skips the walk for a line with at most MAX_DEPTH opening brackets (a container at depth
    d needs d + 1 of them); at the boundary it still says what the walk says, brackets in strings or not."""
    import io
    from hopdec.report.data import MAX_DEPTH, _json_lines

    def nest(depth, inner="[]"):
        x = inner
        for _ in range(depth - 1):
            x = f"[{x}]"
        return x
    lines = [f'{{"x": {nest(MAX_DEPTH - 1)}}}',                 # deepest container at depth MAX_DEPTH - 1
             f'{{"x": {nest(MAX_DEPTH)}}}',                     # one at depth MAX_DEPTH: refused
             f'{{"s": "{"[" * 40}", "x": {nest(MAX_DEPTH - 1)}}}',  # brackets in a string: walked, read
             f'{{"s": "{"{" * 40}", "x": {nest(MAX_DEPTH)}}}']
    rows, bad = _json_lines(io.BytesIO("\n".join(lines).encode()))
    assert bad == 2 and [sorted(r) for r in rows] == [["x"], ["s", "x"]]


# ---- runs that did not finish ------------------------------------------------------------------------------
def test_a_killed_parameter_server_run_is_not_shown_as_complete(tmp_path):
    """A PS run killed (SIGKILL) at 1,217 of its 200,000 gradients was listed as "100000" iterations, as a
    finished one is: only a server that finished writes its summary, and without one the glance says so."""
    from hopdec.report.html import glance_rows
    done = Run.load(ps_run(tmp_path / "done"))
    assert glance_rows([done])[0][3] == "8"
    killed = {r: [x for x in _ps_lines(r) if x.get("event") not in ("summary", "stop")][:-2] for r in range(3)}
    run = Run.load(_write(tmp_path / "killed", killed))
    assert glance_rows([run])[0][3] == "8 (stopped early: 12 of 16 gradients)"


def test_per_run_figures_of_many_runs_wrap_into_rows(tmp_path, capsys):
    """``plot --what gap`` of 12 runs drew one row of 12 panels, a 7920 x 495 px strip no screen shows
    legibly; the panels wrap three to a row, and the figure has no empty panel."""
    import matplotlib.image as mpimg
    runs = [hop_run(tmp_path / f"r{i}") for i in range(7)]
    out = str(tmp_path / "g.png")
    code, err = run_cmd(["plot", *runs, "--what", "gap", "-o", out], capsys)
    assert code == 0, err
    height, width = mpimg.imread(out).shape[:2]
    assert width <= 3 * 6 * 110 and height >= 3 * 4.5 * 110 - 1, (width, height)


def test_logs_that_begin_at_a_resume_say_so(tmp_path, capsys):
    """``hopdec train --resume D`` with a new --log-dir starts the logs at the checkpoint: the report listed
    such a run as "2100" iterations in "2.26 s", a finished run's figures, with no word that the 2,000
    iterations before the resume (and their time) were in another directory."""
    from hopdec.report.html import glance_rows
    lines = {r: _hop_lines(r) for r in range(4)}
    for r, rows in lines.items():
        rows[0]["run"]["resumed_from"] = 6
        lines[r] = [rows[0]] + [x for x in rows[1:] if x.get("iter", 6) >= 6]
    d = _write(tmp_path / "leg2", lines)
    code, err = run_cmd(["report", d, "-o", str(tmp_path / "r.html")], capsys)
    assert code == 0 and "logs begin at the resume from iteration 6" in err, err
    run = Run.load(d)
    assert "logs begin at the resume from iteration 6" in glance_rows([run])[0][0]
    page = open(tmp_path / "r.html").read()
    assert "resumed from a checkpoint)" in page and "was cut from the logs" not in page
    assert Run.load(hop_run(tmp_path / "whole")).resumed() is None


def test_an_output_that_is_one_of_the_runs_logs_is_refused_before_it_is_overwritten(tmp_path, capsys):
    """``hopdec trace RUN -o RUN/rank0.jsonl`` wrote the trace over rank 0's log (and the next report said
    the rank's log was missing); by name, through a link, or a new rank file in the run: one line, no write."""
    d = hop_run(tmp_path / "run")
    before = {f: open(os.path.join(d, f), "rb").read() for f in os.listdir(d)}
    os.symlink(os.path.join(d, "rank2.jsonl"), tmp_path / "link.json")
    cases = [["trace", d, "-o", os.path.join(d, "rank0.jsonl")], ["report", d, "-o", os.path.join(d, "eval.jsonl")],
             ["trace", d, "-o", str(tmp_path / "link.json")], ["report", d, "-o", os.path.join(d, "rank7.jsonl")],
             ["plot", d, "--what", "gap", "-o", os.path.join(d, "rank1.jsonl")]]
    for argv in cases:
        code, err = run_cmd(argv, capsys)
        assert_clean(code, err, argv)
        assert code == 2 and "a log of" in err or argv[0] == "plot" and "cannot write .jsonl" in err, (argv, err)
    assert {f: open(os.path.join(d, f), "rb").read() for f in os.listdir(d)} == before
    code, err = run_cmd(["trace", d, "-o", os.path.join(d, "trace.json")], capsys)
    assert code == 0, err


def test_a_simulation_killed_before_its_records_were_written_says_why_there_are_none(tmp_path, capsys):
    """``hopdec sim --log-dir`` SIGKILLed after minutes left its header lines only (it writes the records in
    batches); the report said "the logs hold no iteration record" and nothing of where they went."""
    lines = {r: _hop_lines(r)[:1] for r in range(4)}
    for rows in lines.values():
        rows[0]["run"]["simulated"] = "SIMULATED (--math)"
    d = _write(tmp_path / "killed", lines)
    code, err = run_cmd(["report", d, "-o", str(tmp_path / "r.html")], capsys)
    assert_clean(code, err, "killed sim")
    assert code == 2 and "a simulation killed before its first batch leaves its headers only" in err, err
    d = _write(tmp_path / "real", {r: _hop_lines(r)[:1] for r in range(4)})
    code, err = run_cmd(["report", d, "-o", str(tmp_path / "r.html")], capsys)
    assert code == 2 and err.strip().endswith("the logs hold no iteration record"), err


def test_a_consensus_figure_names_the_runs_without_rounds(tmp_path):
    """Two runs compared, one without consensus rounds: the figure drew the other's curves and left it out
    without a word (the loss figure names a run without a loss); its legend names it."""
    from hopdec.report import plots
    plt = plots.matplotlib()
    with_rounds = Run.load(hop_run(tmp_path / "a"))
    without = Run.load(_write(tmp_path / "b", {r: [x for x in _hop_lines(r) if x.get("event") != "consensus"]
                                                for r in range(4)}))
    fig, ax = plt.subplots()
    try:
        assert plots.consensus(ax, [with_rounds, without])
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
    finally:
        plt.close(fig)
    assert labels[-1] == "no rounds logged: b", labels


@pytest.mark.parametrize("mode,where,field", [
    ("decentralized", "record", "sent"), ("decentralized", "record", "send_skipped"),
    ("decentralized", "consensus", "at"), ("decentralized", "consensus", "time"),
    ("decentralized", "observer", "per_record_ms"), ("ps", "eval", "time")])
def test_a_null_where_a_number_is_summed_or_sorted_by_is_skipped_and_counted(tmp_path, capsys, mode, where, field):
    """Fields a consumer adds up, sorts by or divides (found by fuzzing real logs): a null there passed the
    check (absent and null were one case) and ended report, trace or plot in a TypeError traceback."""
    lines = {r: (_ps_lines(r) if mode == "ps" else _hop_lines(r)) for r in range(3 if mode == "ps" else 4)}
    hit = 0
    for line in lines[0]:
        if (where == "record" and "iter" in line) or line.get("event") == where:
            line[field] = None
            hit += 1
    assert hit
    d = _write_raw(tmp_path / "null", lines)
    assert Run.load(d).bad_lines == hit
    every_command(d, str(tmp_path), capsys)
