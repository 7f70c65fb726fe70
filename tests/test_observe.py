"""Watching runs without MPI: progress boards, the report of a simulated run, traces from logs, --help."""

import argparse
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from hopdec.errors import ConfigError
from hopdec.hop.config import ProtocolConfig
from hopdec.hop.worker import node_views
from hopdec.observe.progress import GridSampler, ProgressBoard, VirtualProgress
from hopdec.report.data import Run
from hopdec.sim.inproc import InProcNetwork
from hopdec.topology import generators as G

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- progress ---------------------------------------------------------------------------------------
def test_grid_sampler_reports_the_iteration_at_each_grid_point():
    s = GridSampler(t0=0.0, dt=1.0, iterations=10)
    assert s.on_record({"iter": 0, "loss": 2.0}, 0.4) is None           # no grid point passed yet
    assert s.on_record({"iter": 1, "loss": 1.0}, 2.5) == (1, 2, 1, 2, 1.5)   # in iteration 1 at t=1 and 2
    assert s.on_record({"iter": 2, "loss": 1.0, "jump": [2, 5]}, 3.2) == (3, 3, 2, 5, 1.0)
    assert s.on_record({"iter": 5, "loss": 1.0}, 3.9) is None


def test_board_prints_a_grid_point_once_every_worker_reported_it():
    b = ProgressBoard([0, 1, 2], iterations=100, dt=1.0, bound=4)
    b.add(0, 1, 1, 10, 11, 0.5)
    b.add(1, 1, 1, 7, 8, 0.7)
    assert b.lines(1) == []                                          # rank 2 has not reported t=1
    b.add(2, 1, 1, 9, 10, 0.6)
    (line,) = b.lines(1)
    assert "iter 7..10 of 100 (slowest rank 1, fastest rank 0)" in line
    assert "gap 3 (bound 4)" in line and "loss 0.6" in line and "8.67 it/s" in line
    assert b.lines(1) == []                                          # printed once
    b.add(0, 2, 3, 12, 13, 0.4)
    b.add(2, 2, 3, 11, 12, 0.4)
    late = b.lines(3)                                                # rank 1 silent for two intervals
    assert len(late) == 1 and "waiting for rank 1: in iter >= 8" in late[0]
    b.finish(1, 99)
    (line,) = b.lines(3)
    assert "iter 11..99" in line


def test_when_every_rank_is_silent_the_progress_note_blames_none_of_them():
    """A stopped rank stalls its neighbours, and they theirs: every rank stops reporting. The note named
    the first silent rank, 'waiting for rank 0 ... (and 2 more)', blaming rank 0 (the printer, as stuck as
    the rest) for a stop of rank 2; it says that every rank is silent instead."""
    b = ProgressBoard([0, 1, 2], iterations=100, dt=3.0, bound=1)
    for w, k in ((0, 898), (1, 898), (2, 897)):
        b.add(w, 1, 3, k, k + 1, 0.5)
    assert len(b.lines(3)) == 1                                      # the grid point t=9 s
    (note,) = b.lines(5)                                             # nobody reported t=12 or t=15
    assert "every rank silent since 9.0 s, in iter >= 898..899" in note, note
    assert "waiting for rank" not in note
    assert b.lines(5) == []                                          # once per interval
    b.add(1, 4, 7, 899, 900, 0.5)                                    # rank 1 moves on: rank 0 is named
    (note,) = b.lines(7)
    assert "waiting for rank 0: in iter >= 899 since 9.0 s (and 1 more)" in note, note


def test_the_last_progress_line_says_a_stopped_run_ended_early():
    """After a clean stop (Ctrl-C to a launcher) at iteration 254 of 5000 the last progress line said 'all 4
    workers finished', beside the stop's own line; it says where they ended. A run that ran out says
    finished, as does one that never announced a length (HopOptimizer without ``steps``)."""
    def board(n, lasts):
        b = ProgressBoard(range(len(lasts)), iterations=n, dt=1.0, bound=2)
        for w, last in enumerate(lasts):
            b.add(w, 1, 1, last, last, 0.5)
            b.finish(w, last)
        return b
    stopped = board(5000, [254, 254, 253, 254])
    assert stopped.ending() == "ended early (before iter 5000)"
    assert stopped.lines(1)[0].endswith("all ended early (before iter 5000)")
    assert board(200, [199, 200, 199]).ending() == "finished"        # the last iteration, 0-based or next
    assert board(None, [12, 12]).ending() == "finished"
    assert board(200, [199, 200]).lines(1)[0].endswith("all finished")


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_ps_progress_gap_stays_within_the_staleness_bound_while_replies_are_in_flight(staleness):
    """SSP releases the fast workers and answers the slowest's push in one server step; the reply to the
    slowest (worker 2, node 3) then arrives later than theirs. A mini-batch ends when the server released the worker
    from it (its clock, as the progress grid's), not when the reply arrived, or a grid point in that
    window shows the gap one above the bound (a CI run printed "gap 2 (bound 1)")."""
    from hopdec.ps.sync.ssp import SSPPolicy
    from hopdec.sim.network import LinkModel
    from hopdec.sim.ps import PSSim
    dt, period = 0.05, (1.0, 1.0, 2.3, 0.7)
    samplers = {w: GridSampler(0.0, dt, None) for w in range(4)}
    board = ProgressBoard(range(4), None, dt, bound=staleness)
    sim = None

    def on_record(w, rec):
        msg = samplers[w].on_record(rec, sim.now)
        if msg is not None:
            board.add(w, *msg)

    sim = PSSim(SSPPolicy(range(4), staleness), lambda w, i: period[w], on_record=on_record,
                network=LinkModel(latency=0.01, links={(0, 3): (None, 0.3)}))   # the slowest's replies lag
    sim.run(60)
    last = board.complete()
    assert last > 100                                 # hundreds of grid points, many inside reply windows
    gaps = []
    for g in range(1, last + 1):
        its = [board._iter_at(w, g) for w in range(4)]
        gaps.append(max(its) - min(its))
    assert max(gaps) == staleness                     # reached, never passed


def test_virtual_progress_labels_virtual_time():
    out = io.StringIO()
    vp = VirtualProgress([0, 1], iterations=5, interval=1.0, stream=out, wall_interval=0.0)
    for k in range(5):
        vp.on_record(0, {"iter": k, "loss": 1.0}, 0.6 * (k + 1))
        vp.on_record(1, {"iter": k, "loss": 1.0}, 0.9 * (k + 1))
    lines = vp.tick(force=True)
    assert lines and "virtual s" in lines[-1] and out.getvalue().strip().endswith(lines[-1])


# ---- a simulated run: logs written like a real run's, times virtual ---------------------------------
def _simulated_run(tmp_path, spans=True):
    """Hop's cores in one process (virtual time = scheduler steps); logs as a run writes them."""
    from hopdec.runtime import hop_loop
    g = G.ring(6)
    cfg = ProtocolConfig(iterations=30, max_ig=2)
    views = node_views(g)
    net = InProcNetwork(views, cfg, seed=3, speeds=[1, 1, 1, 1, 1, 0.3])
    net.loops = [hop_loop.worker_loop(c, io_, b, on_record=net.records[c.rank].append, step=True,
                                      clock=lambda: float(net.steps), spans=spans)
                 for c, io_, b in zip(net.cores, net.ios, net.backends)]
    net.run()
    d = tmp_path / "sim"
    d.mkdir()
    header = dict(mode="decentralized", simulated="SIMULATED (timing only)", topology="ring(6)",
                  protocol="tokens", setting="standard", iterations=30, gap_bound=6, message_bytes=32)
    for r, recs in enumerate(net.records):
        with open(d / f"rank{r}.jsonl", "w") as f:
            f.write(json.dumps({"rank": r, "run": header}) + "\n")
            for rec in recs:
                f.write(json.dumps(rec) + "\n")
            if r == 0:
                for k in (10, 20, 30):
                    f.write(json.dumps(dict(event="consensus", at=k, time=float(k), dist_mean=1.0 / k,
                                            dist_max=2.0 / k, dists=[1.0 / k] * 6)) + "\n")
    with open(d / "rank5.jsonl", "a") as f:
        f.write('{"rank": 5, "iter": 30, "time": 1')                 # a killed rank's broken last line
    return d, net


def test_reader_on_a_simulated_run(tmp_path):
    d, net = _simulated_run(tmp_path)
    run = Run.load(d)
    assert run.simulated == "SIMULATED (timing only)" and run.time_unit == "virtual s"
    assert run.bad_lines == 1 and run.workers == list(range(6))
    assert [len(run.records[w]) for w in run.workers] == [len(r) for r in net.records]
    t, g = run.gap_over_time()
    assert len(t) and g.max() <= run.bound and g.max() >= 1
    # the replayed largest gap agrees with the pairwise matrix of hopdec.runtime.metrics
    assert int(run.gap_matrix().max()) == int(g.max())
    b = run.breakdown()
    assert set(b) == set(range(6)) and all(v >= 0 for p in b.values() for v in p.values())
    c = run.counters()
    assert c[0]["messages_sent"] == sum(r["sent"] for r in net.records[0])
    assert c[0]["bytes_sent"] == 32 * c[0]["messages_sent"]
    assert run.edges()[(0, 1)] == sum(1 in r.get("sent_to", []) for r in net.records[0])


def test_polls_are_a_part_of_the_breakdown_not_other(tmp_path):
    """Records with ``poll_s`` (an MPI run's loop times its polls): "poll" is a part of its own and "other"
    is what no part covers."""
    d = tmp_path / "run"
    d.mkdir()
    recs = [dict(rank=0, iter=k, time=0.01 * k, compute_s=0.004, wait_s=0.001, wait_updates_s=0.001,
                 reduce_s=0.001, send_s=0.0, apply_s=0.001, poll_s=0.002) for k in range(11)]
    with open(d / "rank0.jsonl", "w") as f:
        f.write(json.dumps({"rank": 0, "run": {"mode": "decentralized", "iterations": 11}}) + "\n")
        f.writelines(json.dumps(r) + "\n" for r in recs)
    p = Run.load(d).breakdown()[0]
    assert p["poll"] == pytest.approx(0.022) and p["compute"] == pytest.approx(0.044)
    assert p["other"] == pytest.approx(0.1 - 0.009 * 10)       # 10 iterations span 0.1 s; the last not in it


def test_report_of_a_simulated_run_says_so(tmp_path):
    d, _ = _simulated_run(tmp_path)
    out = tmp_path / "r.html"
    p = subprocess.run([sys.executable, "-m", "hopdec.cli", "report", str(d), "-o", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert "SIMULATED (timing only)" in page and "virtual" in page
    assert "1 unreadable log line(s) skipped" in page
    assert page.count("data:image/png;base64,") >= 3


def test_trace_from_logs_of_a_simulated_run(tmp_path):
    d, net = _simulated_run(tmp_path)
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "hopdec.cli", "trace", str(d), "-o", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    obj = json.loads(out.read_text())
    assert obj["otherData"]["time"].startswith("virtual")
    ev = obj["traceEvents"]
    its = [e for e in ev if e["ph"] == "X" and e["cat"] == "iteration"]
    assert len(its) == sum(len(r) for r in net.records)
    waits = [e for e in ev if e["ph"] == "X" and e["cat"] == "wait"]
    assert waits and all(re.fullmatch(r"wait (updates|tokens) \([\d,]*\)", e["name"]) for e in waits)
    used = sum(1 for recs in net.records for r in recs for terms in r.get("reduced", [])
               for s, _, _ in terms if s != r["rank"])
    assert sum(e["ph"] == "s" for e in ev) == used                   # one arrow per update used


def test_records_split_the_waits_by_what(tmp_path):
    _, net = _simulated_run(tmp_path)
    for recs in net.records:
        for r in recs:
            kinds = sum(r.get(f"wait_{k}_s", 0.0) for k in ("updates", "tokens", "acks"))
            assert kinds == pytest.approx(r["wait_s"])
            assert sum(s for _, s in r.get("waited_on", [])) >= r["wait_s"] - 1e-9 or not r.get("waited_on")
    slow = net.records[5]
    assert sum(r["wait_s"] for r in slow) < np.mean([sum(r["wait_s"] for r in net.records[w]) for w in range(5)])


# ---- options and --help ------------------------------------------------------------------------------
def _parsers():
    from hopdec.cli import report, topo, train
    tp = topo.build_parser()
    subs = next(a for a in tp._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {"train": train.build_parser(), **{f"topo {k}": v for k, v in subs.items()},
            "report": report.report_parser(), "plot": report.plot_parser(), "trace": report.trace_parser()}


@pytest.mark.parametrize("name", ["train", "topo generate", "topo analyze", "topo compare", "report",
                                  "plot", "trace"])
def test_every_option_has_help_and_says_its_default_once(name):
    p = _parsers()[name]
    for a in p._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
            continue
        assert a.help and a.help.strip(), f"{name}: {a.option_strings or a.dest} has no help text"
        text = p.formatter_class(prog=p.prog)._expand_help(a)
        assert "(default: None)" not in text, (name, a.option_strings, text)
        if "default" in a.help.lower():          # a text that explains its default gets no second one
            assert "(default: " not in text or "(default: " in a.help, (name, a.option_strings, text)
    help_text = p.format_help()
    assert "(default: None)" not in help_text and "(default: False)" not in help_text


def test_train_help_names_what_mpirun_needs():
    from hopdec.cli.train import build_parser
    text = build_parser().format_help()
    assert "--oversubscribe" in text and "--allow-run-as-root" in text


def test_experiment_scripts_name_no_internal_issue():
    here = os.path.join(ROOT, "experiments")
    for f in os.listdir(here):
        if f.endswith(".py"):
            src = open(os.path.join(here, f)).read()
            assert not re.search(r"\bissue \d+", src, re.I), f


def test_observe_options_are_checked_in_one_line(tmp_path):
    from hopdec.cli.train import parse
    from hopdec.observe.options import check_observe_options
    with pytest.raises(ConfigError, match="--consensus-every 0: must be an integer >= 1"):
        check_observe_options(parse(["--consensus-every", "0"]).observe)
    with pytest.raises(ConfigError, match="--consensus-every is not used in --mode ps"):
        check_observe_options(parse(["--consensus-every", "5", "--mode", "ps"]).observe)
    with pytest.raises(ConfigError, match="--progress-interval nan"):
        check_observe_options(parse(["--progress-interval", "nan"]).observe)
    with pytest.raises(ConfigError, match="--trace .*: cannot write"):
        check_observe_options(parse(["--trace", str(tmp_path / "no" / "t.json")]).observe)
    with pytest.raises(ConfigError, match="--eval-interval in a decentralized run .* --consensus-every"):
        check_observe_options(parse(["--eval-interval", "2"]).observe)
    check_observe_options(parse(["--trace", str(tmp_path / "t.json"), "--consensus-every", "3",
                                        "--eval-interval", "2"]).observe)
    check_observe_options(parse(["--eval-interval", "2", "--mode", "ps"]).observe)


def test_evaluations_and_consensus_rounds_with_nowhere_to_go_are_one_note(tmp_path, capsys):
    """``--eval-interval`` or ``--consensus-every`` without --log-dir, --tensorboard or --trace ran their
    evaluations and rounds (an all-reduce's workers all waiting for each) and showed none of them, without a
    word. One note each now; with any of the three, none."""
    from hopdec.cli.sim import parse as sim_parse
    from hopdec.cli.train import parse
    from hopdec.sim.run import simulate
    notes = parse(["--consensus-every", "3", "--eval-interval", "2"]).observe.unseen()
    assert notes == ["--eval-interval 2: the evaluations go to --log-dir, --tensorboard or --trace, and none is "
                     "given: only the last one shows (in the summary)",
                     "--consensus-every 3: the rounds go to --log-dir, --tensorboard or --trace, and none is "
                     "given: nothing shows them"]
    for out in (["--log-dir", str(tmp_path / "l")], ["--tensorboard", str(tmp_path / "tb")],
                ["--trace", str(tmp_path / "t.json")]):
        assert parse(["--consensus-every", "3", "--eval-interval", "2"] + out).observe.unseen() == []
    assert parse(["--mode", "ps"]).observe.unseen() == []
    base = ["--mode", "ps", "-n", "2", "--model", "mlp", "--math", "--iterations", "3", "--no-progress",
            "--eval-interval", "0.1"]
    simulate(sim_parse(base), out=io.StringIO())       # the simulator takes --log-dir only
    assert ("hopdec sim: note: --eval-interval 0.1: the evaluations go to --log-dir, and it is not given: only "
            "the last one shows (in the summary)") in capsys.readouterr().err.splitlines()
    simulate(sim_parse(base + ["--log-dir", str(tmp_path / "s")]), out=io.StringIO())
    assert "--eval-interval" not in capsys.readouterr().err


def test_missing_tensorboard_is_one_line(monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    from hopdec.observe.tensorboard import check_available
    with pytest.raises(ConfigError, match=r"--tensorboard needs the tensorboard package: pip install"):
        check_available()


def test_report_refuses_a_folder_without_logs(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hopdec.cli", "report", str(tmp_path), "-o",
                        str(tmp_path / "x.html")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no rank*.jsonl" in p.stderr


def test_a_trace_in_the_log_dir_is_accepted_before_the_log_dir_exists(tmp_path):
    """--log-dir D --trace D/trace.json: rank 0's check used to pass only when another rank had made D
    already (a race the start-up roll call, which starts setup on every rank at once, made visible)."""
    from hopdec.cli.train import build_parser
    from hopdec.observe.options import check_observe_options
    d = tmp_path / "logs"
    check_observe_options(build_parser().parse_args(["--log-dir", str(d), "--trace", str(d / "trace.json")]))
    assert d.is_dir()


def test_simulate_prints_to_the_stdout_of_the_call(monkeypatch):
    """``simulate``'s default output was the ``sys.stdout`` of its import: after a test had captured the
    import-time stream and closed it, ``hopdec sim`` raised "I/O operation on closed file"."""
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    simulate(parse(["--topology", "ring", "-n", "3", "--iterations", "2", "--no-progress"]))
    assert "SIMULATED" in out.getvalue()


def test_a_timing_only_simulations_report_says_there_is_no_loss_without_a_warning(tmp_path):
    """A timing-only run logs no loss: the loss panels say so (matplotlib warned 'No artists with labels'
    on the user's terminal before, and drew two empty panels)."""
    import warnings

    from hopdec.cli.main import main as cli_main
    logs = tmp_path / "logs"
    assert cli_main(["sim", "--topology", "ring", "-n", "4", "--iterations", "5", "--log-dir", str(logs)]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli_main(["report", str(logs), "-o", str(tmp_path / "r.html")]) == 0
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hopdec.report.data import Run
    from hopdec.report.plots import loss_curves
    fig, (ax_t, ax_k) = plt.subplots(1, 2)
    loss_curves(ax_t, ax_k, [Run.load(str(logs))])
    assert all("no training loss" in " ".join(t.get_text() for t in ax.texts) for ax in (ax_t, ax_k))
    plt.close(fig)


def test_consensus_rounds_every_k_then_the_end_or_open_ended():
    """Rounds come every K-th iteration and at the end of training (``hopdec train``), or every K-th with
    no end where nobody knows the length (a user's loop: ``HopOptimizer(consensus_every=K)``)."""
    from hopdec.observe.consensus import next_round

    def rounds(every, iterations, upto=60):
        out, at = [], next_round(0, every, iterations)
        while at is not None and at <= upto:
            out.append(at)
            at = next_round(at, every, iterations)
        return out
    for every in (None, 1, 3, 7):
        for iterations in range(1, 25):
            expected = (list(range(every, iterations, every)) if every else []) + [iterations]
            assert rounds(every, iterations) == expected, (every, iterations)
    assert rounds(4, None, upto=21) == [4, 8, 12, 16, 20]
    assert rounds(None, None) == []


@pytest.mark.parametrize("header, what, rate", [({"local_steps": 4}, "round 3 of 10", "rounds/s"),
                                                ({}, "iter 3 of 10", "it/s")])
def test_live_progress_of_a_local_steps_run_counts_rounds(header, what, rate):
    """``hopdec train --iterations 60 --local-steps 4`` printed "iter 4 of 15 ... 4 it/s": 15 read as the
    iterations asked for (60), and its rounds/s as iterations/s. The lines now say rounds (the header says
    H), as the summary and the report do."""
    from mpi4py import MPI

    from hopdec.observe import RunObserver
    from hopdec.optim.assembly import observe_settings
    obs = RunObserver(observe_settings(None, True, 1.0, None), MPI.COMM_SELF, 10.0, lambda *a, **k: None,
                      "worker", [0], 10, header)
    obs.begin()
    try:
        board = obs.progress.board
        board.add(0, 1, 1, 3, 4, 0.5)
        line = board.lines(1)[0]
        assert f"  {what} " in line and f" {rate}" in line and ("it/s" not in line) == bool(header), line
    finally:
        obs.finished(9)
        obs.close()
