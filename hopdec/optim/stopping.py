"""Ctrl-C in a user's loop: every rank stops at the same iteration, so the checkpoints it saves resume.

A stop signal made each rank raise ``KeyboardInterrupt`` wherever it was. Ranks are up to the iteration
gap apart, so the state dicts an ``except KeyboardInterrupt:`` saved held different positions, and
resuming from them was refused ("the ranks start at different positions"): the README's own recipe for a
time limit left checkpoints nobody could use.

Now, while an optimizer is stepping, the first stop signal -- SIGUSR1 (what the launch scripts and
``launch/slurm.sbatch``'s warning send) or SIGINT delivered to the rank -- is a stop *request*, as in
``hopdec train`` (:mod:`hopdec.runtime.interrupt`): the ranks agree where to stop on
:class:`~hopdec.runtime.interrupt.StopChannel` (one past the furthest position, so nobody has passed
it; a rank that is waiting answers from inside its wait), each keeps training until it reaches that
iteration, and there ``step()`` raises ``KeyboardInterrupt`` on every rank, at the same position. A
second signal raises at once, as does a signal outside an optimizer's steps (before the first step,
after ``finish()``) or in a process whose script handles the signal itself.
"""

import signal
import threading
import weakref

from hopdec.runtime import interrupt

SIGNALS = ("SIGINT", "SIGUSR1")
"""The signals that become ``KeyboardInterrupt`` in a user's loop: SIGINT (Python's) and SIGUSR1
(:func:`hopdec.optim.failing._stop_as_interrupt`)."""

_running = None                 # weak reference to the optimizer whose steps a signal stops


def _on_signal(signum, frame):
    opt = _running() if _running is not None else None
    if opt is None or interrupt.requested() is not None:
        raise KeyboardInterrupt             # no stepping optimizer, or the second signal: at once
    interrupt._handler(signum, frame)       # a request: the optimizer's next check announces it


def take_signals(opt):
    """``opt`` is stepping: the stop signals request an agreed stop (only where they raise
    ``KeyboardInterrupt`` now: a script's own handler is left alone; only from the main thread)."""
    global _running
    _running = weakref.ref(opt)
    if threading.current_thread() is not threading.main_thread():
        return
    for name in SIGNALS:
        sig = getattr(signal, name)
        if signal.getsignal(sig) is signal.default_int_handler:
            signal.signal(sig, _on_signal)


def release_signals(opt):
    """``opt`` stepped its last (finish()): a signal raises at once again, and the request it took is
    forgotten (a later optimizer in this process starts without one)."""
    global _running
    if _running is not None and _running() is opt:
        _running = None
        interrupt.reset()


class AgreedStop:
    """One optimizer's stop: :meth:`check` between actions and inside waits (cheap when nothing
    happened); :attr:`stop_at` once the ranks agreed."""

    def __init__(self, comm, timeout):
        self.channel = interrupt.StopChannel(comm, timeout)
        self.stop_at = None

    def check(self, core, finished=False):
        """Announce or answer a stop (blocks until every rank said where it is, bounded by the timeout);
        once agreed, no rank passes ``stop_at``: the core ends after it (no jump goes beyond it)."""
        if self.stop_at is not None:
            return
        got = self.channel.check(core.position, finished=finished)
        if got is not None:
            self.stop_at = got
            if not finished:
                core.stop_at(got + 1)       # Enter(stop_at) still comes: there step() raises

    def due(self, position):
        """Whether a rank at ``position`` (between steps) has reached the agreed stop."""
        return self.stop_at is not None and position >= self.stop_at

    def moved_to(self, comm):
        """After a heal: the agreement goes on among the survivors."""
        self.channel = self.channel.moved_to(comm)

    def close(self):
        self.channel.close()
