"""``experiments/netns_hetero.py``'s options, without a testbed: the groups ``--only`` names, what a fresh run
clears in ``--out`` (the runs themselves need network namespaces: ``tests/test_testbed.py``)."""

import os
import sys

import pytest

from conftest import ROOT, mpi_env, run_bounded

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import netns_hetero as NH  # noqa: E402

SCRIPT = f"{ROOT}/experiments/netns_hetero.py"


def script(*args):
    return run_bounded([sys.executable, SCRIPT, *args], 60, env=mpi_env())


def test_only_names_groups_and_ps_names_both_ps_groups():
    assert NH.chosen_groups("ps") == ["ps-thin", "ps-control"]
    assert NH.chosen_groups("graphs,fig21") == ["fig21", "graphs"]
    assert NH.chosen_groups(",".join(NH.GROUPS)) == list(NH.GROUPS)


def test_the_groups_are_the_ones_it_runs(tmp_path):
    assert [name for name, _, _ in NH.groups(str(tmp_path), 5)] == list(NH.GROUPS)


@pytest.mark.parametrize("only", ["bogus", "graphs,ps-thick", ","])
def test_an_unknown_group_is_refused_in_one_line_before_anything_runs(tmp_path, only):
    """Before: an unknown name was skipped without a word, exit 0 (and ``--out`` had been emptied)."""
    (tmp_path / "mine.txt").write_text("a user's file")
    out = script("--only", only, "--out", tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and f"--only {only}" in lines[0] and "fig21" in lines[0]
    assert (tmp_path / "mine.txt").exists()


def test_a_fresh_run_clears_only_what_its_groups_wrote(tmp_path):
    """Before: the whole ``--out`` folder was removed (``--out .`` emptied the current folder)."""
    for d in ("graphs", "fig21", "notes"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "x").write_text("x")
    for f in ("mine.txt", "results.json", "runs_graphs.json", "runs_fig21.json"):
        (tmp_path / f).write_text("{}")
    NH.clear_groups(str(tmp_path), ["graphs"])
    assert sorted(os.listdir(tmp_path)) == ["fig21", "mine.txt", "notes", "runs_fig21.json"]


def test_report_only_without_the_runs_is_one_line(tmp_path):
    """Before: a traceback (FileNotFoundError on the group's stdout.txt)."""
    out = script("--report-only", "--only", "graphs", "--out", tmp_path)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "has no runs of graphs" in lines[0] and "Traceback" not in out.stderr
