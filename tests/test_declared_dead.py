"""A rank ULFM reports failed (``--fault-tolerance``): what the line naming it says became of it, and how a
rank the others declared dead leaves when it runs again (no Open MPI backtrace). In one process; the real
jobs are in ``tests/test_hangs_mpi.py``."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hopdec.runtime import failures, startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ABORTS = """
import os, sys, threading
if sys.argv[1] == "quiet":
    from hopdec.transport.ulfm import leave_quietly_when_declared_dead
    leave_quietly_when_declared_dead()
    leave_quietly_when_declared_dead()          # (idempotent)
t = threading.Thread(target=os.abort)           # as Open MPI's detector thread does
t.start()
t.join()
print("not reached")
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_an_abort_from_another_thread_exits_6_without_a_word(quiet):
    """Open MPI's detector thread calls abort() on a rank the others declared dead; the handler hopdec
    installs makes that ``_exit(6)``: no backtrace, no core, a status the docs name (without it: SIGABRT)."""
    env = dict(os.environ, PYTHONPATH=ROOT, HOPDEC_DEBUG="")
    r = subprocess.run([sys.executable, "-c", ABORTS, "quiet" if quiet else "plain"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == (6 if quiet else -signal.SIGABRT), r.stderr
    assert r.stdout == "" and (r.stderr == "" or not quiet), r.stderr


def test_the_line_says_what_became_of_the_failed_rank(monkeypatch):
    """Gone: 'died'. Stopped or running: declared dead by the failure detector, with its timeout (a stopped
    server was said to have died). Another host, or a pid now someone else's: it cannot tell which."""
    monkeypatch.setenv("OMPI_MCA_mpi_ft_detector_timeout", "3")
    here = socket.gethostname()[:100]
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while startup.process_state(stopped.pid, startup.start_time(stopped.pid)) not in ("T", "t"):
            assert time.time() < deadline
            time.sleep(0.01)
        me = startup.me()
        monkeypatch.setattr(startup, "table", [
            me,
            {"host": here, "pid": stopped.pid, "start": startup.start_time(stopped.pid)},
            {"host": here, "pid": gone.pid, "start": 12345},
            {"host": here, "pid": os.getpid(), "start": me["start"] + 1},       # the pid reused
            {"host": here + "-other", "pid": os.getpid(), "start": me["start"]}])
        assert failures.how_failed(0) == "was declared dead: its process runs but sent no heartbeat for 3 s (hung?)"
        assert failures.how_failed(1) == ("was declared dead: its process is stopped (SIGSTOP or Ctrl-Z?) and sent "
                                          "no heartbeat for 3 s")
        assert failures.how_failed(2) == failures.how_failed(3) == "died"
        assert failures.how_failed(4) == failures.how_failed(9) == \
            "died or was declared dead (killed, or it sent no heartbeat for 3 s: stopped or hung)"
        monkeypatch.delenv("OMPI_MCA_mpi_ft_detector_timeout")
        assert failures.how_failed(1).endswith(
            "is stopped (SIGSTOP or Ctrl-Z?) and sent no heartbeat within the failure detector's timeout")
    finally:
        stopped.kill()
        stopped.wait(30)
