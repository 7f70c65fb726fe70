"""The rank that prints the job's one error line waits until the launcher has read it before it aborts the
job: under ``mpirun`` its stderr is a pipe to the launcher's I/O forwarding, which stops reading once the
job is aborted, so a line still in the pipe is lost. A fixed wait (0.3 s at start-up, 0.5 s later) lost it
on a loaded machine: CI saw a job end with exit 3 and no line at all."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A rank that reports and then ends the job, with the job's end replaced by writing when it came.
REPORTER = {
    "abort": """
from hopdec.runtime import failures
class Comm:
    def Get_rank(self):
        return 1
    def Abort(self, code):
        ended(code)
failures.end_job = lambda comm, code: comm.Abort(code)  # a rank of several (this process is a job of one)
failures.abort(Comm(), RuntimeError("boom"))
""",
    "start-up": """
import threading
from hopdec.runtime import pmix, startup
startup.stuck_line = lambda *a: "rank 0: start-up: MPI_Init did not complete"
pmix.abort = ended
class Arrivals:
    def claim_report(self):
        return True
    def remove(self):
        pass
startup._watch(threading.Event(), 0.01, 0, 3, Arrivals(), "hopdec train")
""",
}
PRELUDE = """
import os, sys, time
sys.path.insert(0, {root!r})
def ended(code):
    with open({path!r}, "w") as f:
        f.write(repr(time.time()))
    os._exit(code)
"""


@pytest.mark.parametrize("where", sorted(REPORTER))
def test_the_job_ends_only_after_the_launcher_has_read_the_line(tmp_path, where):
    """A launcher that reads the rank's stderr 1.5 s late (a loaded machine) still gets the line before
    the job ends."""
    path = str(tmp_path / "ended")
    code = PRELUDE.format(root=ROOT, path=path) + REPORTER[where]
    env = {k: v for k, v in os.environ.items() if k not in ("HOPDEC_EXIT_FILE", "HOPDEC_DEBUG")}
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(1.5)
        line = proc.stderr.readline()
        read_at = time.time()
        assert proc.wait(timeout=30) == 3
    finally:
        proc.kill()
    assert line.startswith("hopdec train: error: rank") and ("boom" in line or "start-up" in line), line
    assert float(open(path).read()) > read_at, "the job ended before the launcher read the line"


def test_a_launcher_that_never_reads_delays_the_end_by_the_bound_only(tmp_path):
    from hopdec.runtime.failures import forwarded
    r, w = os.pipe()
    try:
        os.write(w, b"a line nobody reads\n")
        t0 = time.monotonic()
        forwarded(w, bound=0.3)
        assert 0.3 <= time.monotonic() - t0 < 2
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "f", "w") as f:           # not a pipe (a file, a terminal): nothing to wait for
        t0 = time.monotonic()
        forwarded(f.fileno())
        assert time.monotonic() - t0 < 0.05


def test_the_exit_code_goes_only_into_the_launchers_own_file(tmp_path, monkeypatch):
    """``record_exit`` writes the launcher's exit file (``HOPDEC_EXIT_FILE``) but never makes it: a job
    whose launcher was killed wrote it again after the next launch had removed it, to lie in $TMPDIR."""
    from hopdec.runtime.failures import record_exit
    made = tmp_path / "hopdec-exit.host.1.abc"
    made.write_text("134\n")
    monkeypatch.setenv("HOPDEC_EXIT_FILE", str(made))
    record_exit(3)
    assert made.read_text() == "3\n"
    gone = tmp_path / "hopdec-exit.host.2.abc"
    monkeypatch.setenv("HOPDEC_EXIT_FILE", str(gone))
    record_exit(3)
    assert not gone.exists()
