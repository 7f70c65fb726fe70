"""``experiments/validate_sim.py --out``: a fresh run empties only a folder of its own (new, empty, or an
earlier run's); a folder with other files is refused in one line, untouched."""

import os
import sys

import pytest

from conftest import ROOT, mpi_env, run_bounded

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import validate_sim as VS  # noqa: E402


def test_a_new_an_empty_and_an_earlier_runs_folder_are_made_fresh(tmp_path):
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        VS.fresh_out(str(out))
        assert os.listdir(out) == [VS.OUT_MARK]
    (tmp_path / "new" / "case1").mkdir()
    (tmp_path / "new" / "results.json").write_text("{}")
    VS.fresh_out(str(tmp_path / "new"))             # an earlier run's: emptied
    assert os.listdir(tmp_path / "new") == [VS.OUT_MARK]


def test_a_folder_with_files_it_did_not_write_is_refused_untouched(tmp_path):
    """Before: ``--out`` was removed whole (``--out .`` emptied the current folder)."""
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(ValueError, match="holds files this script did not write"):
        VS.fresh_out(str(tmp_path))
    out = run_bounded([sys.executable, f"{ROOT}/experiments/validate_sim.py", "--out", tmp_path], 60,
                      env=mpi_env())
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and f"--out {tmp_path}" in lines[0], out.stderr
    assert os.listdir(tmp_path) == ["thesis.tex"]
