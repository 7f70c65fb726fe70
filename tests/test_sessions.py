"""Open MPI session folders left by killed launchers (``hopdec.runtime.sessions``): a later ``mpirun`` that
gets the same pid fails to start; the launchers and the tests remove them first, and only them."""

import os
import socket
import subprocess
import sys
import time

import pytest

from hopdec.runtime import sessions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RENDEZVOUS = "prterun-vm-{pid}@0.0;tcp4://127.0.0.1:{port}\n5.0.11rc1\n{pid}\n0:0\nSat Nov 28 10:37:38 2026\n"


def _dead_pids(n=1):
    """``n`` pids no process has now (pids near the top of the default range are rarely in use)."""
    free = []
    for pid in range(32000, 32768):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            free.append(pid)
            if len(free) == n:
                return free
        except OSError:
            pass
    pytest.skip("no free pid found")


def _dead_pid():
    return _dead_pids()[0]


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # (closed when the socket is)


def _session(tmp_path, pid, port, age=3600.0, kind="ompi"):
    """What a killed prterun leaves: its folder with the three PMIx rendezvous files, ``age`` seconds old."""
    d = tmp_path / f"{kind}.{pid}"
    (d / "0").mkdir(parents=True)
    for name in ("pmix.vm.tool", f"pmix.vm.tool.{pid}", f"pmix.vm.tool.prterun-vm-{pid}@0"):
        f = d / name
        f.write_text(RENDEZVOUS.format(pid=pid, port=port))
        os.utime(f, (time.time() - age, time.time() - age))
    return d


def test_a_killed_launchers_session_is_removed_and_nothing_else(tmp_path):
    (dead, other), closed = _dead_pids(2), _closed_port()
    left = _session(tmp_path, dead, closed)
    daemon = _session(tmp_path, other, closed, kind="prted")
    mine = _session(tmp_path / "alive", os.getpid(), closed)                  # its pid is a live process
    fresh = _session(tmp_path / "fresh", dead, closed, age=5)                 # a launcher starting now
    with socket.socket() as server:                                           # a live job elsewhere listens
        server.bind(("127.0.0.1", 0))
        server.listen()
        listening = _session(tmp_path / "listening", dead, server.getsockname()[1])
        (tmp_path / "ompi.vm.0").mkdir()                                      # not a launcher's pid folder
        (tmp_path / "ompi.123").write_text("a file")
        removed = sessions.remove_left_behind(str(tmp_path))
        assert sorted(removed) == sorted([str(left), str(daemon)])
        assert not left.exists() and not daemon.exists()
        for kept in (mine, fresh, listening, tmp_path / "ompi.vm.0", tmp_path / "ompi.123"):
            assert kept.exists()
        for d in (tmp_path / "alive", tmp_path / "fresh", tmp_path / "listening"):
            assert sessions.remove_left_behind(str(d)) == []


def _spawn_with_pid(pid, argv, env):
    """Start ``argv`` as process ``pid`` (root: the kernel's next pid, /proc/sys/kernel/ns_last_pid), or None
    when another process took that pid first."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.pid != pid:
        proc.communicate(timeout=120)
        return None
    return proc


@pytest.mark.mpi
@pytest.mark.skipif(not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="needs root (to choose a pid)")
@pytest.mark.parametrize("clean", [False, True])
def test_mpirun_given_the_pid_of_a_killed_one_starts_once_its_session_is_removed(tmp_path, clean):
    """Open MPI 5's prterun, given the pid whose ``ompi.PID`` session a killed prterun left in its TMPDIR,
    fails at once with "The PMIx server's listener thread failed to start" (exit 213): the CI failure. After
    :func:`remove_left_behind` (what the launchers and the tests run first) it starts."""
    from conftest import mpi_env
    env = mpi_env(TMPDIR=str(tmp_path))
    for _ in range(5):
        pid = _dead_pid()
        _session(tmp_path, pid, _closed_port())
        if clean:
            assert sessions.remove_left_behind(str(tmp_path)) == [str(tmp_path / f"ompi.{pid}")]
        proc = _spawn_with_pid(pid, ["mpirun", "-n", "1", sys.executable, "-c", "pass"], env)
        if proc is not None:
            break
        sessions.remove_left_behind(str(tmp_path))
    else:
        pytest.skip("could not start mpirun with a chosen pid")
    out, _ = proc.communicate(timeout=120)
    if clean:
        assert proc.returncode == 0, out
    else:
        assert proc.returncode == 213 and "listener thread failed to start" in out, out
