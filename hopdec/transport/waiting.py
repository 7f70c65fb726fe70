"""Waiting without hanging: one poll-and-back-off loop with a timeout, used by every MPI driver.

Every blocking wait in hopdec goes through :func:`poll_until`: it polls (e.g. ``MPI.Request.Testsome``)
back to back for its first :data:`SPIN_S`, yielding the core between polls, then sleeps between polls,
10 us doubling to 1 ms, so an idle rank leaves its core to ranks that compute (ranks usually outnumber
cores in emulated runs), and raises :class:`PeerTimeout` after ``timeout``
seconds so a dead or hung peer never hangs the job. Time this rank was not running -- the whole job
paused (Ctrl-Z through mpirun or a launch script, Slurm's ``scontrol suspend``: SIGSTOP, later SIGCONT),
a frozen container, a starved core -- does not count toward that timeout (:func:`run_clock`); and
:func:`resumes` counts SIGCONTs, so that a time measured across one (an emulated compute) is known to
include a pause.

While it waits, it runs the *idle hooks* (:func:`add_idle_hook`) between polls: what observes a run
(live progress, the consensus-distance reductions, :mod:`hopdec.observe`) gets its MPI progress there,
in time the rank would have slept anyway. Hooks must be quick and must not wait themselves -- except
one: a stop request (Ctrl-C) is noticed there too, through :func:`watching`, and the agreement on where
to stop waits, briefly, for the other ranks (:mod:`hopdec.runtime.interrupt`); no hook runs meanwhile.
"""

import contextlib
import os
import signal
import threading
import time

SPIN_S = 2e-3
"""How long a wait polls without sleeping, calling ``sched_yield`` between polls, before its first nap.
MPI moves a message only while both ranks are in it: a large one is a rendezvous (the sender's request,
the receiver's answer, then the data, in fragments over TCP or without single-copy shared memory), and a
rank napping through each step multiplies it (2 ranks, a core each, 1 MB each way: 2.2-2.3 ms per
exchange with naps alone, 0.4 with this spin, bare mpi4py 0.2; over TCP 3.2-3.5 -> 0.6-0.7 ms; without
CMA 15 -> 0.5-0.6; experiments/README.md, "Waits that spin before they nap"). A yielding poll lets
ranks that share the core run, so oversubscribed runs lose nothing (8 ranks on 2 cores: the same ms per
exchange from 1 to 64 MB, less at 4 KB)."""
SPIN_HOOKS_S = 2.5e-4
"""While a wait spins, the idle hooks run at its start and at most this often (they run after every nap
once it naps)."""

FIRST_NAP_S = 1e-5
"""The first sleep of a wait. 10 us rather than 50: a small message often lands within tens of us, and
a first nap of 50 us became ~110 us with the kernel's timer slack (8 ranks on 2 cores, 4 KB messages:
0.92 -> 0.40 ms per exchange, CPU per rank down too); a long wait costs two more wake-ups."""
LONGEST_NAP_S = 1e-3

STALL_S = 1.0
"""A step of a wait (a nap of at most :data:`LONGEST_NAP_S`, the idle hooks, a poll) that takes this much
longer than its nap means this rank was not running: stopped, frozen or starved. Its time is a stall, not
waiting (:func:`run_clock`)."""

_idle_hooks = []
_in_hook = False
_stalled = 0.0      # seconds of stalls seen in waits, in all (run_clock leaves them out)


def run_clock():
    """``time.monotonic()`` less the stalls seen in waits so far: the clock wait timeouts are measured on.

    A paused job stops every rank at once, but they resume one after another, and a rank computing when it
    stopped sends only after computing again. On the monotonic clock the first rank to resume had waited
    longer than its peer timeout and named a peer as dead or hung (a job paused longer than --peer-timeout
    failed on resume). A peer that is itself stopped or hung, while this rank runs, is timed as before."""
    return time.monotonic() - _stalled


_resumes = 0
_previous_sigcont = None


def _on_sigcont(signum, frame):
    global _resumes
    _resumes += 1
    if callable(_previous_sigcont):
        _previous_sigcont(signum, frame)


def count_resumes():
    """From now on, count the times this process is resumed after a stop (SIGCONT; a handler that only
    counts, and calls one the process had). Main thread only; False where it cannot (another thread)."""
    global _previous_sigcont
    if signal.getsignal(signal.SIGCONT) is _on_sigcont:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    _previous_sigcont = signal.signal(signal.SIGCONT, _on_sigcont)
    return True


def resumes():
    """How many times this process was resumed after a stop since :func:`count_resumes`: a time measured
    across a change of it includes a pause."""
    return _resumes


def _stall_check(last, nap):
    """Count the time beyond ``nap`` since ``last`` (:func:`run_clock`) as a stall when it exceeds
    :data:`STALL_S`; returns :func:`run_clock` after it. (On the run clock, a stall a wait inside an idle hook
    counted already is not counted twice by the wait around it.)"""
    global _stalled
    lost = run_clock() - last - nap
    if lost > STALL_S:
        _stalled += lost
    return run_clock()


def add_idle_hook(fn):
    """Call ``fn()`` between polls of every wait (until :func:`remove_idle_hook`); returns ``fn``."""
    _idle_hooks.append(fn)
    return fn


def remove_idle_hook(fn):
    if fn in _idle_hooks:
        _idle_hooks.remove(fn)


def run_idle_hooks():
    """Run the idle hooks once (not from inside a hook: a hook that waits does not recurse)."""
    global _in_hook
    if _in_hook or not _idle_hooks:
        return
    _in_hook = True
    try:
        for fn in tuple(_idle_hooks):
            fn()
    finally:
        _in_hook = False


@contextlib.contextmanager
def watching(fn):
    """``fn`` is an idle hook inside the block (the stop check of :mod:`hopdec.runtime.interrupt`)."""
    add_idle_hook(fn)
    try:
        yield
    finally:
        remove_idle_hook(fn)


class PeerTimeout(RuntimeError):
    """A rank waited longer than its peer timeout for a peer: one may have died or hung. ``on``: the ranks
    it waited for (when known); ``started``: when the wait began (wall clock); ``name_silent``: the message
    cannot say which of them is missing (a collective), so the report adds those that announced no timeout
    of their own (:func:`hopdec.runtime.failures.abort`); ``on_comm``: the communicator ``on`` numbers
    ranks in, when not the failure report's (a shrunk or split one)."""

    def __init__(self, message, started=None, on=(), name_silent=False, on_comm=None):
        super().__init__(message)
        self.started = time.time() if started is None else started
        self.on = tuple(on)
        self.name_silent = bool(name_silent)
        self.on_comm = on_comm


class PeerFailed(RuntimeError):
    """A peer process failed (ULFM reported it): with fault tolerance on, the survivors heal and go on."""


def poll_until(poll, timeout, message, clock=run_clock, on=(), started=None, name_silent=False,
               spin=SPIN_S):
    """Call ``poll()`` until it returns something truthy and return that: back to back for ``spin`` seconds
    (:data:`SPIN_S`; yielding the core between calls), then sleeping between calls.

    ``message``: the PeerTimeout text (a string, or a function returning one, called only on timeout);
    ``on``, ``name_silent``: as :class:`PeerTimeout`'s; ``started``: when the wait began (wall clock; default
    now), for the PeerTimeout. ``timeout=None`` waits forever (only for waits another timeout covers). Stalls (see
    :func:`run_clock`) are noted before the timeout is checked, so a rank resumed after a pause polls
    again before it can time out.
    """
    got = poll()
    if got:
        return got
    if spin > 0:
        now = time.perf_counter()
        until, hooks_at, last = now + spin, now, run_clock()
        while now < until:
            if _idle_hooks and now >= hooks_at:
                run_idle_hooks()
                hooks_at = now + SPIN_HOOKS_S
            os.sched_yield()
            got = poll()
            if got:
                return got
            last = _stall_check(last, 0.0)      # (stopped while spinning: a stall, as in a nap)
            now = time.perf_counter()
    start, nap, began = clock(), FIRST_NAP_S, time.time() if started is None else started
    last = run_clock()
    while True:
        time.sleep(nap)
        if _idle_hooks:
            run_idle_hooks()
        got = poll()
        if got:
            return got
        last = _stall_check(last, nap)
        nap = min(nap * 2, LONGEST_NAP_S)
        if timeout is not None and clock() - start > timeout:
            raise PeerTimeout(message() if callable(message) else message, started=began, on=on,
                              name_silent=name_silent)


def wait_event(event, timeout):
    """``event.wait(timeout)`` (a ``threading.Event``: True once it is set, False after ``timeout`` s),
    timed on :func:`run_clock` in steps of a second: a process paused meanwhile does not find its time
    used up on resuming (the start-up watchdog, which waits in a thread while MPI_Init runs)."""
    start = last = run_clock()
    while not event.wait(min(1.0, max(0.0, timeout - (run_clock() - start)))):
        last = _stall_check(last, 1.0)
        if run_clock() - start >= timeout:
            return event.is_set()
    return True


class WaitClock:
    """How long a worker has been in its current wait. The core repeats its Wait whenever a message arrives
    that does not satisfy it (an update from another neighbour, a grant), so its transport's wait returns
    and is called again; timed from each call, a rank waiting for a hung peer had its timeout put off by
    every unrelated message, and a rank further along -- waiting for peers that were themselves stuck --
    timed out first and named them instead of the hung one. Consecutive Waits with no action between them
    are one wait: :meth:`left` starts the clock at the first, :meth:`over` (the worker acted) stops it."""

    def __init__(self, clock=run_clock, wall=time.time):
        self._clock, self._wall = clock, wall
        self.since = None                   # (clock, wall clock) when the current wait began, or None
        self.began = None

    def left(self, timeout):
        """Seconds of ``timeout`` left to the current wait (starting it if none is running); None: no limit."""
        if self.since is None:
            self.since, self.began = self._clock(), self._wall()
        return None if timeout is None else max(0.0, timeout - (self._clock() - self.since))

    def over(self):
        self.since = self.began = None


def wait_any(requests, timeout, message, on=()):
    """Index of a completed request among ``requests`` (mpi4py), polling as :func:`poll_until` does."""
    from mpi4py import MPI

    def done():
        i = MPI.Request.Testany(requests)[0]
        return None if i == MPI.UNDEFINED else (i,)
    return poll_until(done, timeout, message, on=on)[0]
