"""Waits and their timeouts (hopdec/transport/waiting.py): time this rank was not running is not a peer's
silence, while a peer that stays silent as this rank runs still times out."""

import os
import signal
import subprocess
import sys
import time
import types

import pytest

from hopdec.transport.waiting import PeerTimeout, poll_until

WAITER = """
import os, sys
from hopdec.transport.waiting import PeerTimeout, WaitClock, poll_until
flag = sys.argv[1]
w = WaitClock()
w.left(2.0)                                 # a worker's wait begins (the transport's clock)
print("waiting", flush=True)
try:
    poll_until(lambda: os.path.exists(flag), 2.0, "no flag")
except PeerTimeout:
    print("timed out", flush=True)
else:
    print("arrived", round(w.left(2.0), 1), flush=True)
"""


def _paused(script, flag, pause_s):
    """Run ``script`` (argument: ``flag``, a path) until it prints "waiting", stop it (SIGSTOP: Ctrl-Z,
    Slurm's suspend) for ``pause_s`` seconds, resume it, and 0.3 s later create ``flag`` -- the message of a
    peer that resumed a moment later and computed first; its output after "waiting"."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(flag)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(pause_s)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.3)
        flag.write_text("")
        return proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_paused_rank_does_not_time_out_on_a_peer_that_resumes_after_it(tmp_path):
    """The waiter is paused for 4 s, twice its timeout; the message comes 0.3 s after it resumes. On the
    monotonic clock it timed out at once; now the pause is a stall, and the wait's own clock (WaitClock,
    which spans a worker's repeated Waits) has time left too."""
    out = _paused(WAITER, tmp_path / "flag", 4.0)
    verdict, *left = out.split()
    assert verdict == "arrived", out
    assert 0.5 < float(left[0]) < 2.0, out       # the 0.2 s before the pause and the 0.3 s after it count


def test_a_silent_peer_still_times_out_while_this_rank_runs():
    t = time.monotonic()
    with pytest.raises(PeerTimeout, match="nobody"):
        poll_until(lambda: False, 0.3, "nobody")
    assert 0.3 <= time.monotonic() - t < 2.0


def test_a_slow_poll_is_a_stall_and_not_charged():
    """A step of a wait that takes far longer than its nap (this rank was starved or stopped inside it)
    does not use up the timeout: the wait goes on polling."""
    calls = []

    def poll():
        calls.append(1)
        if len(calls) == 2:
            time.sleep(1.5)                      # more than the timeout, and than STALL_S
        return len(calls) >= 6
    assert poll_until(poll, 1.0, "slow") is True


class _Trainer:
    """A LocalTrainer's compute for TorchBackend: 10 ms, and at call ``pause_at`` a resume (SIGCONT) and
    0.4 s more, as a compute paused with Ctrl-Z looks from inside."""
    send_storage = spare_stores = add_store = None
    device = types.SimpleNamespace(type="cpu")

    def __init__(self, pause_at):
        self.calls, self.pause_at = 0, pause_at

    def compute(self):
        self.calls += 1
        time.sleep(0.01)
        if self.calls == self.pause_at:
            os.kill(os.getpid(), signal.SIGCONT)
            time.sleep(0.4)
        return 1.0


def test_a_pause_inside_a_compute_is_not_multiplied_by_an_emulated_slowdown():
    """The emulated slowdown multiplies the measured compute; a pause inside it (Ctrl-Z, Slurm's suspend)
    is not compute: a 4x straggler paused for 8 s slept 24 s after it resumed, and its neighbours timed
    out on it. Now a compute measured across a resume counts as the last one measured without one."""
    from hopdec.heterogeneity import Emulator
    from hopdec.runtime.backend import TorchBackend
    b = TorchBackend(_Trainer(pause_at=2), Emulator(["rank=0,factor=4"], 0, range(2)))
    first, paused, after = b.compute(0), b.compute(1), b.compute(2)
    assert paused["measured_compute_s"] == first["measured_compute_s"] < 0.1, paused
    assert paused["compute_s"] < 0.3 and after["compute_s"] < 0.3, paused    # (was 0.41 x 4 = 1.64 s)
    assert after["measured_compute_s"] != first["measured_compute_s"]         # measured again


EVENT_WAITER = """
import os, sys, threading, time
from hopdec.transport.waiting import wait_event
flag, done = sys.argv[1], threading.Event()

def watch():                        # what sets the event: MPI_Init returning, here a file appearing
    while not os.path.exists(flag):
        time.sleep(0.01)
    done.set()
threading.Thread(target=watch, daemon=True).start()
print("waiting", flush=True)
print("set" if wait_event(done, 2.0) else "timed out", flush=True)
"""


def test_the_start_up_watchdog_does_not_count_a_pause(tmp_path):
    """The start-up watchdog waits in a thread while MPI_Init runs (``Event.wait`` on the monotonic clock):
    a job paused during start-up for longer than its bound was ended as stuck on resume."""
    out = _paused(EVENT_WAITER, tmp_path / "flag", 3.5)
    assert out.strip() == "set", out


def test_a_spinning_wait_polls_without_napping_until_its_spin_is_over(monkeypatch):
    """``spin``: polls back to back first (a nap costs tens of us more than it asks for), naps after."""
    naps = []
    monkeypatch.setattr(time, "sleep", naps.append)
    calls = []

    def poll(after):
        calls.append(1)
        return len(calls) >= after

    assert poll_until(lambda: poll(200), 10.0, "x", spin=5.0) and naps == [] and len(calls) == 200
    calls.clear()
    assert poll_until(lambda: poll(3), 10.0, "x", spin=0) and len(naps) == 2   # no spin: a nap between polls
    calls.clear()
    naps.clear()
    t0 = time.perf_counter()
    assert poll_until(lambda: poll(10 ** 9) or bool(naps), 10.0, "x", spin=0.002)
    assert time.perf_counter() - t0 >= 0.002 and len(naps) == 1             # the spin ran out: it napped


STEP = 2.0 ** -15


@pytest.fixture
def stepping_clock(monkeypatch):
    """``time.perf_counter`` moves STEP seconds per reading (a wait's spin counts on it, not on load);
    the list holds the clock's reading."""
    clock = [0.0]

    def perf_counter():
        clock[0] += STEP
        return clock[0]
    monkeypatch.setattr(time, "perf_counter", perf_counter)
    return clock


def test_a_wait_first_polls_yielding_its_core_then_naps(monkeypatch, stepping_clock):
    """By default a wait polls back to back for SPIN_S, yielding the core between polls (sched_yield: a
    rank on its own core polls again at once, so MPI's rendezvous steps are not each held up by a nap; an
    oversubscribed one lets the others run), and only then naps. (A clock that moves 2**-15 s per reading:
    the counts do not depend on this machine's load.)"""
    import math

    from hopdec.transport import waiting
    step, clock = STEP, stepping_clock
    naps, yields, calls = [], [], []
    monkeypatch.setattr(time, "sleep", naps.append)
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))

    def poll(after):
        calls.append(1)
        return len(calls) >= after

    assert poll_until(lambda: poll(50), 10.0, "x") and naps == [] and len(yields) == 49
    calls.clear()
    yields.clear()
    assert poll_until(lambda: poll(10 ** 9) or bool(naps), 10.0, "x")
    spun = math.ceil(waiting.SPIN_S / step)                 # polls within the spin, one per reading
    assert len(naps) == 1 and len(yields) in (spun - 1, spun) and clock[0] >= waiting.SPIN_S


def test_idle_hooks_run_while_a_wait_spins(monkeypatch, stepping_clock):
    """What observes a run (live progress, the stop check) gets its turn in a wait that ends within its
    spin: at the start of the spin and every SPIN_HOOKS_S of it, not at every poll. (A clock that moves
    2**-15 s per reading, so the count does not depend on this machine's load.)"""
    import math

    from hopdec.transport import waiting
    step, clock = STEP, stepping_clock
    naps, polls, ran = [], [], []
    monkeypatch.setattr(time, "sleep", naps.append)
    hook = waiting.add_idle_hook(lambda: ran.append(len(polls)))
    try:
        assert poll_until(lambda: polls.append(1) or len(polls) >= 40, 10.0, "x")
    finally:
        waiting.remove_idle_hook(hook)
    assert naps == [] and ran[0] == 1                       # at the spin's start (after the first poll)
    every = math.ceil(waiting.SPIN_HOOKS_S / step)          # readings (= polls) per SPIN_HOOKS_S
    assert 1 < every < 40 and [b - a for a, b in zip(ran, ran[1:])] == [every] * (len(ran) - 1)
    assert len(ran) == 1 + (39 - 1) // every


def test_a_stall_inside_a_waits_spin_is_a_stall_too():
    """A rank stopped (Ctrl-Z, Slurm's suspend) while its wait spins: that time is left out of the run
    clock the peer timeouts are measured on, as it is when the stop lands in a nap -- a job of fast
    exchanges spends most of its waits spinning."""
    from hopdec.transport import waiting
    calls = []

    def poll():
        calls.append(1)
        if len(calls) == 2:                     # inside the spin
            time.sleep(1.5)                     # more than STALL_S
        return len(calls) >= 3
    stalled = time.monotonic() - waiting.run_clock()
    assert poll_until(poll, 10.0, "x")
    assert time.monotonic() - waiting.run_clock() - stalled >= 1.4
