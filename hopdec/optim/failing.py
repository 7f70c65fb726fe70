"""An exception on any rank of a user's loop ends the whole job within a second or two, with one line.

The contract of ``hopdec train`` (:mod:`hopdec.runtime.failures`), for a script the user wrote: importing
:mod:`hopdec.optim` installs a ``sys.excepthook`` on every rank (:func:`install_early`; it acts in a job of
several MPI ranks only), and building a :class:`hopdec.optim.HopOptimizer` gives it its communicator. An
exception nobody caught -- in the user's code, or a hopdec error such as a peer timeout -- is printed as ONE line naming the rank,
the exception and where it was raised::

    hopdec: error: rank 2: ValueError: bad batch (at train.py:57; HOPDEC_DEBUG=1 shows the traceback)

and the job is aborted (``MPI_Abort``, exit code 3; 2 for bad input, ``ConfigError`` or ``TopologyError``):
the other ranks do not wait out their peer timeout and print nothing. When several ranks fail at once they
elect one reporter (:class:`hopdec.runtime.failures.FailureChannel`). ``HOPDEC_DEBUG=1`` prints the
traceback first.

Ctrl-C. The launch scripts turn Ctrl-C, SIGTERM and SIGHUP into SIGUSR1 to every rank (the clean stop of
``hopdec train``, :mod:`hopdec.runtime.interrupt`); in a user's script that default-killed every rank (an
Open MPI box, "exited on signal 10", and no chance to save). :func:`install_early` makes SIGUSR1 a
``KeyboardInterrupt``, as Ctrl-C is in one process -- unless the script handles SIGUSR1 itself -- so an
``except KeyboardInterrupt:`` can save a checkpoint. One nobody catches ends the job at once, through the
same election, with one line that says ``stopped`` (not an error) and exit code 128 + the signal the
launcher got (130 after Ctrl-C); the optimizer does not finish (serve) at exit first::

    hopdec: stopped: rank 0: KeyboardInterrupt (SIGINT to the launcher; at train.py:57)

``sys.exit(status)`` with a failure status (a non-zero number, or a message: ``sys.exit("Loss is nan")``,
as many public training scripts stop on a NaN loss) ends the job the same way, with the script's own exit
code: Python runs no ``excepthook`` for it, and the optimizer's exit handler would otherwise *finish* the
rank there -- serve its parameters to its neighbours until every other rank is done, and hide the failure
(exit code 0 with ``fault_tolerance``). So :func:`install_early` wraps ``sys.exit`` and the ``exit``/``quit``
builtins to note a failure status and where it was given (:func:`failed_exit`); a step taken afterwards
forgets it (the ``SystemExit`` was caught). The same after ``finish()``, with ``fault_tolerance`` too: a
failing exit is the script's decision to fail, not a death the survivors heal past (the job exited 0).
``sys.exit(0)`` or ``sys.exit()`` mid-loop is a rank done early, as before; a bare ``raise SystemExit(1)``
is seen only by a ``finish()`` it passes through.
"""

import atexit
import builtins
import os
import signal
import sys
import threading
import traceback

from hopdec.errors import HopdecError
from hopdec.transport.waiting import PeerTimeout

PROG = "hopdec"
BAD_INPUT = 2
"""The exit code of a job ended by a :class:`hopdec.errors.ConfigError` (a setting refused) or a
:class:`hopdec.errors.TopologyError` (a topology file that cannot be used), as ``hopdec train``'s for bad
input; anything else raised ends it with 3."""
_installed = {"comm": None, "previous": None, "early": False, "built": False}
_exit = {}
"""The last failing ``sys.exit`` since the last step: ``status``, ``name`` (``sys.exit``, ``exit``, ``quit``)
and ``at`` (``file.py:line``)."""


class UserError(HopdecError):
    """An exception from the user's loop, as one line (its type, message and where it was raised)."""


def where(tb):
    """``file.py:line`` of the innermost frame of ``tb`` outside hopdec, installed packages (torch) and
    Python's own library (:func:`_library`): the user's line."""
    frames = traceback.extract_tb(tb)
    for f in reversed(frames):
        if not _library(f.filename):
            return f"{os.path.basename(f.filename)}:{f.lineno}"
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else None


def as_one_line(err, tb):
    """What :func:`hopdec.runtime.failures.abort` prints for ``err``: hopdec's own errors and peer timeouts
    as they are; anything else with its type and the user's line."""
    if isinstance(err, (HopdecError, PeerTimeout)):
        return err
    from hopdec.runtime.failures import message
    text = f"{type(err).__name__}: {message(err)}" if str(err) else type(err).__name__
    at = where(tb)
    hint = "HOPDEC_DEBUG=1 shows the traceback"
    return UserError(f"{text} ({'at ' + at + '; ' if at else ''}{hint})")


def install_early():
    """At ``import hopdec.optim`` (idempotent): the hook and the watched exits below, and an exit handler,
    so that an error on one rank *before* any optimizer is built -- a data file missing on one host, a
    ``sys.exit(1)`` -- ends the job with one line as well. Without it that rank sat in ``MPI_Finalize``
    while the others waited in the optimizer's constructor (its collectives), and the job never ended.
    They act only in a job of several MPI ranks (``mpi4py.MPI`` initialized): elsewhere Python's own
    handling runs."""
    if _installed["early"]:
        return
    _installed["early"] = True
    _installed["previous"] = sys.excepthook
    sys.excepthook = _hook
    sys.exit = _WatchedExit(sys.exit, "sys.exit")
    for name in ("exit", "quit"):                # (the site module's; absent under python -S)
        if hasattr(builtins, name):
            setattr(builtins, name, _WatchedExit(getattr(builtins, name), name))
    atexit.register(_at_exit)
    _stop_as_interrupt()
    from hopdec.runtime.interrupt import ignore_stops_at_exit
    ignore_stops_at_exit()          # (registered after _at_exit: runs before it, after the script's own)


def _stop_as_interrupt():
    """SIGUSR1 (the launch scripts' stop, see the module's note) raises ``KeyboardInterrupt``, when this
    process has no handler of its own for it (and only from the main thread, where signals are handled)."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL):
        signal.signal(signal.SIGUSR1, signal.default_int_handler)


def stopped(tb):
    """``(exit code, line)`` of a ``KeyboardInterrupt`` nobody caught: 128 + the signal the launch script
    got (:func:`hopdec.runtime.interrupt.launcher_signal`), else 130 (Ctrl-C's); the line names it and the
    user's line it interrupted."""
    from hopdec.runtime.interrupt import launcher_signal
    sig, at = launcher_signal(), where(tb)
    said = ([f"{sig} to the launcher"] if sig else []) + ([f"at {at}"] if at else [])
    return (128 + int(getattr(signal, sig or "SIGINT", signal.SIGINT)),
            UserError("KeyboardInterrupt" + (f" ({'; '.join(said)})" if said else "")))


def install(comm):
    """When a rank builds its optimizer (collective: every rank does): the failure notices then travel on
    a duplicate of ``comm``, the job's ranks (see :func:`install_early` for the hook itself)."""
    from hopdec.runtime.failures import watch_failures
    install_early()
    if comm.Get_size() == 1:                     # one process: Python's own handling is the right one
        return
    if _installed["comm"] is None:
        watch_failures(comm.Dup())
    _installed["comm"] = comm


def mark_built():
    """An optimizer was built in this process: from now on its own exit handler decides at exit."""
    _installed["built"] = True


def _job():
    """The communicator a failure ends: the optimizer's, or before one was built ``COMM_WORLD`` -- when
    this process is one of several ranks of a running MPI job; else None."""
    if _installed["comm"] is not None:
        return _installed["comm"] if _installed["comm"].Get_size() > 1 else None
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi.COMM_WORLD if mpi.COMM_WORLD.Get_size() > 1 else None


def _abort(comm, err, code, kind="error"):
    """One line (from the rank the failing ranks elect) and ``MPI_Abort``. Before any optimizer was built
    the election runs on ``comm`` itself, set up now: no collective call is possible any more."""
    from hopdec.runtime import failures
    if failures._channel is None:
        failures.watch_failures(comm)
    failures.abort(comm, err, PROG, code=code, kind=kind)


def _at_exit():
    """A failing ``sys.exit`` in a process that never built an optimizer (its own exit handler decides
    otherwise): the other ranks may be waiting in the constructor's collectives."""
    if not _installed["built"]:
        end_if_failing()


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
            f = caller = sys._getframe(1)
            while f is not None and _library(f.f_code.co_filename):    # argparse's exit: the user's line
                f = f.f_back
            f = f or caller
            _exit.update(status=status, name=self.name,
                         at=f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
        return self.fn(status)

    def __repr__(self):
        return repr(self.fn)


def user_stacklevel():
    """The ``stacklevel`` of a ``warnings.warn`` made by the caller that names the user's line: the first
    frame outside hopdec, torch and Python's library (HopSGD's ``super().__init__``, torch's step wrappers
    in between), else the caller's caller."""
    f, level = sys._getframe(1), 1
    while f is not None and _library(f.f_code.co_filename):
        f, level = f.f_back, level + 1
    return level if f is not None else 2


def _library(path):
    """Whether ``path`` is code of Python's standard library, an installed package or hopdec (not the
    user's: where a ``sys.exit`` is reported from)."""
    import sysconfig

    import hopdec
    homes = (os.path.dirname(os.path.abspath(hopdec.__file__)), sysconfig.get_paths()["stdlib"])
    return (path.startswith("<") or any(f"{os.sep}{d}{os.sep}" in path for d in ("site-packages", "dist-packages"))
            or any(path.startswith(h + os.sep) for h in homes))


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
        status = in_flight.code
        noted = _exit.get("status") is status           # (raised by a watched exit: its name and line)
        name = _exit["name"] if noted else "SystemExit"
        at = _exit["at"] if noted else where(in_flight.__traceback__)
    elif _exit:
        status, name, at = _exit["status"], _exit["name"], _exit["at"]
    else:
        return None
    text = repr(status)
    if len(text) > 200:                         # (Python prints the whole message itself)
        text = text[:197] + "..."
    return exit_code(status) & 0xFF or 1, UserError(f"{name}({text}){' (at ' + at + ')' if at else ''}: "
                                                     f"the rank exits with a failure status")


def abort_failed_exit(failed):
    """End the job for ``failed`` (:func:`failed_exit`) with one line and the script's exit code (not in a
    job of several ranks: nothing to do, Python exits as usual)."""
    comm = _job()
    if comm is not None:
        code, err = failed
        _abort(comm, err, code)


def end_if_failing():
    """At exit: a failing ``sys.exit`` noted since the last step (:func:`failed_exit`) ends the job
    (:func:`abort_failed_exit`); else nothing."""
    failed = failed_exit()
    if failed is not None:
        abort_failed_exit(failed)


def _hook(etype, err, tb):
    previous = _installed["previous"] or sys.__excepthook__
    comm = _job()
    if comm is None:
        return previous(etype, err, tb)
    from hopdec.errors import ConfigError, TopologyError
    from hopdec.runtime.failures import ABORT_CODE
    if os.environ.get("HOPDEC_DEBUG"):
        previous(etype, err, tb)
    if issubclass(etype, KeyboardInterrupt):
        code, line = stopped(tb)
        return _abort(comm, line, code, kind="stopped")
    _abort(comm, as_one_line(err, tb), BAD_INPUT if isinstance(err, (ConfigError, TopologyError))
           else ABORT_CODE)
