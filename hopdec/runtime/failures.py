"""When something goes wrong on one rank, the whole job ends fast, with one line naming the rank and the cause.

* Bad input found during setup is exchanged between the ranks (a bounded allgather) and printed once,
  by the lowest rank that found it; every rank exits 2.
* Anything raised later -- in training, evaluation or shutdown, on any rank -- is printed as one line
  ``hopdec train: error: rank R: cause`` by that rank, which then calls ``MPI_Abort``: Open MPI ends
  every rank at once (and adds its own notice). A hung peer is found by the peer timeout of every wait.
* When several ranks notice the same failure (the neighbours of a hung rank all time out), they agree
  who reports (:class:`FailureChannel`: within half a second, a few seconds for a hung rank): the user
  reads one line.
* ``HOPDEC_DEBUG=1`` adds the Python traceback of an unexpected exception.
"""

import os
import re
import signal
import sys
import time
import traceback

from hopdec.errors import HopdecError
from hopdec.transport.waiting import PeerTimeout

ABORT_CODE = 3
TAG_FAILURE = 301
GRACE_S = 0.5
"""How long a rank that noticed a failure listens for other ranks' notices before deciding who reports (0.2 s
left little margin on a loaded machine: a rank descheduled for longer misses the others' notices and
reports too)."""
SENT_S = 2.0
"""How long the rank a notice chose listens at most, before it claims, for its notices to have left (their sends
complete): ranks that never exchanged a message before (the workers of a parameter server) connect first, which
took longer than :data:`GRACE_S` on a loaded machine, and each one, having heard nobody, reported."""
SETTLE_S = 0.2
"""How long it listens after its notices left: the others' notices travel the connections its own just opened."""


def message(err):
    """``str(err)``, unless it embeds a traceback -- a DataLoader worker's exception re-raised in the main
    process carries the worker's whole traceback, which the one line held flattened (frames, carets, hundreds
    of characters) -- then the text before it, the embedded exception's own last line and the innermost frame
    outside installed packages that raised it."""
    import re
    text = str(err)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith("Traceback (most recent call last):")),
                 None)
    if start is None:
        return text
    head = " ".join(" ".join(lines[:start]).split()).rstrip(".:")
    rest = lines[start + 1:]
    last = next((line.strip() for line in reversed(rest) if line.strip()), "")
    frames = [m for m in (re.match(r'\s*File "([^"]+)", line (\d+)', line) for line in rest) if m]
    own = [m for m in frames if not any(f"{os.sep}{d}{os.sep}" in m.group(1) for d in ("site-packages",
                                                                                        "dist-packages"))]
    at = (own or frames)[-1] if frames else None
    raised = f" (raised at {os.path.basename(at.group(1))}:{at.group(2)})" if at else ""
    return f"{head + ': ' if head else ''}{last}{raised}"


def cause(err):
    """One line saying what went wrong: the message of errors hopdec raises, else the exception's type."""
    if isinstance(err, (HopdecError, PeerTimeout)):
        text = str(err)
    elif isinstance(err, KeyboardInterrupt):
        text = "interrupted"
    else:
        text = f"{type(err).__name__}: {message(err)}" if str(err) else type(err).__name__
        if not os.environ.get("HOPDEC_DEBUG"):
            text += " (HOPDEC_DEBUG=1 shows the traceback)"
    return " ".join(text.split())


def one_line(rank, err):
    """``rank R: cause``, unless the cause already names its rank."""
    text = cause(err)
    return text if text.startswith(f"rank {rank}:") else f"rank {rank}: {text}"


PATIENCE_S = 3.0
"""How long a rank that timed out waiting for ranks that have not announced a failure of their own listens
for them at most (from its own notice): they may be waiting for the hung rank themselves and time out a
moment later -- a descheduled rank on a loaded machine, seconds later -- and then name it. A rank that
waited for the hung one directly listens this long too (the hung one never announces)."""
MAX_ON = 15
"""Ranks a notice names as waited for (more are cut: the election only needs a few)."""
_NOTICE, _CLAIM = 0, 1
"""A message's kind: a notice (this rank noticed a failure) or a claim (this rank reports it)."""


class FailureChannel:
    """Who reports a failure that several ranks noticed. Each one announces ``(priority, since, rank,
    waited-for ranks)`` to every other rank and listens for :data:`GRACE_S` -- a timeout whose waited-for
    ranks have not announced, until they do or for :data:`PATIENCE_S`; then every candidate makes the same
    choice: an exception (priority 0) beats a timeout (1); among timeouts, a rank that waited directly
    for a rank that never announced (the hung or dead one) beats one that waited for ranks that are
    themselves waiting; then the earliest wait, then the lowest rank. The chosen one makes sure its notices
    have left (:data:`SENT_S`), listens a moment more and chooses again; if it is still the one, it sends a
    claim before it reports; a rank that hears a claim of the same or a better kind never reports (two
    lines), and one that loses waits for the claim. Messages are int64 arrays."""

    def __init__(self, comm):
        import numpy as np
        self.np, self.comm = np, comm
        self._buf = np.zeros(5 + MAX_ON, dtype=np.int64)
        self._req = comm.Irecv(self._buf, source=-1, tag=TAG_FAILURE)       # -1: MPI.ANY_SOURCE
        self._sent = []
        self.heard = {}
        self.heard_at = {}          # rank -> when its notice was collected (time.monotonic())
        self.claims = {}            # rank -> priority of its claim
        self.silent = []            # ranks this one waited for that sent no notice (as of its election)

    def _collect(self):
        while self._test():
            b = [int(x) for x in self._buf]
            if b[3] == _CLAIM:
                self.claims[b[2]] = b[0]
            else:
                self.heard[b[2]] = (b[0], b[1], tuple(b[5:5 + b[4]]))
                self.heard_at[b[2]] = time.monotonic()
            self._req = self.comm.Irecv(self._buf, source=-1, tag=TAG_FAILURE)

    def _test(self):
        if self._req is None:
            return False
        try:
            return self._req.Test()
        except Exception as err:                    # a dead peer (ULFM) fails an any-source receive
            self._after_failure(err)
            return False

    def _after_failure(self, err):
        """ULFM: an any-source receive stays pending but fails every test (ERR_PROC_FAILED_PENDING) until
        the failure is acknowledged; acknowledge it so the survivors' notices still arrive (otherwise each
        survivor hears nobody and every one of them reports). A receive that failed outright is posted
        again; if even that fails, the channel goes deaf (this rank then reports on its own)."""
        from hopdec.transport.mpi import FAILURE_CLASSES
        cls = err.Get_error_class() if hasattr(err, "Get_error_class") else None
        if cls not in FAILURE_CLASSES:
            self._req = None
            return
        try:
            self.comm.Ack_failed()
        except Exception:
            pass
        if cls != 76:                               # not ERR_PROC_FAILED_PENDING: the receive is over
            try:
                self._req = self.comm.Irecv(self._buf, source=-1, tag=TAG_FAILURE)
            except Exception:
                self._req = None

    def _announce(self, kind, priority, since=0.0, on=()):
        rank = self.comm.Get_rank()
        note = self.np.zeros(5 + MAX_ON, dtype=self.np.int64)
        note[:5 + len(on)] = [int(priority), int(since * 1e6), rank, kind, len(on), *on]
        for r in range(self.comm.Get_size()):
            if r != rank:
                try:
                    self._sent.append((r, note, self.comm.Isend(note, dest=r, tag=TAG_FAILURE)))
                except Exception:                   # a dead rank (ULFM): it does not vote
                    pass

    def _listen(self, until, done=lambda: False):
        """Collect messages until ``time.monotonic()`` passes ``until`` or ``done()``."""
        while True:
            self._collect()
            if done() or time.monotonic() >= until:
                return
            time.sleep(0.005)

    def _left(self, skip):
        """Whether every notice this rank sent, except to the ranks ``skip``, has left (its send completed;
        one that failed -- a dead peer -- counts as done)."""
        pending = []
        for r, note, req in self._sent:
            if req is None or r in skip:
                continue
            try:
                if req.Test():
                    continue
            except Exception:
                continue
            pending.append((r, note, req))
        self._sent = pending
        return not pending

    def ranks_of(self, ranks, comm=None):
        """``ranks`` of ``comm`` as this channel numbers them (None: they are already); those not in it go."""
        if comm is None:
            return tuple(ranks)
        from mpi4py import MPI
        return tuple(r for r in _translate(ranks, comm, self.comm) if r != MPI.UNDEFINED)

    def in_job(self, ranks):
        """``ranks`` of this channel by their ``COMM_WORLD`` ranks (as ``mpirun``, the script and its logs
        know them), or None when those are the same numbers (the channel is ``COMM_WORLD`` or a duplicate)."""
        from mpi4py import MPI
        got = _translate(ranks, self.comm, MPI.COMM_WORLD)
        return None if got == list(ranks) else got

    def _claimed(self, priority):
        return any(p <= priority for p in self.claims.values())

    def elect(self, priority, since, on=()):
        """Announce this rank's notice, listen for the others'; True when this rank should report.

        A rank that hears a claim of the same or a better kind stays silent: that rank reports (else two
        timeouts a few hundred ms apart on a loaded machine printed two lines). An exception that heard
        only timeouts claimed is still a candidate: its cause says more. A rank that waited for ranks that
        have not announced keeps listening for them (:data:`PATIENCE_S`): a rank descheduled between its
        send and its wait times out after a neighbour waiting for it, and it is the one whose line names
        the hung rank. A rank that is not chosen waits for the chosen one's claim (its report ends the
        job); if none comes, it reports itself: two lines are better than none."""
        rank = self.comm.Get_rank()
        on = tuple(int(r) for r in on)[:MAX_ON]
        self._sent = []
        self._collect()
        if self._claimed(priority):
            return False
        self._announce(_NOTICE, priority, since, on)
        start = time.monotonic()
        self._listen(start + GRACE_S, lambda: self._claimed(priority))
        if on:
            self._listen(start + PATIENCE_S,
                         lambda: self._claimed(priority) or all(r in self.heard for r in on))
        if self._claimed(priority):
            return False

        def choose():
            notices = dict(self.heard)
            notices[rank] = (int(priority), int(since * 1e6), on)
            silent = {r for _, _, waits in notices.values() for r in waits} - set(notices)
            self.silent = sorted(silent & set(on))

            def key(r):
                p, t, waits = notices[r]
                return (p, 0 if silent & set(waits) else 1, t, r)
            return min(notices, key=key), silent
        chosen, silent = choose()
        if chosen == rank:          # heard nobody better: make sure the others could hear this rank (SENT_S)
            skip = silent | set(on)
            now = time.monotonic()
            self._listen(now + SENT_S, lambda: self._claimed(priority) or self._left(skip))
            self._listen(time.monotonic() + SETTLE_S, lambda: self._claimed(priority))
            if self._claimed(priority):
                return False
            chosen, silent = choose()
        if chosen != rank:          # it claims at most PATIENCE_S + SENT_S + SETTLE_S after its notice
            self._listen(self.heard_at.get(chosen, start) + PATIENCE_S + SENT_S + SETTLE_S + 1.0,
                         lambda: self._claimed(priority))
            if self._claimed(priority):
                return False
        self._announce(_CLAIM, priority)
        return True


_channel = None


def watch_failures(comm):
    """Post the failure-notice receive for this process (call once, early, on every rank)."""
    global _channel
    _channel = FailureChannel(comm)
    return _channel


def _translate(ranks, src, dst):
    """``ranks`` of communicator ``src`` as ``dst`` numbers them (``MPI.UNDEFINED`` for those not in it)."""
    from mpi4py import MPI
    theirs, ours = src.Get_group(), dst.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(theirs, list(ranks), ours)]
    finally:
        theirs.Free()
        ours.Free()


def leave_if_ending():
    """Under ULFM, before the survivors heal or a PS server drops a worker: a rank that has written a
    failure's exit code into the launcher's file (:func:`record_exit`, just before its ``MPI_Abort``) is
    ending the job, and ULFM shows that abort to the others as a death. They left only at the abort's
    SIGTERM, after healing, training on and reporting it as a stop -- three lines where one was said; now
    they leave at once. (The file, not the failure channel: reading the channel's any-source receive
    here acknowledged the death early and two ranks then reported a later timeout. Across hosts the file
    is the launcher host's only: elsewhere the ranks heal as before.)"""
    code = _recorded_code()
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code & 0xFF)


def _world_named(line, rank):
    """``line`` (``rank r: ...``) naming the rank as ``mpirun`` and the script know it: on a communicator
    other than ``COMM_WORLD`` (an optimizer on a ``Split`` group) rank r is another process's world rank."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD.Get_rank()
    if world == rank or not line.startswith(f"rank {rank}:"):
        return line
    return f"rank {world} (rank {rank} of its communicator):" + line[len(f"rank {rank}:"):]


def _job_numbering(err, on, channel):
    """What a timeout's line adds about the ranks it names: those that noticed nothing (``name_silent``:
    stopped or hung there), and, on a communicator numbered otherwise than ``COMM_WORLD`` (an optimizer on
    a ``Split`` group), which ranks of the job the waited-for ones are -- its message numbers them in that
    communicator, where "rank 1" may be another process than the job's rank 1 (even the reporter)."""
    silent = channel.silent if err.name_silent else []
    if silent:
        job = channel.in_job(silent)
        named = ", ".join(map(str, silent)) if job is None else \
            ", ".join(f"{j} ({r} of its communicator)" for j, r in zip(job, silent))
        return f" (rank(s) {named} noticed nothing while the others timed out: stopped or hung there?)"
    job = channel.in_job(on) if on else None
    if job is None:
        return ""
    return f" (rank(s) {', '.join(map(str, on))} of its communicator: {', '.join(map(str, job))} of the job)"


def abort(comm, err, prog="hopdec train", code=ABORT_CODE, kind="error"):
    """Print one line naming this rank and the cause -- if this rank is the one elected to report (see
    :class:`FailureChannel`) -- then end every rank (``MPI_Abort``) with exit code ``code``. ``kind``: what
    the line says it was, ``error`` or ``stopped`` (a user's loop interrupted, :mod:`hopdec.optim.failing`).
    Under ULFM the ranks declared dead that still exist are killed first (:func:`end_dead_ranks`): the
    launcher's teardown sends SIGCONT before SIGTERM, and a stopped server woken so was ended by Open MPI
    as 'reported dead by someone else', with a backtrace, after the line that had named it."""
    rank = comm.Get_rank()
    timeout = isinstance(err, PeerTimeout)
    on = _channel.ranks_of(err.on, err.on_comm) if timeout and _channel is not None else ()
    reports = _channel is None or _channel.elect(1 if timeout else 0, err.started if timeout else time.time(), on)
    if reports:
        if os.environ.get("HOPDEC_DEBUG") and not isinstance(err, (HopdecError, PeerTimeout)):
            traceback.print_exception(err, file=sys.stderr)
        line = _world_named(one_line(rank, err), rank)
        if timeout and _channel is not None:
            line += _job_numbering(err, on, _channel)
        print(f"{prog}: {kind}: {line}", file=sys.stderr, flush=True)
        forwarded()            # the launcher has the line before MPI_Abort kills everyone
    else:
        time.sleep(OTHERS_S)   # the elected rank is about to abort the job
    record_exit(code)
    if _ulfm_running():
        end_dead_ranks()       # (after the line) the launcher's teardown would wake them first: see above
    end_job(comm, code)


def end_job(comm, code):
    """End every rank with exit code ``code``: ``MPI_Abort``, or, in a job of one process (``hopdec train``
    run without a launcher), its own exit -- there is nobody else to end, and Open MPI's abort would print
    a box of ten lines under the job's one line (or, where its help files are not found, a "Sorry!" box)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() == 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    comm.Abort(code)


def _ulfm_running():
    """Whether this process is a rank of a fault-tolerant job (``mpirun --with-ft ulfm``) with MPI running."""
    mpi = sys.modules.get("mpi4py.MPI")
    return (os.environ.get("OMPI_MCA_mpi_ft_enable") == "1" and mpi is not None and mpi.Is_initialized()
            and not mpi.Is_finalized())


FORWARD_S = 5.0
"""How long a rank that printed the job's one line waits at most for the launcher to read it (below)."""
OTHERS_S = FORWARD_S + 1.0
"""How long a rank that is not the one reporting waits for the reporter's abort before its own (it only
comes to that when the reporter died)."""


def forwarded(fd=2, bound=FORWARD_S):
    """Wait until the launcher has read what this process wrote to ``fd`` -- under ``mpirun`` stderr is a
    pipe to its I/O forwarding, which stops reading once the job is aborted: a line still in the pipe
    then is lost (a fixed 0.3 s lost it on a loaded machine) -- then 0.1 s for it to write the line out.
    Up to ``bound`` s (a launcher that does not read); at once when ``fd`` is not a pipe."""
    import array
    import fcntl
    import stat
    import termios
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        left = array.array("i", [0])
        deadline = time.monotonic() + bound
        while True:
            fcntl.ioctl(fd, termios.FIONREAD, left, True)      # bytes in the pipe not yet read
            if left[0] <= 0 or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
    except OSError:
        return
    time.sleep(0.1)


def record_exit(code):
    """Write the job's exit code where the launcher reads it (``HOPDEC_EXIT_FILE``, which
    ``launch/local.sh --fault-tolerance`` sets): Open MPI 5.0's launcher exits 0 when the rank that calls
    MPI_Abort is the last one alive (e.g. the one survivor that cannot heal), so it cannot say it. Only
    into the file the launcher made: one that is gone (a launcher killed, its file removed by the next
    launch) is not made again, to lie in $TMPDIR for good."""
    _write_exit_file(f"{int(code)}\n")


def record_started():
    """Mark in the launcher's exit-code file (``HOPDEC_EXIT_FILE``, a ``--fault-tolerance`` launch) that a
    hopdec rank of this job started: appended, never overwriting a code. Open MPI 5.0's launcher exits 0
    for a fault-tolerant job whatever its ranks' exits (a dead worker must not fail a job its survivors
    finished), so a job whose every rank died -- each exiting 17 at an injected death, or crashing -- ended
    0 without a word; with this mark and no code after it, ``run_job`` says so and exits 3."""
    _write_exit_file("-", append=True)


def record_finished():
    """This rank ended cleanly: ``0`` in the launcher's exit-code file unless a code is there already (a
    failure's, or a stop's, which win)."""
    if _recorded_code() is None:
        _write_exit_file("0\n")


def _recorded_code():
    """The exit code in the launcher's exit-code file (``HOPDEC_EXIT_FILE``), None if none is there yet (or
    there is no file to read)."""
    path = os.environ.get("HOPDEC_EXIT_FILE")
    try:
        with open(path) as f:
            code = re.search(r"\d+", f.read(64))
    except (OSError, TypeError):
        return None
    return None if code is None else int(code.group())


def _write_exit_file(text, append=False):
    path = os.environ.get("HOPDEC_EXIT_FILE")
    if path:
        flags = os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC)
        try:
            with os.fdopen(os.open(path, flags), "w") as f:     # (no O_CREAT: see record_exit)
                f.write(text)
        except OSError:
            pass


def end_dead_ranks():
    """End the processes of the ranks this one knows failed (``--fault-tolerance``): a rank declared dead
    may still exist -- stopped (SIGSTOP), or hung -- and ``mpirun`` waits for every process it started,
    so a run whose survivors finished would never end. They are killed by pid when they run on this host (from the start-up roll call, checked by start time: SIGKILL
    ends a stopped process without waking it), else through the launcher (:func:`hopdec.runtime.pmix.kill`,
    on any host; it sends SIGCONT first). Returns the ranks."""
    from mpi4py import MPI

    from hopdec.transport.ulfm import failed_ranks
    world = MPI.COMM_WORLD
    ranks = [r for r in failed_ranks(world) if r != world.Get_rank()]
    if not ranks:
        return []
    from hopdec.runtime import pmix, startup
    here, elsewhere = startup.me(), []
    for r in ranks:
        t = startup.table[r] if startup.table and r < len(startup.table) else {}
        if t.get("host") == here["host"] and t.get("start") and startup.start_time(int(t["pid"])) == t["start"]:
            try:
                os.kill(int(t["pid"]), signal.SIGKILL)     # at once: a stopped process is not woken first
                continue
            except OSError:
                pass
        elsewhere.append(r)
    pmix.kill(elsewhere)
    return ranks


def detector_timeout():
    """The ULFM failure detector's timeout in seconds, as the launcher set it for the ranks
    (``--mca mpi_ft_detector_timeout``: HOPDEC_FT_TIMEOUT, 30 by default), or None where it is not known."""
    try:
        t = float(os.environ.get("OMPI_MCA_mpi_ft_detector_timeout", "").strip())
    except ValueError:
        return None
    return t if t > 0 else None


def slow_detector_note(peer_timeout, ranks, option="--peer-timeout"):
    """A note when a fault-tolerant job of more than one rank has a peer timeout not above the failure
    detector's, else None.

    A hung rank (stopped, or looping) is found only by the detector, HOPDEC_FT_TIMEOUT seconds after its last
    heartbeat; a rank waiting on it -- a neighbour, or a parameter-server worker held by a barrier or a
    staleness bound the hung worker holds up -- gives up after the peer timeout, which ends the job. With a
    peer timeout not above the detector's, which comes first is a race (lost by a PS worker under SSP in one
    of 20 random runs with a stopped worker): the survivors the option asks for may never heal."""
    t = detector_timeout()
    if ranks < 2 or t is None or peer_timeout > t:
        return None
    return (f"{option} {peer_timeout:g} s is not above the failure detector's {t:g} s (HOPDEC_FT_TIMEOUT): a rank "
            f"waiting on a hung one may give up, ending the job, before the detector declares the hung rank "
            f"dead and the survivors heal; give {option} more than {t:g} s (its default, 120, is)")


def how_failed(rank):
    """What became of ``rank``, which ULFM reports failed, for the line that names it: ``died`` (its
    process is gone), or ``was declared dead: its process is stopped (SIGSTOP or Ctrl-Z?) and sent no
    heartbeat for T s`` (or ``runs but ... (hung?)``): the failure detector's timeout (T, the launcher's
    HOPDEC_FT_TIMEOUT) finds those, and 'died' misled. Read from /proc, by the roll call's pid and start
    time, when ``rank`` runs on this host; elsewhere it cannot tell which."""
    from hopdec.runtime import startup
    secs = os.environ.get("OMPI_MCA_mpi_ft_detector_timeout", "").strip()
    silent = f"sent no heartbeat for {secs} s" if secs else "sent no heartbeat within the failure detector's timeout"
    t = startup.table[rank] if startup.table and 0 <= rank < len(startup.table) else {}
    if not t.get("start") or t.get("host") != startup.me()["host"]:
        return f"died or was declared dead (killed, or it {silent}: stopped or hung)"
    state = startup.process_state(int(t["pid"]), t["start"])
    if state is None or state in "ZX":
        return "died"
    if state in "Tt":
        return f"was declared dead: its process is stopped (SIGSTOP or Ctrl-Z?) and {silent}"
    return f"was declared dead: its process runs but {silent} (hung?)"


def announce_ps_failure(worker, left):
    """The server's line when a worker dies (``--fault-tolerance``), as it happens: the decentralized
    runners print theirs at the heal (:meth:`hopdec.observe.RunObserver.on_failure`) -- unless a rank is
    ending the job (:func:`leave_if_ending`)."""
    leave_if_ending()
    print(f"hopdec: rank {worker} (a worker) failed; the server drops it and {left} worker"
          f"{'s' if left != 1 else ''} go{'es' if left == 1 else ''} on (the logs go on)", flush=True)


def stop_exit_code():
    """The exit status of a run that ended normally: 0, or 128 + the signal after a stop request reached
    this rank (Ctrl-C, SIGTERM from Slurm, SIGUSR1 from the launch scripts), as a shell reports a process
    a signal ended -- a stopped run, checkpoint or not, must not look completed to a scheduler or script.
    A stop the launch script passed on (:func:`~hopdec.runtime.interrupt.via_launcher`) exits 0: the
    script returns 128 + the signal it got, and ``mpirun`` then prints no error block for a clean stop."""
    from hopdec.runtime import interrupt
    sig = interrupt.requested()
    if not sig or interrupt.via_launcher(sig):
        return 0
    return 128 + int(sig)


def first_error(errors):
    """``(rank, message)`` of the lowest rank that reported an error, naming the rank unless every rank
    reported the same one; None when none did."""
    found = [(r, e) for r, e in enumerate(errors) if e]
    if not found:
        return None
    r, e = found[0]
    same = len(found) == len(errors) and all(x == e for _, x in found)
    return r, e if same else f"{e} (on rank {r})"
