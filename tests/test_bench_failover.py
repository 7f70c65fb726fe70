"""``experiments/bench_failover.py`` (how fast survivors notice a failure and heal): a run that cannot get as
far as the failure, and options it cannot use, end with one line naming the cause."""

import sys

import pytest

from conftest import ROOT, mpi_env, run_bounded

SCRIPT = f"{ROOT}/experiments/bench_failover.py"


def bench(*args, timeout=120):
    return run_bounded([sys.executable, SCRIPT, *args], timeout, env=mpi_env())


@pytest.mark.mpi
def test_a_run_that_ends_before_the_failure_is_one_line_with_its_own_last_line():
    """Before: a traceback ending in ProcessLookupError (the script killed a session that had ended)."""
    out = bench("--repeats", "1", "--cases", "tcp:kill", "--compute-time", "-1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("bench_failover: tcp:kill: the run ended before worker 3 logged 30 iterations")
    assert "--compute-time" in lines[0]           # hopdec train's own refusal, quoted


@pytest.mark.parametrize("args,named", [(["--cases", "tcp:crash"], "--cases tcp:crash"),
                                        (["--at", "150"], "--at 150")])
def test_options_it_cannot_use_are_refused_in_one_line(args, named):
    out = bench(*args, timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and named in lines[0], out.stderr
