"""No job that never ends (issue 17 items 1-2): a rank that never reaches or never leaves MPI_Init, one
stuck in setup, and a rank stopped mid-run under ``--fault-tolerance``. Real ``mpirun`` jobs with short
bounds (``HOPDEC_STARTUP_TIMEOUT``, ``--peer-timeout``, ``HOPDEC_FT_TIMEOUT``); each runs under a timeout,
so a hang fails the test."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import gone as _gone, run_bounded

COMMON = ["--no-progress", "--threads", "1", "--iterations", "8"]

WRAPPER = """
import os, signal, sys, time
# What a hostile host does to one rank before it reaches MPI_Init.
if os.environ.get("OMPI_COMM_WORLD_RANK") == os.environ["VICTIM"]:
    with open(os.environ["VICTIM_PID"], "w") as f:
        f.write(str(os.getpid()))
    how = os.environ["HOW"]
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif how == "killed":
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "slow":
        time.sleep(60)
from hopdec.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _wrapper(tmp_path):
    path = tmp_path / "hostile_rank.py"
    path.write_text(WRAPPER)
    return str(path)


def _errors(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("hopdec train: error:")]


@pytest.mark.parametrize("how", ["stop", "slow"])
def test_a_rank_that_never_reaches_mpi_init_ends_the_job_with_one_line(mpirun, tmp_path, how):
    """Rank 2 of 3 is stopped (SIGSTOP) or too slow before MPI_Init: the others, waiting in MPI_Init,
    end the job after the start-up bound with one line naming rank 2; the stopped process is gone too."""
    pidfile = tmp_path / "victim.pid"
    t0 = time.time()
    out = mpirun.python(3, [_wrapper(tmp_path), "train", *COMMON], timeout=60,
                        env=mpirun.env(HOPDEC_STARTUP_TIMEOUT="3", VICTIM="2", HOW=how, VICTIM_PID=str(pidfile)))
    took = time.time() - t0
    assert out.returncode != 0
    errors = _errors(out.stderr)
    assert len(errors) == 1, out.stderr[-3000:]
    assert re.search(r"start-up: MPI_Init did not complete within 3 s: rank 2 never reached it", errors[0])
    assert took < 30, took
    assert _gone(int(pidfile.read_text()))


def test_under_fault_tolerance_a_rank_killed_before_mpi_init_ends_the_job(mpirun, tmp_path):
    """The launcher does not end a fault-tolerant job when a process is killed, so a rank killed 0.3 s after
    launch left the others in MPI_Init forever: now they end it after the start-up bound, exit 3, with one
    line naming it. (A rank that exits non-zero instead is ended at once by Open MPI, rank and all.) The
    reporter removes the start-up marks: a folder left behind met a later job whose launcher had the same
    pid, its report already claimed, and that job ended with exit 3 and no line at all (seen in CI)."""
    import shutil
    import tempfile
    pidfile = tmp_path / "victim.pid"
    tmp = tempfile.mkdtemp(prefix="hk", dir="/tmp")     # (a short path: Open MPI's sockets live under it)
    try:
        env = mpirun.env(HOPDEC_CMD=f"{sys.executable} {_wrapper(tmp_path)} train", HOPDEC_STARTUP_TIMEOUT="3",
                         VICTIM="1", HOW="killed", VICTIM_PID=str(pidfile), TMPDIR=tmp)
        out = run_bounded(mpirun.launch_cmd(3, ["--fault-tolerance", *COMMON]), 60, env=env)
        assert out.returncode == 3, out.stderr[-3000:]
        errors = _errors(out.stderr)
        assert len(errors) == 1 and "rank 1 never reached it" in errors[0], out.stderr[-3000:]
        assert not [n for n in os.listdir(tmp) if n.startswith("hopdec-start-")], os.listdir(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_rank_stuck_in_setup_is_named(mpirun):
    """After MPI_Init the bound is --peer-timeout: a rank that hangs in setup is named in one line (the
    setup exchange alone could only say that not every rank got there)."""
    out = mpirun(3, ["train", *COMMON, "--peer-timeout", "4", "--die-rank", "1", "--die-phase", "setup",
                     "--die-how", "hang"], timeout=60)
    assert out.returncode == 3
    errors = _errors(out.stderr)
    assert len(errors) == 1, out.stderr[-3000:]
    assert re.search(r"setup: rank 1 did not finish setup within 4 s", errors[0]), errors


def test_a_rank_that_dies_in_setup_under_fault_tolerance_is_not_called_slow(mpirun):
    """ULFM reports the death at once; the line said 'rank 1 did not finish setup within 45 s; rank 1 died
    (stuck, stopped or slow ...)' six seconds into the job (found by a random campaign of failures)."""
    out = mpirun.launch(3, ["--fault-tolerance", *COMMON, "--peer-timeout", "45", "--sync", "asp",
                            "--die-rank", "1", "--die-phase", "setup"], timeout=90)
    assert out.returncode == 3
    errors = _errors(out.stderr)
    assert len(errors) == 1 and errors[0].endswith(": setup: rank 1 died and did not finish setup"), errors


def test_a_stopped_rank_under_fault_tolerance_does_not_keep_the_job_alive(mpirun, tmp_path):
    """SIGSTOP one of 4 ranks mid-run with --fault-tolerance: the detector declares it dead (after
    HOPDEC_FT_TIMEOUT s), the survivors heal and finish -- and the job ends, exit 0, with the stopped
    process gone, instead of mpirun waiting for it forever."""
    log = str(tmp_path / "logs")
    args = ["--fault-tolerance", "--no-progress", "--threads", "1", "--topology", "ring", "--iterations", "60",
            "--compute-time", "0.05", "--log-dir", log]
    proc = subprocess.Popen([str(c) for c in mpirun.launch_cmd(4, args)], cwd=mpirun.root,
                            env=mpirun.launch_env(HOPDEC_FT_TIMEOUT="3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    path = os.path.join(log, "rank2.jsonl")
    deadline = time.time() + 150
    victim = None
    try:
        while victim is None:
            assert proc.poll() is None and time.time() < deadline, "the run ended before the stop"
            try:
                with open(path) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                lines = []
            if len(lines) > 10:
                victim = json.loads(lines[0])["run"]["pid"]
                os.kill(victim, signal.SIGSTOP)
            time.sleep(0.05)
        out, err = proc.communicate(timeout=max(1, deadline - time.time()))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        if victim:
            os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert re.search(r"failure: rank\(s\) 2 died near iteration \d+", out), out
    assert _gone(victim)


def _log_lines(log, rank):
    try:
        with open(os.path.join(log, f"rank{rank}.jsonl")) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def _until(proc, deadline, ready, what):
    """Poll ``ready()`` every 50 ms until it holds; fail when the job ended first or ``deadline`` passed."""
    while not ready():
        assert proc.poll() is None, f"the job ended before {what}"
        assert time.time() < deadline, f"no {what} in time"
        time.sleep(0.05)


def _launched(mpirun, n, args, **env):
    return subprocess.Popen([str(c) for c in mpirun.launch_cmd(n, args)], cwd=mpirun.root,
                            env=mpirun.launch_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _killed(proc, *pids):
    """After a failed wait: kill the job's tree and the stopped processes; fail with what it printed."""
    from conftest import descendants
    for pid in [*descendants(proc.pid), *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    pytest.fail(f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")


def test_a_stopped_parameter_server_under_fault_tolerance_is_one_line_naming_it(mpirun, tmp_path):
    """SIGSTOP the server of a --fault-tolerance PS run: the failure detector declares it dead after
    HOPDEC_FT_TIMEOUT s and the job ends (exit 3) with one line that says the server is stopped and sent no
    heartbeat for 3 s. It said the server 'died', and the teardown then woke the stopped server (SIGCONT
    before SIGTERM), which Open MPI aborted as 'reported dead by someone else' with a 25-line backtrace."""
    log = str(tmp_path)
    proc = _launched(mpirun, 4, ["--fault-tolerance", "--no-progress", "--threads", "1", "--peer-timeout", "60",
                                 "--sync", "asp", "--iterations", "100000", "--compute-time", "0.01",
                                 "--log-dir", log], HOPDEC_FT_TIMEOUT="3")
    deadline, server = time.time() + 150, None
    try:
        _until(proc, deadline, lambda: len(_log_lines(log, 0)) >= 3, "server events")    # it is serving
        server = json.loads(_log_lines(log, 0)[0])["run"]["pid"]
        os.kill(server, signal.SIGSTOP)
        out, err = proc.communicate(timeout=max(1, deadline - time.time()))
    except BaseException:
        _killed(proc, *([server] if server else []))
    assert proc.returncode == 3, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    assert re.fullmatch(r"hopdec train: error: rank [123]: the parameter server \(rank 0\) was declared dead: its "
                        r"process is stopped \(SIGSTOP or Ctrl-Z\?\) and sent no heartbeat for 3 s; the parameter-"
                        r"server mode cannot go on without it \(it holds the only model\)", lines[0]), lines[0]
    assert "failed;" not in out, out
    assert _gone(server)


def test_a_rank_declared_dead_and_continued_leaves_the_job_with_one_line(mpirun, tmp_path):
    """SIGSTOP rank 2 of 4 until the others declare it dead and heal, then SIGCONT it: Open MPI aborts the
    continued rank ('I have been reported dead by someone else') -- it printed a 25-line backtrace. Now the
    user reads one line naming it, it exits 6 (no backtrace, no core), and the survivors finish, exit 0."""
    log, iters = str(tmp_path), 200
    proc = _launched(mpirun, 4, ["--fault-tolerance", "--no-progress", "--threads", "1", "--topology", "ring",
                                 "--iterations", iters, "--compute-time", "0.05", "--log-dir", log],
                     HOPDEC_FT_TIMEOUT="3")
    deadline, victim = time.time() + 180, None
    try:
        _until(proc, deadline, lambda: len(_log_lines(log, 2)) > 10, "rank 2's records")
        victim = json.loads(_log_lines(log, 2)[0])["run"]["pid"]
        os.kill(victim, signal.SIGSTOP)
        _until(proc, deadline, lambda: any('"heal"' in ln for ln in _log_lines(log, 0)), "heal")
        os.kill(victim, signal.SIGCONT)
        out, err = proc.communicate(timeout=max(1, deadline - time.time()))
    except BaseException:
        _killed(proc, *([victim] if victim else []))
    assert proc.returncode == 0, err[-3000:]
    assert err.splitlines() == [
        "hopdec: rank 2 left the job: the other ranks declared it dead (no heartbeat for 3 s: it was stopped or "
        "hung) and went on without it; it exits 6"], err[-3000:]
    assert re.search(r"failure: rank\(s\) 2 died near iteration \d+", out), out
    for r in (0, 1, 3):
        recs = [json.loads(x) for x in _log_lines(log, r)[1:]]
        assert [x["iter"] for x in recs if "iter" in x][-1] == iters - 1, f"rank {r} did not finish"
    assert _gone(victim)


HUNG_IN_HEAL = """
import os, sys, time
from hopdec.runtime import heal
if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":     # alive to the failure detector, hung in Python
    heal.Healer.heal = lambda self: time.sleep(10 ** 6)
from hopdec.cli.main import main
sys.exit(main())
"""


@pytest.mark.parametrize("case", ["ps-shutdown", "hop-heal"])
def test_a_rank_hung_but_alive_keeps_no_fault_tolerant_recovery_waiting_forever(mpirun, tmp_path, case):
    """MPI_Comm_shrink has no timeout (and Open MPI 5.0 no nonblocking form): a rank alive to ULFM's
    detector (its heartbeat thread runs) but hung in Python never joins it, and the others waited there
    forever -- a PS worker hung at shutdown (found by a random campaign of failures: the job outlived its
    200 s bound) or a survivor hung when the others heal. Now the shrink is preceded by an agreement
    bounded by the peer timeout: the job ends with one line naming the rank that never came."""
    common = ["--fault-tolerance", "--no-progress", "--threads", "1", "--compute-time", "0.01",
              "--peer-timeout", "8"]
    if case == "ps-shutdown":
        args, env = common + ["--sync", "ssp", "--iterations", "20", "--die-rank", "1", "--die-how", "hang",
                              "--die-phase", "shutdown"], None
    else:
        script = tmp_path / "hung_in_heal.py"
        script.write_text(HUNG_IN_HEAL)
        args = common + ["--topology", "complete", "--protocol", "tokens", "--iterations", "200",
                         "--die-rank", "3", "--die-at", "5"]
        env = mpirun.env(HOPDEC_CMD=f"{sys.executable} {script} train")
    t0 = time.time()
    out = mpirun.launch(4, args, timeout=120, env=env)
    assert out.returncode not in (0, None), out.stdout[-2000:] + out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "not every living rank got there within 8 s" in lines[0], out.stderr[-3000:]
    assert lines[0].endswith("(rank(s) 1 noticed nothing while the others timed out: stopped or hung there?)")
    assert time.time() - t0 < 90
