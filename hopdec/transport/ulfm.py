"""Going on after a failure over MPI (ULFM, ``--fault-tolerance``): the communicator a fault-tolerant run
works on, and the one shrink-and-retry loop every recovery runs (:class:`hopdec.runtime.heal.Healer`, the
parameter server's end of a run)."""


def fault_tolerant(comm):
    """A duplicate of ``comm`` whose errors return (ULFM): a peer's failure is an exception the runner
    handles, not an abort. Ranks (worker ids) stay those of ``comm``."""
    from mpi4py import MPI
    dup = comm.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    return dup


def on_survivors(comm, collective, revoke=False, again=None):
    """Run ``collective(survivors)`` on the survivors of ``comm``; returns ``(result, survivors)``.

    ``MPI_Comm_shrink`` is the agreement on who failed (their rows are missing from what a collective
    gathers). A failure during the collective revokes the new communicator and shrinks again.
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
        new = comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        try:
            return collective(new), new
        except Exception as err:
            if not again(err, new):
                raise
            comm, revoke = new, True
