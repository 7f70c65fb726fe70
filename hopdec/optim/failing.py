"""An exception on any rank of a user's loop ends the whole job within a second or two, with one line.

The contract of ``hopdec train`` (:mod:`hopdec.runtime.failures`), for a script the user wrote: building a
:class:`hopdec.optim.HopOptimizer` installs a ``sys.excepthook`` on every rank. An exception nobody caught
-- in the user's code, or a hopdec error such as a peer timeout -- is printed as ONE line naming the rank,
the exception and where it was raised::

    hopdec: error: rank 2: ValueError: bad batch (at train.py:57; HOPDEC_DEBUG=1 shows the traceback)

and the job is aborted (``MPI_Abort``, exit code 3): the other ranks do not wait out their peer timeout
and print nothing. When several ranks fail at once they elect one reporter
(:class:`hopdec.runtime.failures.FailureChannel`). ``HOPDEC_DEBUG=1`` prints the traceback first.
A ``KeyboardInterrupt`` keeps Python's usual handling (mpirun's Ctrl-C ends every rank anyway).
"""

import os
import sys
import traceback

from hopdec.errors import HopdecError
from hopdec.transport.waiting import PeerTimeout

PROG = "hopdec"
_installed = {"comm": None, "previous": None}


class UserError(HopdecError):
    """An exception from the user's loop, as one line (its type, message and where it was raised)."""


def where(tb):
    """``file.py:line`` of the innermost frame of ``tb`` outside hopdec and torch (the user's line)."""
    frames = traceback.extract_tb(tb)
    for f in reversed(frames):
        path = f.filename.replace(os.sep, "/")
        if "/hopdec/" not in path and "/torch/" not in path:
            return f"{os.path.basename(f.filename)}:{f.lineno}"
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else None


def as_one_line(err, tb):
    """What :func:`hopdec.runtime.failures.abort` prints for ``err``: hopdec's own errors and peer timeouts
    as they are; anything else with its type and the user's line."""
    if isinstance(err, (HopdecError, PeerTimeout)):
        return err
    text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    at = where(tb)
    hint = "HOPDEC_DEBUG=1 shows the traceback"
    return UserError(f"{text} ({'at ' + at + '; ' if at else ''}{hint})")


def install(comm):
    """Make an uncaught exception on this rank abort the job with one line (idempotent; collective only in
    that every rank should call it, when it builds its optimizer). ``comm``: a communicator of the job's
    ranks; the failure notices travel on a duplicate of it."""
    from hopdec.runtime.failures import watch_failures
    if comm.Get_size() == 1:                     # one process: Python's own handling is the right one
        return
    if _installed["comm"] is None:
        watch_failures(comm.Dup())
        _installed["previous"] = sys.excepthook
        sys.excepthook = _hook
    _installed["comm"] = comm


def _hook(etype, err, tb):
    previous = _installed["previous"] or sys.__excepthook__
    comm = _installed["comm"]
    if comm is None or issubclass(etype, KeyboardInterrupt) or comm.Get_size() == 1:
        return previous(etype, err, tb)
    from hopdec.runtime.failures import abort
    if os.environ.get("HOPDEC_DEBUG"):
        previous(etype, err, tb)
    abort(comm, as_one_line(err, tb), PROG)
