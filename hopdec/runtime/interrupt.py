"""Ctrl-C: a stop request ends a run cleanly on every rank, at a consistent cut, with a final checkpoint.

What reaches the ranks. ``mpirun`` (Open MPI 5's PRRTE) turns SIGINT, SIGTERM and SIGHUP into a kill of
the job: every rank gets SIGCONT at once, SIGTERM 0.25 s later and SIGKILL 0.25 s after that (fixed
sleeps in PRRTE's ``odls_base_default_fns.c``, no parameter), and nothing a rank prints then reaches the
terminal. Other signals, SIGUSR1 included, it forwards to every rank unchanged. So a clean stop starts
from SIGUSR1 to ``mpirun`` -- what the launch scripts turn Ctrl-C and SIGTERM into -- or from SIGINT /
SIGTERM delivered to the ranks themselves (``srun``, Slurm's time limit, ``kill`` on a rank); after a raw
SIGINT to ``mpirun`` the last periodic checkpoint is what remains.

What the ranks do. :func:`install` makes SIGINT, SIGTERM and SIGUSR1 set a flag (never raise
KeyboardInterrupt: an interrupt is not a failure). The runners look at it between actions and, through
:func:`hopdec.transport.waiting.watching`, inside every wait:

* decentralized (:class:`StopChannel`): the ranks agree where to stop -- each announces its
  :attr:`~hopdec.hop.worker.Worker.position` to every other rank on a duplicated communicator (small
  nonblocking messages; a rank that hears one announces too) and all apply the same rule to what they
  heard (:func:`hopdec.hop.cuts.stop_agreement`: ``stop_at = max + 1``; the channel only carries the
  messages). The core's budget is lowered to it (:meth:`~hopdec.hop.worker.Worker.stop_at`): nobody has
  passed it, each finishes up to ``stop_at - 1`` normally, and Enter(stop_at) is a cut as consistent as
  the periodic ones.
* parameter server: a worker tells the server (one small message); the server core lowers its budget to
  the work done (:meth:`~hopdec.ps.server.Server.request_stop`) and the run ends at the next release,
  followed by the final cut.

Then every rank writes its final checkpoint, the summary is skipped, and rank 0 prints one line: where
the run stopped and the command that resumes it.

The launch scripts' part. Before turning a signal into SIGUSR1 they write its name into the file
``HOPDEC_STOP_FILE`` names (:func:`launcher_signal`), so the line names what the user sent ("SIGTERM to
the launcher", not SIGUSR1), and the ranks exit 0: the script returns 128 + that signal itself, and
``mpirun`` prints no block about ranks that exited non-zero after a clean stop.
"""

import os
import re
import signal
import sys
import time

import numpy as np

from hopdec.transport.waiting import poll_until

STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
TAG_STOP = 401

_requested = None               # (signal number, time) of the first stop request


def _handler(signum, frame):
    global _requested
    if _requested is None:
        _requested = (signum, time.time())


def install():
    """Make SIGINT, SIGTERM and SIGUSR1 request a clean stop instead of ending the process (and the
    launcher's stop be ignored once the process exits: :func:`ignore_stops_at_exit`)."""
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _handler)
    ignore_stops_at_exit()


_at_exit_registered = []


def ignore_stops_at_exit():
    """Register (once) an exit handler after which SIGUSR1, the launch scripts' stop, is ignored. A stop
    that arrives once the program is done has nothing left to stop, but Python's finalization resets the
    signals it handles to their default -- for SIGUSR1, ending the process -- and the signal then killed
    the rank inside ``MPI_Finalize``: Open MPI's box said it "exited on signal 10" (found by the failure
    campaign: SIGTERM to the launcher as a user's loop ended). An ignored signal stays ignored."""
    if _at_exit_registered:
        return
    import atexit
    _at_exit_registered.append(True)
    atexit.register(_ignore_stops)


def _ignore_stops():
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def requested():
    """The signal number of this process's stop request, or None."""
    return None if _requested is None else _requested[0]


def reset():
    """Forget a stop request (tests)."""
    global _requested
    _requested = None


def launcher_signal():
    """The signal the launch script got and turned into SIGUSR1 (e.g. ``"SIGTERM"``), or None: read from
    the file ``HOPDEC_STOP_FILE`` names, which the script writes before it signals ``mpirun`` (ranks on
    other hosts may not see the file: then None). Only a signal name is accepted from it."""
    path = os.environ.get("HOPDEC_STOP_FILE")
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return text if re.fullmatch(r"SIG[A-Z0-9]{1,10}", text) else None


def via_launcher(signum):
    """Whether stop request ``signum`` is the launch script's SIGUSR1 for a signal it named."""
    return signum is not None and int(signum) == signal.SIGUSR1 and launcher_signal() is not None


def signal_name(signum):
    """What the stop line says caused the stop: the signal's name, or the one the launcher got."""
    if via_launcher(signum):
        return f"{launcher_signal()} to the launcher"
    try:
        return signal.Signals(int(signum)).name
    except (ValueError, TypeError):
        return "a stop request"


class Woken(Exception):
    """Raised out of the core's wait when a stop changed what the core waits for (it must be asked again)."""


class StopChannel:
    """The decentralized ranks' agreement on where to stop (see the module docstring).

    ``check(position, finished)`` is cheap when nothing happened. When this rank got a stop signal, or a
    peer's announcement arrived, it announces ``position`` (the last iteration entered) to every other
    rank, waits for all of theirs (bounded by ``timeout``), and returns the agreed ``stop_at``
    (:func:`hopdec.hop.cuts.stop_agreement`); a rank whose training is over only answers (it never starts
    an agreement). One agreement per run.
    """

    def __init__(self, comm, timeout):
        self.comm = comm.Dup()
        self.timeout = timeout
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        self.bufs = {r: np.zeros(2, dtype=np.int64) for r in self.peers}
        self.reqs = [self.comm.Irecv(self.bufs[r], source=r, tag=TAG_STOP) for r in self.peers]
        self.got = set()
        self.sends = []
        self.stop_at = None
        self.signum = None
        self.broken = False                 # a peer failed (ULFM): no agreement until moved_to()
        self._old = []

    def _heard(self):
        from mpi4py import MPI
        if self.broken:
            return False
        try:
            for i in MPI.Request.Testsome(self.reqs) or ():
                self.got.add(self.peers[i])
        except MPI.Exception:               # a dead peer (--fault-tolerance): the transport reports it
            self.broken = True
        return bool(self.got)

    def moved_to(self, comm):
        """The channel among the survivors of a heal (collective over them). This one is left as it is:
        its requests stay referenced and untouched (freeing them after a failure is not safe)."""
        new = StopChannel(comm, self.timeout)
        new._old = self._old + [self]
        new.stop_at, new.signum = self.stop_at, self.signum
        return new

    def check(self, position, finished=False):
        """None, or ``stop_at`` once agreed (returned once)."""
        if self.stop_at is not None:
            return None
        mine = requested()
        if not self._heard() and (mine is None or finished or self.broken):
            return None
        note = np.array([position, mine or 0], dtype=np.int64)
        from mpi4py import MPI
        try:
            self.sends = [(note, self.comm.Isend(note, dest=r, tag=TAG_STOP)) for r in self.peers]
        except MPI.Exception:
            self.broken = True
            return None

        def everyone():
            self._heard()
            return self.broken or len(self.got) == len(self.peers)
        poll_until(everyone, self.timeout, lambda: (
            f"rank {self.rank}: stopping (Ctrl-C): ranks {', '.join(map(str, sorted(set(self.peers) - self.got)))} "
            f"did not say where they are within {self.timeout:.0f} s; a peer may have died or hung"))
        if self.broken:                     # a peer died meanwhile: agree again among the survivors
            return None
        from hopdec.hop.cuts import stop_agreement
        self.stop_at, self.signum = stop_agreement([note] + [self.bufs[r] for r in self.peers])
        return self.stop_at

    def close(self):
        """Cancel the announcements never received (no stop), finish ours, free the communicator."""
        from mpi4py import MPI
        if self.broken:
            return
        for r in self.reqs:
            if r != MPI.REQUEST_NULL:
                r.Cancel()
        MPI.Request.Waitall(self.reqs)
        if self.sends:
            poll_until(lambda: MPI.Request.Testall([r for _, r in self.sends]), self.timeout,
                       f"rank {self.rank}: a stop announcement was not received for {self.timeout:.0f} s")
        self.comm.Free()


def announce(line):
    """The one line a stopped run prints (rank 0)."""
    print(f"hopdec train: {line}", file=sys.stderr, flush=True)
