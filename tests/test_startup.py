"""The start-up watchdog's pieces without MPI (hopdec.runtime.startup): who it names, and a marks folder
that someone else planted is not used."""

import os

import pytest

from hopdec.errors import ConfigError
from hopdec.runtime import startup


def _arrivals(tmp_path, monkeypatch, rank, key="job1"):
    monkeypatch.setattr(startup.tempfile, "gettempdir", lambda: str(tmp_path))
    return startup.Arrivals(key, rank)


def test_the_line_names_the_ranks_that_never_reached_mpi_init(tmp_path, monkeypatch):
    for r in (0, 1, 3):
        _arrivals(tmp_path, monkeypatch, r).mark("in")
    a = _arrivals(tmp_path, monkeypatch, 0)
    line = startup.stuck_line(0, 5, 5, a, 60)
    assert "ranks 2, 4 never reached it" in line and "within 60 s" in line and startup.ENV_TIMEOUT in line
    for r in (2, 4):
        _arrivals(tmp_path, monkeypatch, r).mark("in")
    assert "every rank is inside it" in startup.stuck_line(0, 5, 5, a, 60)
    assert "ranks 0, 1, 2, 3, 4 of this host reached it, 3 ranks elsewhere" in startup.stuck_line(0, 8, 5, a, 60)


def test_one_rank_per_host_claims_the_report_and_the_marks_go_away(tmp_path, monkeypatch):
    a, b = _arrivals(tmp_path, monkeypatch, 0), _arrivals(tmp_path, monkeypatch, 1)
    assert a.ok and a.claim_report() and not b.claim_report()
    a.mark("in")
    a.remove()
    assert not os.path.exists(a.dir)


def test_a_planted_marks_folder_or_link_is_not_used(tmp_path, monkeypatch):
    """The folder's name is predictable: one that is a link, or open to others, is left alone (the line
    then names fewer ranks) -- marks are never written through it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    os.symlink(victim, tmp_path / f"hopdec-start-{os.getuid()}-job2")
    a = _arrivals(tmp_path, monkeypatch, 0, "job2")
    a.mark("in")
    assert not a.ok and os.listdir(victim) == [] and a.claim_report()      # rank 0 reports without marks
    (tmp_path / f"hopdec-start-{os.getuid()}-job3").mkdir(mode=0o777)
    os.chmod(tmp_path / f"hopdec-start-{os.getuid()}-job3", 0o777)
    assert not _arrivals(tmp_path, monkeypatch, 0, "job3").ok
    assert "a rank is stuck, stopped or slow to start" in startup.stuck_line(0, 4, 4, a, 9)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "soon", "1e9"])
def test_a_bad_startup_timeout_is_one_line(monkeypatch, value):
    monkeypatch.setenv(startup.ENV_TIMEOUT, value)
    with pytest.raises(ConfigError, match=startup.ENV_TIMEOUT):
        startup.timeout(120)


def test_the_default_bound_is_the_peer_timeout_but_at_least_a_minute(monkeypatch):
    monkeypatch.delenv(startup.ENV_TIMEOUT, raising=False)
    assert startup.timeout(5) == 60 and startup.timeout(300) == 300
    monkeypatch.setenv(startup.ENV_TIMEOUT, "7.5")
    assert startup.timeout(300) == 7.5


def test_a_job_key_never_escapes_the_temporary_folder(monkeypatch):
    monkeypatch.setenv("PMIX_NAMESPACE", "../../etc/x y@1")
    key = startup.job_key()
    assert "/" not in key and " " not in key


def test_a_later_job_with_the_same_namespace_is_not_blocked_by_an_earlier_ones_marks(tmp_path, monkeypatch):
    """Open MPI's namespace is ``prterun-<host>-<pid>@1``: pids repeat, and a job whose start-up failed
    left its folder with ``reported`` taken -- the next job with that pid found it, no rank printed the
    line, and the job ended with exit 3 and nothing else. The key carries when the launcher started."""
    monkeypatch.setenv("PMIX_NAMESPACE", "prterun-vm-4242@1")
    monkeypatch.setattr(startup, "launcher_epoch", lambda: "4242.1000")
    earlier = _arrivals(tmp_path, monkeypatch, 0, startup.job_key())
    earlier.mark("in")
    assert earlier.claim_report()                   # it reported, then the job was aborted: no clean-up
    monkeypatch.setattr(startup, "launcher_epoch", lambda: "4242.987654")
    later = _arrivals(tmp_path, monkeypatch, 2, startup.job_key())
    assert later.dir != earlier.dir and later.seen("in") == set() and later.claim_report()
    monkeypatch.setattr(startup, "launcher_epoch", lambda: None)     # no /proc: the namespace alone
    assert startup.job_key() == "prterun-vm-4242@1"


def test_the_launcher_epoch_is_the_nearest_launcher_ancestors(monkeypatch):
    """Found through a process between the daemon and the rank (a wrapper); None when no ancestor is one.
    Here a shell stands in for the daemon and its child ``sleep`` for the rank."""
    import subprocess
    import time
    monkeypatch.setattr(startup, "LAUNCHER_DAEMONS", frozenset({"sh"}))
    proc = subprocess.Popen(["sh", "-c", "sleep 30; :"])
    try:
        kids = []
        for _ in range(200):        # (the forked child is named sh until it has exec'ed sleep)
            kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == proc.pid
                    and (startup._proc_stat(int(p)) or ("",))[0] == "sleep"]
            if kids:
                break
            time.sleep(0.02)
        assert kids and startup.launcher_epoch(kids[0]) == f"{proc.pid}.{startup.start_time(proc.pid)}"
    finally:
        proc.kill()
        proc.wait()
    monkeypatch.setattr(startup, "LAUNCHER_DAEMONS", frozenset({"no-such-daemon"}))
    assert startup.launcher_epoch() is None


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_the_marks_of_jobs_killed_during_start_up_are_reaped_by_the_next(tmp_path, monkeypatch):
    """A job killed during its start-up left ``hopdec-start-<uid>-<job>`` in $TMPDIR for good; the next
    job's ranks remove those whose launcher daemon here is gone and that are a minute old. Kept: a live
    launcher's (this process stands in), a fresh one, another host's, a name it cannot read, another's
    files inside."""
    import socket
    import subprocess
    import sys
    import time
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    me = f"{os.getpid()}.{startup._proc_stat(os.getpid())[2]}"
    host = startup._safe(socket.gethostname())
    old = time.time() - 2 * startup.STALE_S
    uid = os.getuid()
    folders = {"gone-epoch": f"prterun-x-1@1-{dead}.5", "gone-ns": f"prterun-{host}-{dead}@1",
               "live": f"prterun-x-2@1-{me}", "fresh": f"prterun-{host}-{dead}@2",
               "other-host": f"prterun-elsewhere-{dead}@1", "unreadable": "slurm77.0",
               "foreign-file": f"prterun-y-3@1-{dead}.9"}
    for what, key in folders.items():
        d = tmp_path / f"hopdec-start-{uid}-{key}"
        d.mkdir(mode=0o700)
        (d / "0.in").write_text("1")
        (d / ("notes.txt" if what == "foreign-file" else "1.out")).write_text("1")
        if what != "fresh":
            os.utime(d, (old, old))
    _arrivals(tmp_path, monkeypatch, 0, "job9")
    left = {what for what, key in folders.items() if (tmp_path / f"hopdec-start-{uid}-{key}").exists()}
    assert left == {"live", "fresh", "other-host", "unreadable", "foreign-file"}, left
