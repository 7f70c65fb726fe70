"""A rank ULFM reports failed (``--fault-tolerance``): how a rank the others declared dead leaves when it runs
again (no Open MPI backtrace). In one process; the real jobs are in ``tests/test_hangs_mpi.py``."""

import os
import signal
import subprocess
import sys

import pytest

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

