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
    simulate(parse(argv + ["--no-progress"]), out=io.StringIO())
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


@pytest.mark.parametrize("sig,mode", [("SIGINT", ["--topology", "ring-based"]),
                                      ("SIGTERM", ["--topology", "ring-based", "--fault-tolerance",
                                                   "--churn-mttf", "2000"]),
                                      ("SIGTERM", ["--mode", "ps", "--sync", "ssp"]),
                                      ("SIGINT", ["--mode", "allreduce"])])
def test_ctrl_c_or_sigterm_stops_a_long_simulation_with_one_line_and_its_records_written(sig, mode, tmp_path):
    """Ctrl-C on a long ``hopdec sim`` printed a traceback and SIGTERM killed it without a word; either way
    the records it buffered (up to 200,000 lines) were lost: after minutes of simulation the logs held
    their headers only. Now: one line saying where it stopped, exit 128 + the signal, every record up to
    then in the logs."""
    import json
    import selectors
    import signal
    import subprocess
    import sys
    import time
    log_dir = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "hopdec.cli", "sim", "-n", "40", "--iterations", "1000000",
                          "--log-dir", str(log_dir), "--progress-interval", "0.5", *mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (a background job's)
    try:
        sel = selectors.DefaultSelector()
        sel.register(p.stderr, selectors.EVENT_READ)
        deadline, seen = time.monotonic() + 120, ""
        while "progress" not in seen and time.monotonic() < deadline and p.poll() is None:
            if sel.select(timeout=1):
                seen += p.stderr.readline()
        assert "progress" in seen, seen                 # the events are running
        p.send_signal(getattr(signal, sig))
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    lines = [x for x in err.splitlines() if not x.startswith("progress")]
    assert p.returncode == 128 + getattr(signal, sig), err
    assert len(lines) == 1 and lines[0].startswith(f"hopdec sim: stopped by {sig} at virtual second "), err
    assert f"the records up to then are in {log_dir}/rank*.jsonl; no summary" in lines[0]
    assert out == ""                                    # no summary of a run that did not end
    for path in log_dir.glob("rank*.jsonl"):
        records = [json.loads(x) for x in path.read_text().splitlines()]
        assert "run" in records[0] and len(records) > 2, path      # the header, then records


def test_an_interrupted_simulate_is_still_a_keyboard_interrupt_with_its_records_written(tmp_path, monkeypatch):
    """A script that calls ``simulate`` and catches KeyboardInterrupt still gets one (saying where the run
    stopped), and the records up to the interrupt are in the logs."""
    import json
    from hopdec.sim.events import EventQueue
    from hopdec.sim.run import Stopped
    real = EventQueue.run

    def interrupted(self, until=None, on_event=None):
        real(self, until=2.0, on_event=on_event)           # two virtual seconds, then Ctrl-C
        raise KeyboardInterrupt
    monkeypatch.setattr(EventQueue, "run", interrupted)
    with pytest.raises(KeyboardInterrupt) as err:
        simulate(parse(["-n", "8", "--iterations", "1000", "--compute-time", "0.1", "--no-progress",
                        "--log-dir", str(tmp_path)]), out=io.StringIO())
    assert isinstance(err.value, Stopped)
    assert str(err.value).startswith("at virtual second 1.9") and "(the workers at iteration" in str(err.value)
    lines = [json.loads(x) for x in (tmp_path / "rank3.jsonl").read_text().splitlines()]
    assert [x["iter"] for x in lines[1:]] == list(range(len(lines) - 1)) and len(lines) > 15
