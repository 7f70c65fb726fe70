"""``experiments/ddp_compare.py`` (Hop against PyTorch DDP): its argument rules, the emulated slowdown
schedule, the table built from runs, and its ``--quick`` mode for real (one mpirun job of 4 ranks running
a DDP row and a Hop row on a tiny transformer, JSON and table written)."""

import importlib
import json
import os
import sys

import numpy as np
import pytest

from conftest import ROOT, mpi_env, run_bounded

EXP = os.path.join(ROOT, "experiments")


@pytest.fixture(scope="module")
def dc():
    if EXP not in sys.path:
        sys.path.insert(0, EXP)
    return importlib.import_module("ddp_compare")


def test_quick_defaults_and_bad_arguments(dc, capsys):
    a = dc.parse_args(["--quick"])
    assert (a.steps, a.repeats, a.conditions, a.rows) == (24, 1, ["none"], ["ddp", "hop"])
    a = dc.parse_args(["--quick", "--conditions", "straggler", "--rows", "ddp,hop-skip"])
    assert (a.conditions, a.rows) == (["straggler"], ["ddp", "hop-skip"])
    a = dc.parse_args([])
    assert a.conditions == list(dc.CONDITIONS)
    assert a.rows == ["ddp", "hop", "hop-backup", "hop-backup-ig4", "hop-stale", "hop-skip"]
    assert a.eval_every == 10 and a.with_allreduce == "auto"
    for bad in (["--rows", "hop"], ["--conditions", "slow"], ["--rows", "ddp,adam"], ["--slow-rank", "4"],
                ["--random-prob", "2"]):
        with pytest.raises(SystemExit) as e:
            dc.parse_args(bad)
        assert e.value.code == 2, bad
        assert "error:" in capsys.readouterr().err


def test_slowdown_schedule(dc):
    assert not dc.slowdown_schedule("none", 4, 50).any()
    s = dc.slowdown_schedule("straggler", 4, 50, slow_rank=2)
    assert s[2].all() and not s[[0, 1, 3]].any()
    r = dc.slowdown_schedule("random", 4, 2000, prob=0.25, seed=1)
    assert r.shape == (4, 2000) and abs(r.mean() - 0.25) < 0.02 and 0.2 < r[0].mean() < 0.3
    assert np.array_equal(r, dc.slowdown_schedule("random", 4, 2000, prob=0.25, seed=1))   # every row: same
    assert not np.array_equal(r, dc.slowdown_schedule("random", 4, 2000, prob=0.25, seed=2))
    with pytest.raises(ValueError):
        dc.slowdown_schedule("sometimes", 4, 10)


def test_lr_schedule_warms_up_then_decays_to_a_tenth(dc):
    f = [dc.lr_factor(k, 200) for k in range(200)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)     # warmup: max(10, 5% of 200)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[-1] == pytest.approx(0.1, abs=1e-3)


def _run(row, rep, t_end, losses, times, condition="none"):
    return {"condition": condition, "row": row, "repeat": rep, "iters": [10, 20, 30, 40], "times": times,
            "loss": losses, "t_end": t_end, "steps": [40, 40, 40, 40 if row != "hop-skip" else 15],
            "jumps": [0, 0, 0, 0 if row != "hop-skip" else 12]}


def test_table_ratios_are_per_repeat_against_ddp(dc):
    runs = [_run("ddp", 0, 8.0, [3, 2.5, 2.2, 2.0], [2, 4, 6, 8]),
            _run("hop", 0, 4.0, [3, 2.6, 2.3, 2.1], [1, 2, 3, 4]),
            _run("ddp", 1, 10.0, [3, 2.5, 2.2, 2.0], [2.5, 5, 7.5, 10]),
            _run("hop", 1, 10.0, [3, 2.6, 2.4, 2.3], [2.5, 5, 7.5, 10]),
            _run("ddp", 0, 24.0, [3, 2.5, 2.2, 2.0], [6, 12, 18, 24], "straggler"),
            _run("hop-skip", 0, 6.0, [3, 2.7, 2.5, 2.4], [1.5, 3, 4.5, 6], "straggler")]
    assert dc.default_target(runs, 40) == 2.2                  # DDP, no straggler, at 3/4 of the steps
    assert dc.time_to(runs[1], 2.3) == 3 and dc.time_to(runs[3], 2.2) is None
    s = {(x["condition"], x["row"]): x for x in dc.summarize(runs, 2.3, 40)}
    hop = s[("none", "hop")]
    assert hop["steps_ratio"] == pytest.approx(1.5)            # median of 2.0 and 1.0
    assert hop["speedup_to_target"] == pytest.approx(1.375)    # median of 6 / 3 and 7.5 / 10
    assert hop["loss_at_steps"] == pytest.approx(2.2) and hop["reached"] == 2
    skip = s[("straggler", "hop-skip")]
    assert skip["steps_ratio"] == pytest.approx(4.0) and skip["speedup_to_target"] is None   # 2.3: missed
    assert skip["slow_rank_steps"] == 15 and skip["jumps"] == 12
    text = dc.table(dc.summarize(runs, 2.3, 40), 2.3, 40)
    lines = text.splitlines()
    assert len(lines) == 2 + 4 and "time to loss 2.300" in lines[0]
    assert "| straggler | hop-skip | 6.67 | 4.00x | - (0/1 reached) | -x |" in text


def test_run_plan_interleaves_and_rotates(dc):
    a = dc.parse_args(["--repeats", "2", "--conditions", "none,random", "--rows", "ddp,hop,hop-skip"])
    order = [(r["repeat"], r["condition"], r["row"]) for r in dc.run_plan(a, "/x")]
    assert order[:6] == [(0, "none", "ddp"), (0, "none", "hop"), (0, "none", "hop-skip"),
                         (0, "random", "ddp"), (0, "random", "hop"), (0, "random", "hop-skip")]
    assert order[6:9] == [(1, "none", "hop"), (1, "none", "hop-skip"), (1, "none", "ddp")]


@pytest.mark.mpi
def test_quick_runs_ddp_and_hop_for_real(tmp_path):
    """The smallest real comparison: one mpirun job, 4 ranks, DDP (gloo) then HopOptimizer."""
    out = tmp_path / "out"
    proc = run_bounded([sys.executable, os.path.join(EXP, "ddp_compare.py"), "--quick", "--steps", "8",
                        "--dim", "32", "--layers", "1", "--val-windows", "64", "--compute-time", "0.01",
                        "--out", out], timeout=240, env=mpi_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert [(r["row"], r["condition"]) for r in res["runs"]] == [("ddp", "none"), ("hop", "none")]
    for r in res["runs"]:
        assert r["iters"] == list(range(1, 9)) and r["steps"] == [8] * 4
        assert all(np.isfinite(r["loss"])) and r["loss"][-1] < r["loss"][0] < 6      # it learned something
        assert r["times"] == sorted(r["times"]) and 0 < r["times"][-1] <= r["t_end"] + 1e-6
    table = (out / "table.md").read_text()
    assert "| none | ddp |" in table and "| none | hop |" in table and "emulated" in table
    assert "| none | hop |" in proc.stdout


def test_allreduce_row_refused_where_hopdec_train_lacks_the_mode(dc, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(dc, "allreduce_available", lambda: False)
    for argv in (["--rows", "ddp,allreduce"], ["--with-allreduce", "yes"]):
        assert dc.main(argv + ["--quick", "--out", str(tmp_path / "o")]) == 2
        assert "no --mode allreduce" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()                       # refused before anything ran
