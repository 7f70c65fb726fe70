"""Going on after a failure over MPI (ULFM, ``--fault-tolerance``): the communicator a fault-tolerant run
works on, and the one shrink-and-retry loop every recovery runs (:class:`hopdec.runtime.heal.Healer`, the
parameter server's end of a run)."""

import signal

DECLARED_DEAD_EXIT = int(signal.SIGABRT)
"""The exit status (6) of a rank the others declared dead that runs again
(:func:`leave_quietly_when_declared_dead`)."""


TAG_LEAVE = 301
"""Rank 0's message that it is done with the others (:func:`leave_together`)."""


def leave_together(comm, timeout):
    """Before a fault-tolerant rank exits: rank 0 of ``comm`` tells every other rank it is done with them,
    and they wait for that (up to ``timeout``; an error or a timeout: they leave anyway).

    Such a rank exits without ``MPI_Finalize`` (:func:`hopdec.cli.train._finish`), which ULFM counts as a
    failure: ranks that left as soon as their part of the summary's gather was sent were found failed by
    rank 0, still finishing it, and their rows were lost (a finished job ended with an error). Rank 0 waits
    on nobody here: its zero-byte sends complete at once, and it can leave."""
    import numpy as np
    from mpi4py import MPI

    from hopdec.transport.waiting import PeerTimeout, poll_until
    empty = [np.empty(0, dtype=np.uint8), MPI.BYTE]
    if comm.Get_rank() == 0:
        reqs = [comm.Isend(empty, dest=r, tag=TAG_LEAVE) for r in range(1, comm.Get_size())]
    else:
        reqs = [comm.Irecv(empty, source=0, tag=TAG_LEAVE)]

    def done():                 # each request alone: a send to a rank that died fails, the others go on
        for req in list(reqs):
            try:
                if not req.Test():
                    continue
            except MPI.Exception:   # (rank 0 died or left: this rank is done with the job either way)
                pass
            reqs.remove(req)
        return not reqs
    try:
        poll_until(done, timeout, "rank 0 did not say it was done")
    except PeerTimeout:         # (rank 0 hung: leave)
        pass


def failed_ranks(comm):
    """The ranks of ``comm`` this process knows failed (ULFM's ``MPIX_Comm_get_failed``), sorted; none
    where the MPI library has no ULFM."""
    from mpi4py import MPI
    try:
        failed = comm.Get_failed()
    except (MPI.Exception, NotImplementedError, AttributeError):
        return []
    n = failed.Get_size()
    if n == 0:
        return []
    mine = comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(failed, list(range(n)), mine)
    finally:
        failed.Free()
        mine.Free()
    return sorted(r for r in ranks if r is not None and r >= 0)


def fault_tolerant(comm):
    """A duplicate of ``comm`` whose errors return (ULFM): a peer's failure is an exception the runner
    handles, not an abort. Ranks (worker ids) stay those of ``comm``. Every driver's fault-tolerant run and
    ``HopOptimizer(fault_tolerance=True)`` come through here, so this rank also leaves quietly should the
    others declare it dead (:func:`leave_quietly_when_declared_dead`)."""
    from mpi4py import MPI
    leave_quietly_when_declared_dead()
    dup = comm.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    return dup


def leave_quietly_when_declared_dead():
    """A rank the others declared dead (stopped, or hung, past the failure detector's timeout) that runs
    again is ended by Open MPI itself: it prints one line ('ompi_proc_mark_as_failed: I have been reported
    dead by someone else ... Aborting.') and calls ``abort()`` from its detector thread (libmpi,
    ``ompi_errhandler_proc_failed_internal``), before Python can act -- and Open MPI's SIGABRT handler
    then printed a 25-line backtrace (and a core could be dumped). So SIGABRT's handler becomes libc's
    ``_exit`` (a handler is called with the signal's number: ``_exit(6)``, async-signal-safe, no Python):
    the rank exits with :data:`DECLARED_DEAD_EXIT` after Open MPI's line, which the launch scripts turn into
    hopdec's (``launch/_common.sh``). The price: any other ``abort()`` in this process (a C assertion) also
    exits 6 after its own message, without Open MPI's backtrace; ``HOPDEC_DEBUG=1`` keeps the backtrace.
    Idempotent; does nothing where libc cannot be loaded."""
    import ctypes
    import os
    if os.environ.get("HOPDEC_DEBUG"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(int(signal.SIGABRT), ctypes.cast(libc._exit, ctypes.c_void_p).value)
    except (OSError, AttributeError):
        pass


def on_survivors(comm, collective, timeout, what, revoke=False, again=None):
    """Run ``collective(survivors)`` on the survivors of ``comm``; returns ``(result, survivors)``.

    ``MPI_Comm_shrink`` is the agreement on who failed (their rows are missing from what a collective
    gathers); it waits for every living rank without a bound, so :func:`all_here` bounds it first by
    ``timeout`` (``what``: the PeerTimeout's words). A failure during the collective revokes the new
    communicator and shrinks again.
    ``revoke``: revoke ``comm`` first, so that every survivor, wherever it is blocked, joins the recovery
    (a heal; at the end of a run, when the others reach this point anyway, not). ``again(err, comm)``:
    whether an error means another failure (default :func:`hopdec.transport.mpi.is_peer_failure`).
    """
    from mpi4py import MPI

    from hopdec.transport.mpi import is_peer_failure
    again = again or is_peer_failure
    while True:
        if revoke:
            try:
                comm.Revoke()
            except MPI.Exception:
                pass
        all_here(comm, timeout, what)
        new = comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        try:
            return collective(new), new
        except Exception as err:
            if not again(err, new):
                raise
            comm, revoke = new, True


def all_here(comm, timeout, what):
    """Every living rank of ``comm`` reached this point, or PeerTimeout after ``timeout`` s.

    ``MPIX_Comm_iagree``, which ULFM completes despite dead ranks (an error then: it still completed) and on
    a revoked communicator. ``MPI_Comm_shrink`` has no timeout, and Open MPI 5.0 no nonblocking form: a rank
    alive to the failure detector (its heartbeat thread runs) but hung in Python never joined it, and the
    others waited forever (a PS worker hung at shutdown; a survivor hung as the others healed). The timeout
    names the ranks that did not say they timed out (``name_silent``)."""
    import numpy as np
    from mpi4py import MPI

    from hopdec.transport.collectives import wait_for_all
    req = comm.Iagree(np.ones(1, dtype=np.intc))

    def done():
        try:
            return req.Test()
        except MPI.Exception:           # (a rank died: the agreement completed all the same)
            return True
    wait_for_all(comm, done, timeout, lambda: (f"rank {comm.Get_rank()}: {what}: not every living rank got "
                                               f"there within {timeout:.0f} s; one may have hung"))
