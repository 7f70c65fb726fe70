"""Progress lines of a long simulation (:mod:`hopdec.sim.progress`): ``--progress-interval`` and
``--no-progress`` were accepted by ``hopdec sim`` and did nothing (a 10-minute simulation printed no line
until its end)."""

import io

import pytest

from hopdec.cli.sim import parse
from hopdec.sim.events import EventQueue
from hopdec.sim.progress import WallProgress
from hopdec.sim.run import simulate


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_lines_come_every_interval_with_the_slowest_pace_and_virtual_time():
    clock, its, out = Clock(), {0: 0, 1: 0, 2: 0}, io.StringIO()
    p = WallProgress(lambda: dict(its), 50, lambda: 12.5, interval=2.0, stream=out, clock=clock)
    clock.t += 1.9
    assert p() is None                                   # nothing before the first interval
    its.update({0: 10, 1: 12, 2: 11})
    clock.t += 0.1
    line = p()
    assert line == ("progress  2 s  at 12.5 virtual s  iter 10..12 of 50 (slowest rank 0, fastest rank 1)  "
                    "5 it/s  ETA 8 s")
    clock.t += 1.0
    assert p() is None                                   # the next one is 2 s later
    its.update({0: 20, 1: 20, 2: 20})
    clock.t += 1.0
    assert p().endswith("iter 20 of 50 (every worker)  5 it/s  ETA 6 s")
    assert out.getvalue().count("\n") == 2


def test_a_resumed_run_counts_its_pace_from_where_it_started():
    clock, its = Clock(), {0: 40, 1: 40}
    p = WallProgress(lambda: dict(its), 100, lambda: 0.0, interval=1.0, stream=io.StringIO(), clock=clock)
    its.update({0: 44, 1: 45})
    clock.t += 2.0
    assert "  2 it/s  ETA 28 s" in p()


def test_the_queue_calls_its_watch_every_so_many_events():
    q, seen = EventQueue(), []
    for i in range(10):
        q.at(float(i), lambda: None)
    q.watch(3, lambda: seen.append(q.events))
    checked = []
    q.run(on_event=lambda: checked.append(q.events))
    assert seen == [3, 6, 9] and checked == list(range(1, 11)) and q.events == 10
    with pytest.raises(ValueError):
        q.watch(0, lambda: None)


@pytest.mark.parametrize("mode", [["-n", "64"], ["--mode", "ps", "--sync", "ssp", "-n", "64"],
                                  ["--mode", "allreduce", "-n", "64"]])   # (about 2 events per worker-iteration)
def test_hopdec_sim_prints_progress_unless_told_not_to(mode, capsys):
    argv = mode + ["--iterations", "60", "--invariants", "off"]
    simulate(parse(argv + ["--progress-interval", "0.001"]), out=io.StringIO())
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("progress")]
    assert lines and all(" virtual s  iter " in ln and " of 60" in ln for ln in lines)
    simulate(parse(argv + ["--progress-interval", "0.001", "--no-progress"]), out=io.StringIO())
    assert "progress" not in capsys.readouterr().err


def test_a_local_steps_simulation_counts_rounds_in_its_progress_lines(monkeypatch):
    """``hopdec sim --iterations 40 --local-steps 4`` said "iter 4 of 10 ... it/s" for rounds."""
    import hopdec.sim.run as R
    seen = []
    monkeypatch.setattr(R, "progress", lambda sim, total, settings, **kw: seen.append((total, kw.get("what"))))
    simulate(parse(["--topology", "ring", "-n", "3", "--iterations", "40", "--local-steps", "4"]),
             out=io.StringIO())
    simulate(parse(["--topology", "ring", "-n", "3", "--iterations", "4"]), out=io.StringIO())
    assert seen == [(10, "round"), (4, "iter")]
    clock, its, out = Clock(), {0: 0, 1: 0}, io.StringIO()
    p = WallProgress(lambda: dict(its), 10, lambda: 1.0, interval=1.0, stream=out, clock=clock, what="round")
    its.update({0: 4, 1: 4})
    clock.t += 2.0
    assert p().endswith("round 4 of 10 (every worker)  2 rounds/s  ETA 2 s")
