"""A failure on one rank ends the whole job fast, with one line naming the rank and the cause (issue 8).

Every job runs under the mpirun fixture's timeout, so a hang fails the test. Faults are injected with the
hidden options --die-rank/--die-at/--die-how/--die-phase (hopdec.runtime.faults).
"""

import json
import os
import signal
import time

import pytest

COMMON = ["train", "--no-progress", "--threads", "1", "--iterations", 12, "--peer-timeout", 6]


def error_lines(out):
    return [ln for ln in out.stderr.splitlines() if ln.startswith("hopdec train: error:")]


def test_an_unusable_log_dir_on_one_rank_is_one_line_not_a_hang(mpirun, tmp_path):
    """Issue 8's reproduction: ``mkdir -p L/rank1.jsonl; mpirun -n 2 hopdec train --log-dir L`` hung."""
    (tmp_path / "L" / "rank1.jsonl").mkdir(parents=True)
    out = mpirun(2, COMMON + ["--log-dir", tmp_path / "L"], timeout=90)
    assert out.returncode == 2
    lines = error_lines(out)
    assert len(lines) == 1 and "rank1.jsonl" in lines[0] and "(on rank 1)" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


LATE_RANK_0 = ("import os, sys, time\n"
               "if os.environ.get('OMPI_COMM_WORLD_RANK') == '0':\n"
               "    time.sleep(3)                  # a loaded machine: rank 0 still importing\n"
               "from hopdec.cli.main import main\n"
               "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.parametrize("extra", [[], ["--fault-tolerance"]])
def test_a_bad_option_is_said_once_even_when_rank_0_parses_last(mpirun, extra):
    """Every rank refuses ``--iterations abc`` and only rank 0 says so; rank 1, done first, exited with 2
    and mpirun killed the job before rank 0 had printed: exit 2 and no line at all (seen under load)."""
    out = mpirun.python(2, ["-c", LATE_RANK_0, "train", "--iterations", "abc", *extra], timeout=90)
    assert out.returncode == 2, out.stderr
    assert error_lines(out) == ["hopdec train: error: argument --iterations: invalid int value: 'abc' "
                                "(see hopdec train --help)"], out.stderr


@pytest.mark.parametrize("phase", ["setup", "train", "evaluate", "shutdown"])
def test_an_exception_in_any_phase_ends_every_rank_with_one_line(mpirun, phase):
    out = mpirun(3, COMMON + ["--die-rank", 1, "--die-at", 3, "--die-how", "raise", "--die-phase", phase],
                 timeout=90)
    assert out.returncode != 0
    lines = error_lines(out)
    assert len(lines) == 1, out.stderr
    assert "rank 1" in lines[0] and f"RuntimeError: injected failure in {phase}" in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("extra", [[], ["--sync", "bsp"]])
def test_a_rank_hung_before_the_summary_is_named_by_the_others_timeout(mpirun, extra):
    """Rank 2 hangs as the summary starts: the others' collective times out. The line said only 'not every
    rank got there ... a peer may have died or hung' (a random failure campaign); it now names the rank
    that did not time out itself, as the decentralized loop's waits do."""
    out = mpirun(3, COMMON + extra + ["--die-rank", 2, "--die-how", "hang", "--die-phase", "evaluate"],
                 timeout=90)
    assert out.returncode == 3
    lines = error_lines(out)
    assert len(lines) == 1 and "not every rank got there within 6 s" in lines[0], out.stderr
    assert lines[0].endswith("(rank(s) 2 noticed nothing while the others timed out: stopped or hung there?)")


def test_a_rank_that_hangs_at_shutdown_is_found_by_the_peer_timeout(mpirun):
    out = mpirun(3, COMMON + ["--die-rank", 1, "--die-how", "hang", "--die-phase", "shutdown"], timeout=90)
    assert out.returncode != 0
    lines = error_lines(out)
    assert len(lines) == 1 and "at shutdown; a peer may have died or hung" in lines[0], out.stderr


def test_a_diverging_run_stops_with_an_error_instead_of_reporting_success(mpirun):
    out = mpirun(2, COMMON + ["--lr", "1e3"], timeout=90)    # the largest --lr: NaN within 12 iterations
    assert out.returncode != 0 and "test accuracy" not in out.stdout
    lines = error_lines(out)
    assert len(lines) == 1 and "training loss became" in lines[0] and "diverged" in lines[0], out.stderr


def test_a_killed_rank_keeps_every_logged_record(mpirun, tmp_path):
    """Records are written line by line: a rank killed after iteration 6 leaves 7 parseable records;
    the job ends (non-zero) naming the rank."""
    out = mpirun(3, COMMON + ["--iterations", 40, "--log-dir", tmp_path, "--die-rank", 2, "--die-at", 7],
                 timeout=90)
    assert out.returncode != 0
    assert "exited with non-zero status" in out.stdout + out.stderr or "rank 2" in out.stderr
    lines = (tmp_path / "rank2.jsonl").read_text().splitlines()
    recs = [json.loads(ln) for ln in lines]                   # every line parses
    assert recs[0]["run"]["pid"] > 0
    assert [r["iter"] for r in recs[1:]] == list(range(7))


def test_a_stopped_parameter_server_is_found_by_the_workers(mpirun, tmp_path):
    """Issue 8 item 9: SIGSTOP the server during --sync asp; the workers' pushes and waits time out."""
    import subprocess
    import sys
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "3", sys.executable, "-m", "hopdec.cli"] + \
        [str(a) for a in COMMON[:-2]] + ["--peer-timeout", "5", "--mode", "ps", "--sync", "asp",
                                         "--iterations", "100000", "--compute-time", "0.01",
                                         "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=mpirun.root, env=mpirun.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        header = tmp_path / "rank0.jsonl"
        deadline = time.time() + 60
        while not (header.exists() and header.read_text().count("\n") >= 3) and time.time() < deadline:
            time.sleep(0.2)                                     # the server is serving
        pid = json.loads(header.read_text().splitlines()[0])["run"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("hopdec train: error:")]
    assert len(lines) == 1 and "server (rank 0)" in lines[0] and "died or hung" in lines[0], err
