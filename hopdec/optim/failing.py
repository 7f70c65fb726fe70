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

``sys.exit(status)`` with a failure status (a non-zero number, or a message: ``sys.exit("Loss is nan")``,
as many public training scripts stop on a NaN loss) ends the job the same way, with the script's own exit
code: Python runs no ``excepthook`` for it, and the optimizer's exit handler would otherwise *finish* the
rank there -- serve its parameters to its neighbours until every other rank is done, and hide the failure
(exit code 0 with ``fault_tolerance``). So :func:`install` wraps ``sys.exit`` and the ``exit``/``quit``
builtins to note a failure status and where it was given (:func:`failed_exit`); a step taken afterwards
forgets it (the ``SystemExit`` was caught). ``sys.exit(0)`` or ``sys.exit()`` mid-loop is a rank done
early, as before; a bare ``raise SystemExit(1)`` is seen only by a ``finish()`` it passes through.
"""

import builtins
import os
import sys
import traceback

from hopdec.errors import HopdecError
from hopdec.transport.waiting import PeerTimeout

PROG = "hopdec"
_installed = {"comm": None, "previous": None}
_exit = {}
"""The last failing ``sys.exit`` since the last step: ``status`` and ``at`` (``file.py:line``)."""


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
        sys.exit = _WatchedExit(sys.exit, "sys.exit")
        for name in ("exit", "quit"):            # (the site module's; absent under python -S)
            if hasattr(builtins, name):
                setattr(builtins, name, _WatchedExit(getattr(builtins, name), name))
    _installed["comm"] = comm


def exit_code(status):
    """The process exit code of ``SystemExit(status)``, as Python sets it: None is 0, a number itself, any
    other object (a message, which Python prints) 1."""
    if status is None:
        return 0
    return int(status) if isinstance(status, int) else 1


class _WatchedExit:
    """``sys.exit`` (or the ``exit``/``quit`` builtins) as it was, noting a failure status and its caller."""

    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __call__(self, status=None):
        if exit_code(status):
            f = sys._getframe(1)
            _exit.update(status=status, name=self.name,
                         at=f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
        return self.fn(status)

    def __repr__(self):
        return repr(self.fn)


def resumed():
    """The user's loop went on (a step): a failing ``sys.exit`` noted before was caught."""
    if _exit:
        _exit.clear()


def failed_exit(in_flight=None):
    """``(code, UserError)`` when this rank is exiting with a failure status, else None: the ``SystemExit``
    ``in_flight`` (``finish()`` called in a ``finally:`` it passes through), or else the last failing
    ``sys.exit`` noted since the last step (at interpreter exit, when it is gone)."""
    if in_flight is not None:
        if not isinstance(in_flight, SystemExit) or not exit_code(in_flight.code):
            return None
        status, name = in_flight.code, _exit.get("name", "SystemExit")
        at = _exit.get("at") if _exit.get("status") is status else where(in_flight.__traceback__)
    elif _exit:
        status, name, at = _exit["status"], _exit["name"], _exit["at"]
    else:
        return None
    text = repr(status)
    if len(text) > 80:
        text = text[:77] + "..."
    return exit_code(status) & 0xFF or 1, UserError(f"{name}({text}){' (at ' + at + ')' if at else ''}: "
                                                     f"the rank exits with a failure status")


def abort_failed_exit(failed):
    """End the job for ``failed`` (:func:`failed_exit`) with one line and the script's exit code (a job of
    one process: nothing to do, Python exits as usual)."""
    comm = _installed["comm"]
    if comm is None or comm.Get_size() == 1:
        return
    from hopdec.runtime.failures import abort
    code, err = failed
    abort(comm, err, PROG, code=code)


def _hook(etype, err, tb):
    previous = _installed["previous"] or sys.__excepthook__
    comm = _installed["comm"]
    if comm is None or issubclass(etype, KeyboardInterrupt) or comm.Get_size() == 1:
        return previous(etype, err, tb)
    from hopdec.runtime.failures import abort
    if os.environ.get("HOPDEC_DEBUG"):
        previous(etype, err, tb)
    abort(comm, as_one_line(err, tb), PROG)
