"""``hopdec report|plot|trace`` as a user reads them: text that is not Unicode (a folder name of non-UTF-8
bytes, a lone surrogate in a log), figures comparing many runs, notes that must not cover the data, and
output paths that are folders. (Damaged logs: test_report_hostile.py.)"""

import json
import os

import pytest

from hopdec.report.data import Run
from test_report_hostile import COMMANDS, assert_clean, every_command, hop_run, run_cmd

SOME = [c for c in COMMANDS if c[0] != "plot" or "timeline" in c or "--what" not in c]
"""report, plot (loss), plot --what timeline, trace."""


# ---- text that is not Unicode ------------------------------------------------------------------------------
def test_a_lone_surrogate_in_a_log_is_drawn_and_written_as_a_replacement_character(tmp_path, capsys):
    """JSON may escape half a surrogate pair (``"\\udcff"``, what a name of non-UTF-8 bytes becomes when a
    program writes it with ``surrogateescape``): the page could not be encoded (a UnicodeEncodeError
    traceback, after an empty report.html was created) and matplotlib could not draw it."""
    d = hop_run(tmp_path / "run")
    p = os.path.join(d, "rank0.jsonl")
    lines = open(p).read().splitlines()
    head = json.loads(lines[0])
    head["run"]["topology"] = "ring\udcff(4)"
    head["run"]["hparams"] = {"lr\ud800": "x\udfff"}
    lines[0] = json.dumps(head)                     # (ensure_ascii: written as \udcff escapes)
    assert "\\udcff" in lines[0]
    open(p, "w").write("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    every_command(d, str(out), capsys, SOME)
    page = (out / "r.html").read_text(encoding="utf-8")
    assert "ring\ufffd(4)" in page
    assert Run.load(d).header["topology"] == "ring\ufffd(4)"


def test_a_run_folder_and_labels_of_non_utf8_bytes_are_named_with_replacement_characters(tmp_path, capsys):
    """A folder named with bytes that are not UTF-8 (Python holds them as lone surrogates) is a run's label:
    report and plot died in a traceback (the page's encoding, matplotlib's text layout); --labels and --title
    given such bytes alike."""
    d = hop_run(tmp_path / "x")
    bad = os.fsencode(str(tmp_path)) + b"/run\xff"
    os.rename(os.fsencode(d), bad)
    run_dir = os.fsdecode(bad)
    out = tmp_path / "out"
    out.mkdir()
    every_command(run_dir, str(out), capsys, SOME)
    assert "run\ufffd" in (out / "r.html").read_text(encoding="utf-8")
    label, title = os.fsdecode(b"lab\xfe"), os.fsdecode(b"ti\xfdtle")
    for argv in (["report", run_dir, "--labels", label, "--title", title, "-o", str(out / "l.html")],
                 ["plot", run_dir, "--labels", label, "--title", title, "-o", str(out / "l.png")]):
        code, err = run_cmd(argv, capsys)
        assert_clean(code, err, argv)
        assert code == 0, err
    page = (out / "l.html").read_text(encoding="utf-8")
    assert "lab\ufffd" in page and "ti\ufffdtle" in page


def test_a_page_holding_a_lone_surrogate_is_written_and_no_empty_file_left(tmp_path, capsys, monkeypatch):
    """Whatever text reaches the page, it is written: an encoding error after the file was opened left a
    0-byte report.html behind a traceback."""
    import hopdec.report.html as H
    d = hop_run(tmp_path / "run")
    monkeypatch.setattr(H, "render", lambda runs, title=None: "page \ud800")
    out = tmp_path / "r.html"
    code, err = run_cmd(["report", d, "-o", str(out)], capsys)
    assert code == 0 and "Traceback" not in err
    assert out.read_text(encoding="utf-8") == "page \ufffd"


# ---- numbers a figure cannot span ---------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["record", "eval", "event"])
def test_times_whose_span_overflows_are_skipped_and_counted(tmp_path, capsys, where):
    """Times of ±1.7e308 s are finite, so they were read, but the span between two is not: report and plot
    ended in a traceback from matplotlib's tick locator ('arange: cannot compute length'). Times beyond
    2^53 s either way are skipped as unreadable fields, and counted."""
    d = hop_run(tmp_path / "run")
    if where == "eval":
        with open(os.path.join(d, "eval.jsonl"), "a") as f:
            f.write('{"time": 1.7e308, "test_acc": 0.5}\n{"time": -1.7e308, "test_acc": 0.1}\n')
    else:
        p = os.path.join(d, "rank1.jsonl")
        lines = [json.loads(x) for x in open(p)]
        if where == "record":
            lines[3]["time"], lines[4]["time"], lines[5]["t_recv"] = 1.7e308, -1.7e308, 1.7e308
        else:
            lines += [{"event": "note", "time": 1.7e308, "what": "x"}, {"event": "note", "time": -1.7e308, "what": "y"}]
        open(p, "w").write("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    out.mkdir()
    every_command(d, str(out), capsys, SOME)
    assert Run.load(d).bad_lines == (3 if where == "record" else 2)


# ---- many runs in one figure -------------------------------------------------------------------------------
def _runs(n, iters=6):
    runs = []
    for i in range(n):
        recs = {w: [{"iter": k, "time": 0.1 * k + 0.01 * w, "loss": 2.0 - 0.01 * k - 0.02 * i}
                    for k in range(iters)] for w in range(2)}
        events = {0: [{"event": "consensus", "at": k, "dist_mean": 0.1 / (k + 1), "dist_max": 0.2 / (k + 1)}
                      for k in range(3)]}
        run = Run({"mode": "decentralized", "iterations": iters}, recs, events, label=f"run{i}")
        run.evals = [{"time": 0.1 * k, "test_acc": 0.5 + 0.01 * i + 0.1 * k} for k in range(3)]
        runs.append(run)
    return runs


def _look(line):
    return (tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color(),
            line.get_linestyle(), line.get_marker())


@pytest.mark.parametrize("n", [11, 20, 23])
def test_no_two_runs_of_a_figure_are_drawn_alike(n):
    """The loss, accuracy and consensus figures gave each run a colour of tab10's ten: of 11 runs the 11th
    was drawn exactly as the 1st, and a legend could not tell the two apart."""
    from hopdec.report import plots
    plt = plots.matplotlib()
    runs = _runs(n)
    fig, (a, b, c, d) = plt.subplots(1, 4)
    try:
        plots.loss_curves(a, b, runs)
        plots.accuracy_curves(c, runs)
        plots.consensus(d, runs)
        for ax, per_run in ((a, 1), (b, 1), (c, 1), (d, 2)):
            looks = [_look(line) for line in ax.get_lines()]
            assert len(looks) == n * per_run
            assert len(set(looks)) == len(looks), ax.get_title()
    finally:
        plt.close(fig)


def test_the_note_on_runs_without_a_loss_covers_no_curve():
    """Comparing runs with and without a training loss (a timing-only simulation beside a real run), the
    note naming the latter was drawn inside the axes' lower left, over the curves of the others, which end
    low on the right and start low on the left of a plot against time. It sits under the axis label now, in
    the figure."""
    from hopdec.report import plots
    plt = plots.matplotlib()
    runs = _runs(2, iters=40)
    sims = _runs(3)
    for i, r in enumerate(sims):
        r.header["simulated"] = "SIMULATED (timing only)"
        r.label = f"sim{i}"
        for recs in r.records.values():
            for rec in recs:
                rec.pop("loss")
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    try:
        plots.loss_curves(a, b, runs + sims)
        fig.tight_layout()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in (a, b):
            notes = [t for t in ax.texts if "no training loss logged" in t.get_text()]
            assert len(notes) == 1 and "sim2 (SIMULATED)" in notes[0].get_text()
            box = notes[0].get_window_extent(renderer)
            assert box.y1 <= ax.get_window_extent(renderer).y0        # under the data area, not in it
            assert box.y0 >= 0 and box.x0 >= 0 and box.x1 <= fig.bbox.x1   # and within the figure
    finally:
        plt.close(fig)


# ---- where the output goes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["report", "plot", "trace"])
@pytest.mark.parametrize("how", ["folder", "folder/", "missing/"])
def test_an_output_that_names_a_folder_is_refused_as_one(tmp_path, capsys, cmd, how):
    """``hopdec plot RUN -o figs`` with a folder figs wrote figs.png beside it, and ``-o figs/`` said
    "matplotlib cannot write . files" (of figs/.png); every command now says it is a folder, and writes
    nothing (``-o missing/``: that it names a folder, not that the folder is missing)."""
    d = hop_run(tmp_path / "run")
    (tmp_path / "folder").mkdir()
    target = os.path.join(str(tmp_path), how)          # (a pathlib path would drop the trailing /)
    before = sorted(os.listdir(tmp_path))
    code, err = run_cmd([cmd, d, "-o", target], capsys)
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.strip().endswith("; give a file name") and target in err, err
    assert sorted(os.listdir(tmp_path)) == before


# ---- a run that stopped before its end -----------------------------------------------------------------------
def test_a_killed_run_is_named_as_stopped_in_every_figure_and_the_trace(tmp_path, capsys):
    """A run killed at 6 of its 12 iterations was drawn by hopdec plot (loss, and the per-run panels) and
    traced exactly as a finished run, with nothing to tell it apart: only the report's table said "stopped
    early". Its legend entries and panel titles say where it stopped now, and the trace's otherData too."""
    from hopdec.report import plots
    d = hop_run(tmp_path / "killed")
    for r in range(4):                  # the first 6 records of 12 (and the header): as a SIGKILL leaves it
        p = os.path.join(d, f"rank{r}.jsonl")
        lines = open(p).read().splitlines()
        open(p, "w").write("\n".join(lines[:7]) + "\n")
    done = hop_run(tmp_path / "done")
    killed, finished = Run.load(d), Run.load(done)
    plt = plots.matplotlib()
    fig, (a, b) = plt.subplots(1, 2)
    try:
        plots.loss_curves(a, b, [killed, finished])
        for ax in (a, b):
            assert [t.get_text() for t in ax.get_legend().get_texts()] == ["killed (stopped at 6 of 12)", "done"]
    finally:
        plt.close(fig)
    fig, ax = plt.subplots()
    try:
        plots.per_run(ax, killed, "gap")
        assert ax.get_title().startswith("killed (stopped at 6 of 12):\n")
    finally:
        plt.close(fig)
    code, err = run_cmd(["trace", d, "-o", str(tmp_path / "t.json")], capsys)
    assert code == 0, err
    assert json.load(open(tmp_path / "t.json"))["otherData"]["stopped_early"] == "at iteration 6 of 12"
    assert killed.stopped_early() == (6, 12) and finished.stopped_early() is None


def test_a_rank_file_named_with_digits_of_another_script_is_not_read_as_that_rank():
    """``rank\u0661.jsonl`` (an Arabic-Indic one) beside ``rank1.jsonl`` was read as rank 1 as well (the name
    matched ``\\d`` and ``int()`` reads any script's digits): sorted after rank1.jsonl, it replaced that
    rank's header and records without a word, here another run's, escaping the check that one directory
    holds one run. Rank numbers are ASCII digits."""
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        d = hop_run(os.path.join(t, "run"))
        other = [{"rank": 1, "run": {"mode": "ps", "sync": "asp", "run_id": "other"}},
                 {"rank": 1, "iter": 0, "time": 0.0, "loss": 9.0}]
        with open(os.path.join(d, "rank\u0661.jsonl"), "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in other))
        run = Run.load(d)
        assert run.mode == "decentralized" and len(run.records[1]) == 12
        assert all(r["loss"] != 9.0 for recs in run.records.values() for r in recs)


def test_a_run_with_missing_rank_logs_says_so_in_its_figures(tmp_path):
    """Rank 1's log of a 2-rank run lost (killed before its header, not gathered from another host): the
    gap panel drew the one logged worker's gap, 0 throughout, under the run's bare name -- only stderr and
    the report's section said the logs were partial. Legends and titles say how many ranks' logs there are."""
    from hopdec.report import plots
    d = hop_run(tmp_path / "run")
    with open(os.path.join(d, "rank0.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    lines[0]["run"]["workers"] = 4
    with open(os.path.join(d, "rank0.jsonl"), "w") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    open(os.path.join(d, "rank2.jsonl"), "w").close()
    os.remove(os.path.join(d, "rank3.jsonl"))
    run = Run.load(d)
    plt = plots.matplotlib()
    fig, (a, b, c) = plt.subplots(1, 3)
    try:
        plots.per_run(a, run, "gap")
        assert a.get_title().startswith("run (logs of 2 of 4 ranks):\n")
        plots.loss_curves(b, c, [run])
        assert [t.get_text() for t in b.get_legend().get_texts()] == ["run (logs of 2 of 4 ranks)"]
    finally:
        plt.close(fig)
    assert Run.load(hop_run(tmp_path / "whole")).ranks_logged is None


def test_a_killed_parameter_server_run_is_named_as_stopped_in_its_figures(tmp_path, capsys):
    """The glance table marks a PS run whose server wrote no summary as stopped early; its legend entries,
    panel titles and trace said nothing (a PS run's workers share a budget: stopped_early() leaves them out)."""
    from hopdec.report import plots
    from test_report_hostile import _ps_lines, _write
    lines = {r: _ps_lines(r) for r in range(3)}
    lines[0] = [x for x in lines[0] if x.get("event") != "summary"]
    lines[1], lines[2] = lines[1][:5], lines[2][:5]
    run = Run.load(_write(tmp_path / "ps", lines))
    plt = plots.matplotlib()
    fig, (a, b, c) = plt.subplots(1, 3)
    try:
        plots.loss_curves(a, b, [run])
        assert [t.get_text() for t in a.get_legend().get_texts()] == ["ps (stopped early: 8 of 16 gradients)"]
        plots.per_run(c, run, "timeline")
        assert c.get_title().startswith("ps (stopped early: 8 of 16 gradients):\n")
    finally:
        plt.close(fig)
    code, err = run_cmd(["trace", run.path, "-o", str(tmp_path / "t.json")], capsys)
    assert code == 0, err
    assert json.load(open(tmp_path / "t.json"))["otherData"]["stopped_early"] == "8 of 16 gradients pushed"
