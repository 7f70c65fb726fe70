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
