"""Shared test fixtures: real ``mpirun`` jobs with a timeout, and the ``mpi`` marker.

Every test that starts MPI processes uses the :func:`mpirun` fixture (and so carries the ``mpi`` marker:
``pytest -m "not mpi"`` is the fast subset). A job that runs past its timeout is killed with its whole
process group and the test fails with what it printed: a hang is a failure, never a stuck CI.
"""

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In-process torch work (references, the simulator's --math) on one thread, as the ranks run
# (--threads 1): on 2 shared cores, two spinning intra-op threads made a backward pass 4x slower.
torch.set_num_threads(1)


def mpi_env(gpu=False, **extra):
    """The environment of a test's MPI job: runs as root, oversubscribes the 2 cores, imports this checkout.

    A rank killed by a signal in native code prints where every Python thread was (``PYTHONFAULTHANDLER``;
    Open MPI leaves a handler already there alone): CI once saw a rank die in start-up with only Open MPI's
    one-frame backtrace (a call through a null pointer, 2026-12-03), which said nothing of where it was.

    Its ranks see no GPU unless ``gpu`` (the ``gpu`` tests, ``tests/test_gpu.py``): ``--device auto`` would
    put them on one, and the other tests compare with CPU references and time CPU work."""
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def run_bounded(cmd, timeout, env=None, cwd=ROOT):
    """Run ``cmd`` in its own session; past ``timeout`` s kill the whole group and fail the test."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env or mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        doomed = descendants(proc.pid)      # launch/*.sh run mpirun in a session of its own: not in the group
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out, err = proc.communicate()
        pytest.fail(f"hung for {timeout} s and was killed: {' '.join(map(str, cmd))}\n"
                    f"--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    if proc.returncode < 0:                 # killed by a signal (mpirun crashing): what it started goes too
        end_session(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def end_session(sid):
    """SIGKILL every process left in session ``sid`` (``run_bounded`` starts each command in its own)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    session = int(f.read().rsplit(")", 1)[1].split()[3])
                if session == sid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                continue


def descendants(pid):
    """Every process below ``pid`` (children, theirs, ...), read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


class MPIRun:
    """``mpirun(n, args)`` runs ``hopdec ARGS`` on n ranks; ``.python(n, argv)`` any Python program."""

    root = ROOT

    def __call__(self, n, args, timeout=180, env=None):
        return self.python(n, ["-m", "hopdec.cli"] + list(args), timeout=timeout, env=env)

    def python(self, n, argv, timeout=180, env=None, mpirun_args=()):
        from hopdec.runtime.sessions import remove_left_behind
        remove_left_behind()                # (as the launchers do: a killed mpirun's session stops a new one)
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", *mpirun_args, "-n", str(n),
               sys.executable] + [str(a) for a in argv]
        out = run_bounded(cmd, timeout, env=env)
        if out.returncode == -signal.SIGSEGV:
            # mpirun itself (not a rank: a rank's crash is mpirun's exit status 139) died in PMIx's
            # teardown (PMIx_server_finalize; Open MPI's open issue open-mpi/ompi#13650, about 1 job in
            # 16 that ends on a hung rank's abort here): not the job's doing, so it runs once more
            import warnings
            warnings.warn(f"mpirun crashed (SIGSEGV, Open MPI's teardown); ran again: {' '.join(cmd[-2:])}")
            remove_left_behind()
            out = run_bounded(cmd, timeout, env=env)
        return out

    def batch(self, n, runs, timeout=300, env=None, prelude=""):
        """Several ``hopdec train`` runs (each an argv without ``train``) one after the other in ONE
        ``mpirun -n N`` job: the ranks start (import torch, MPI_Init) once instead of once per run.
        Returns one ``CompletedProcess`` per run with rank 0's output of that run and the code ``main``
        returned (a run refused at setup returns 2 on every rank and the next run starts); a run that
        aborts ends the job: the batch fails with what it printed. ``prelude``: Python each rank runs first."""
        proc = self.python(n, ["-c", prelude + BATCH_DRIVER, json.dumps([[str(a) for a in r] for r in runs])],
                           timeout=timeout, env=env)
        outs, errs = proc.stdout.split(BATCH_MARK)[1:], proc.stderr.split(BATCH_MARK)[1:]
        results = []
        for i, out in enumerate(outs):
            out, _, rc = out.partition(BATCH_RC)
            if not rc:
                break
            err = errs[i] if i < len(errs) else ""
            results.append(subprocess.CompletedProcess(runs[i], int(rc.split("@@")[0]), out, err))
        assert len(results) == len(runs) and proc.returncode == 0, (
            f"batch ended in run {len(results)} of {len(runs)} (rc {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return results

    def launch(self, n, args, timeout=180, env=None):
        """``launch/local.sh -n N ARGS`` (what a user types; it adds the flags --fault-tolerance needs)."""
        return run_bounded(self.launch_cmd(n, args), timeout, env=env or self.launch_env())

    def launch_cmd(self, n, args):
        return [os.path.join(ROOT, "launch", "local.sh"), "-n", str(n)] + [str(a) for a in args]

    @staticmethod
    def launch_env(**extra):
        return mpi_env(HOPDEC_CMD=f"{sys.executable} -m hopdec.cli train", **extra)

    @staticmethod
    def env(**extra):
        return mpi_env(**extra)

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def topo_bounds(path, max_ig=None, staleness=None):
        """``hopdec topo analyze --json``'s Table 1 bounds for a file (what the user would read; asked
        once per file and settings)."""
        cmd = [sys.executable, "-m", "hopdec.cli", "topo", "analyze", str(path), "--json"]
        if max_ig is not None:
            cmd += ["--max-ig", str(max_ig)]
        if staleness is not None:
            cmd += ["--staleness", str(staleness)]
        out = run_bounded(cmd, 60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["gap_bounds"]


@contextlib.contextmanager
def address_space_capped(extra=2 ** 31):
    """This process may grow by at most ``extra`` bytes of address space inside: a regression that
    allocates what a header claims is a MemoryError here, not a machine pushed into the OOM killer."""
    import resource
    old = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = size + extra if old[1] == resource.RLIM_INFINITY else min(size + extra, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


BATCH_MARK = "@@hopdec-batch-run@@\n"
BATCH_RC = "@@rc="
BATCH_DRIVER = f"""
import json, sys, time
from mpi4py import MPI
from hopdec.cli.train import main
rank = MPI.COMM_WORLD.Get_rank()
for argv in json.loads(sys.argv[1]):
    if rank == 0:
        time.sleep(0.2)     # the other ranks' output of the last run is forwarded before the mark
        print({BATCH_MARK!r}, end="", flush=True)
        print({BATCH_MARK!r}, end="", file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Barrier()
    rc = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.COMM_WORLD.Barrier()
    if rank == 0:
        print(f"{BATCH_RC}{{rc}}@@", flush=True)
"""
"""What each rank of :meth:`MPIRun.batch` runs: ``hopdec train`` once per argv; rank 0 marks where each
run's output begins and what ``main`` returned."""


@pytest.fixture(scope="session")
def mpirun():
    """Real ``mpirun`` jobs with a timeout (see :class:`MPIRun`)."""
    return MPIRun()


def pytest_collection_modifyitems(items):
    for item in items:
        if "mpirun" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.mpi)


@pytest.fixture
def netns_testbed():
    """Emulated networks for a test (:mod:`hopdec.testbed`): ``tb = netns_testbed(spec)`` builds one
    (namespaces, links, delays) and returns it up; every one is torn down after the test, whatever
    happened. Skipped, with the reason, where this machine cannot build one (not root, no namespaces)."""
    from hopdec.testbed.netns import NetnsTestbed, support
    why = support()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    made = []

    def build(spec):
        tb = NetnsTestbed(spec)
        made.append(tb)
        return tb.up()
    yield build
    for tb in made:
        tb.down()


@pytest.fixture
def full_disk(tmp_path):
    """``full_disk(size)``: a new directory on a filesystem of ``size`` (``"64k"``) that fills up, as a cluster's
    scratch disk or quota does (a tmpfs mounted for the test, unmounted after it). Skipped, with the
    reason, where this machine cannot mount one (not root)."""
    mounted = []

    def make(size):
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small filesystem here: {(r.stderr or r.stdout).strip()[:200]}")
        mounted.append(where)
        return where
    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def gone(pid, within=5.0):
    """True once process ``pid`` no longer exists (a zombie of a reaped job counts as gone)."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False
