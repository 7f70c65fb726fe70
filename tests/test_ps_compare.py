"""``experiments/ps_compare.py`` (the parameter-server sync models against Hop on real runs): options that
cannot work are refused before any run, and a comparison whose runs failed does not end 0."""

import sys

import pytest

from conftest import ROOT, mpi_env, run_bounded

SCRIPT = f"{ROOT}/experiments/ps_compare.py"


def compare(tmp_path, *args, timeout=60):
    return run_bounded([sys.executable, SCRIPT, "--out", tmp_path / "out", *args], timeout, env=mpi_env())


@pytest.mark.parametrize("args,named", [
    (["--workers", "2"], "--slow-rank 3"),                    # the default slow worker, of 2
    (["--workers", "4", "--slow-rank", "0"], "--slow-rank 0"),  # rank 0 is the server in PS mode
    (["--workers", "4", "--slow-rank", "2"], "topologies/ring_based_8.json"),   # 8 nodes, 4 workers
])
def test_options_no_run_could_use_are_refused_at_once_in_one_line(tmp_path, args, named):
    """Before: every run failed on the same bad option (the same error seven times from hopdec train,
    a table of 'failed' rows) and the script ended 0."""
    out = compare(tmp_path, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and named in lines[0], out.stderr
    assert "FAILED" not in out.stderr and not (tmp_path / "out").exists()


@pytest.mark.mpi
def test_a_comparison_whose_run_failed_ends_non_zero_naming_it(tmp_path):
    """A run that fails -- here one that cannot finish in --timeout, killed with its ranks (before: an
    uncaught TimeoutExpired, a traceback) -- is a row 'failed', and the script ends 1 with one line saying
    how many failed (before: 0)."""
    out = compare(tmp_path, "--workers", "2", "--slow-rank", "1", "--iterations", "2", "--only", "bsp",
                  "--timeout", "0.5", timeout=240)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "| BSP | failed |" in out.stdout and "Traceback" not in out.stderr
    assert "BSP: FAILED (killed after 0.5 s (--timeout))" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("ps_compare: 1 of 1 runs failed (BSP)")
