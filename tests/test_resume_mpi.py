"""Checkpoint, resume and Ctrl-C on real mpirun jobs (issue 11): a run resumed after a kill, or after a clean
stop, ends with the parameters of the uninterrupted run (deterministic settings: the ring, standard
protocol; BSP); a stop leaves no process behind and every log line parseable; resuming onto another
number of ranks is one line. Every job runs under a timeout (a hang fails the test)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hopdec.runtime import checkpoint as C
from reference import synchronous_averaging

HOP_ITERS, PS_ITERS = 16, 12
RANKS = 2                                   # decentralized; the PS runs have a server and 2 workers
HOP = ["train", "--no-progress", "--threads", "1", "--topology", "complete", "--iterations", HOP_ITERS,
       "--save-models"]
PS = ["train", "--no-progress", "--threads", "1", "--sync", "bsp", "--iterations", PS_ITERS, "--save-models"]
LOCAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch", "local.sh")


def params(log_dir, ranks):
    return [np.load(os.path.join(log_dir, f"params_rank{r}.npy")) for r in ranks]


def assert_same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)


def records(log_dir, rank):
    """Every line of a rank's log, parsed (a partial line would raise)."""
    with open(os.path.join(log_dir, f"rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def pids(log_dir, ranks):
    return {r["run"]["pid"] for rank in ranks for r in records(log_dir, rank) if "run" in r}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_none_left(pid_set, within=10):
    deadline = time.time() + within
    while any(alive(p) for p in pid_set) and time.time() < deadline:
        time.sleep(0.2)
    assert not [p for p in pid_set if alive(p)], "processes left behind"


def stop_lines(err):
    return [ln for ln in err.splitlines() if ln.startswith("hopdec train: stopped")]


def _default_sigint():
    """In the child: SIGINT handled by default, as under a terminal. A test process started in the background
    of a script inherits SIGINT ignored, and a shell cannot trap a signal ignored on entry: the launcher
    would never see the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(cmd, env):
    return subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_default_sigint)


def wait_for_records(log_dir, rank, n, proc, timeout=90):
    path = os.path.join(log_dir, f"rank{rank}.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path) and sum(1 for _ in open(path)) > n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path}: fewer than {n} records (exit {proc.poll()})")


def finish(proc, timeout=60):
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"did not stop within {timeout} s\n{err[-3000:]}")


def resume_args(line):
    """The ``hopdec train`` arguments of the resume command a stopped run printed (``mpirun -n N hopdec
    train ARGS``, or ``launch/local.sh -n N ARGS`` under the launch script)."""
    cmd = shlex.split(line.split("resume with: ", 1)[1])
    if cmd[0] == LOCAL:
        assert cmd[1] == "-n", cmd
        return int(cmd[2]), ["train", *cmd[3:]]
    assert cmd[:2] == ["mpirun", "-n"] and cmd[3:5] == ["hopdec", "train"], cmd
    return int(cmd[2]), cmd[4:]


def _context(argv, iters):
    import torch

    from hopdec.cli.train import parse
    from hopdec.modes.work import resolve
    torch.set_num_threads(1)
    return resolve(parse([str(a) for a in argv[1:] if a != "--save-models"]).work, 1)   # (no --log-dir here)


@pytest.fixture(scope="module")
def hop_reference():
    """The uninterrupted run, computed in one process: on the complete graph every Reduce is the plain
    mean, summed in rank order as the ranks do (so the MPI runs match it to float rounding)."""
    n = RANKS
    ctx = _context(HOP, HOP_ITERS)
    ref = [ctx.trainer(r, n) for r in range(n)]
    synchronous_averaging(ref, HOP_ITERS)
    return [t.write_params() for t in ref]


@pytest.fixture(scope="module")
def bsp_reference():
    """The uninterrupted BSP run in one process: the server's parameters after PS_ITERS steps."""
    from hopdec.runtime.backend import combine
    n = 2
    ctx = _context(PS, PS_ITERS)
    server = ctx.trainer(0, n)
    workers = [ctx.trainer(w, n) for w in range(n)]
    scratch = np.zeros(server.numel, dtype=np.float32)
    for _ in range(PS_ITERS):
        grads = []
        for t in workers:
            t.load_params(server.write_params())
            t.compute()
            grads.append(t.flat.grad.numpy().copy())
        combine([(g, 1.0 / n) for g in grads], server.flat.grad.numpy(), scratch)
        server.apply()
    return server.write_params()


def test_a_decentralized_run_resumed_after_a_kill_ends_as_the_uninterrupted_one(mpirun, tmp_path, hop_reference):
    """... and its consensus rounds and their evaluations are logged once each: the resumed run joins the
    rounds from its checkpoint on, and the rounds lost with the killed run are cut from eval.jsonl (before,
    every round before the resume point was logged again)."""
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    watch = ["--consensus-every", 3, "--eval-interval", 0.001]
    out = mpirun(RANKS, HOP + watch + ["--log-dir", logs, "--checkpoint-dir", ck, "--checkpoint-every", 4,
                                       "--die-rank", 1, "--die-at", 10], timeout=120)
    assert out.returncode != 0
    keys = [set(map(int, C.read_manifest(str(ck), r)["complete"])) for r in range(RANKS)]
    assert all(8 in k for k in keys) and all(max(k) < HOP_ITERS for k in keys)
    out = mpirun(RANKS, HOP + watch + ["--log-dir", logs, "--resume", ck], timeout=120)
    assert out.returncode == 0, out.stderr
    assert_same(params(logs, range(RANKS)), hop_reference)
    for r in range(RANKS):                   # the log continues: every iteration once, two headers
        recs = records(logs, r)
        assert [x["iter"] for x in recs if "iter" in x] == list(range(HOP_ITERS))
        assert [x["run"].get("resumed_from") for x in recs if "run" in x] == [None, 8]
    rounds = [x["at"] for x in records(logs, 0) if x.get("event") == "consensus"]
    assert rounds == [3, 6, 9, 12, 15, 16], rounds
    with open(logs / "eval.jsonl") as f:
        assert [json.loads(x)["at"] for x in f] == rounds
    # another number of ranks: one line, before anything starts
    out = mpirun(1, HOP + ["--log-dir", tmp_path / "one", "--resume", ck], timeout=90)
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert out.returncode != 0 and len(errors) == 1, out.stderr
    assert f"written by {RANKS} ranks, this run has 1" in errors[0] and "out of scope" in errors[0]
    assert "Traceback" not in out.stderr


def test_ctrl_c_on_the_launcher_stops_cleanly_and_the_run_resumes_exactly(mpirun, tmp_path, hop_reference):
    """Ctrl-C reaches launch/local.sh's process group (as a terminal sends it): the ranks agree where to
    stop, write a final checkpoint, one line says how to resume; resuming gives the uninterrupted result."""
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    args = HOP[1:] + ["--compute-time", 0.2, "--log-dir", logs, "--checkpoint-dir", ck]
    proc = start(["bash", LOCAL, "-n", RANKS, *args], mpirun.env())
    wait_for_records(logs, 1, 5, proc)
    ranks = pids(logs, range(RANKS))
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 130, err
    assert time.time() - t0 < 15
    lines = stop_lines(err)
    assert len(lines) == 1 and "Traceback" not in err and "error" not in err, err
    assert_none_left(ranks)
    for r in range(RANKS):                  # every line parses; the records end at the stop
        iters = [x["iter"] for x in records(logs, r) if "iter" in x]
        assert iters == list(range(len(iters)))
    n, resume = resume_args(lines[0])
    stopped = int(lines[0].split("stopped at iteration ")[1].split()[0])
    assert n == RANKS and 5 <= stopped < HOP_ITERS and "--resume" in resume
    assert all(str(stopped) in C.read_manifest(str(ck), r)["complete"] for r in range(RANKS))
    # the line names the launch script, and the command it prints runs as it is (a bare mpirun command
    # lacked the script's flags: as root Open MPI refuses it)
    printed = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert printed[:3] == [LOCAL, "-n", str(RANKS)], printed
    out = subprocess.run(printed, env=mpirun.env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert_same(params(logs, range(RANKS)), hop_reference)


def test_sigint_to_mpirun_itself_leaves_no_process_and_whole_log_lines(mpirun, tmp_path):
    """Open MPI's own Ctrl-C handling kills every rank within 0.5 s: no final checkpoint, but nothing is
    left running, every log line parses, and the periodic checkpoints are intact and resumable."""
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", RANKS, sys.executable, "-m", "hopdec.cli",
           *HOP[:-2], 400, "--compute-time", 0.05, "--log-dir", logs, "--checkpoint-dir", ck,
           "--checkpoint-every", 3]
    proc = start(cmd, mpirun.env())
    wait_for_records(logs, 0, 10, proc)
    ranks = pids(logs, range(RANKS))
    os.kill(proc.pid, signal.SIGINT)
    finish(proc, timeout=30)
    assert_none_left(ranks)
    for r in range(RANKS):
        records(logs, r)
    key, _ = C.choose(str(ck), [C.summary(str(ck), r) for r in range(RANKS)], RANKS,
                      C.read_manifest(str(ck), 0)["settings"])
    assert key >= 3
    for r in range(RANKS):
        arrays, meta = C.load(str(ck), r, C.read_manifest(str(ck), r), key)
        assert meta["iteration"] == key and arrays["params"].dtype == np.float32


def test_a_bsp_run_resumed_after_a_kill_ends_as_the_uninterrupted_one(mpirun, tmp_path, bsp_reference):
    """... and the server's evaluation at the resume says the version it resumed at (it said 0)."""
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    out = mpirun(3, PS + ["--log-dir", logs, "--checkpoint-dir", ck, "--checkpoint-every", 4,
                          "--die-rank", 2, "--die-at", 9, "--eval-interval", 1000], timeout=120)
    assert out.returncode != 0
    assert all("2" in C.read_manifest(str(ck), r)["complete"] for r in range(3))     # the cut at step 8
    out = mpirun(3, PS + ["--log-dir", logs, "--resume", ck, "--eval-interval", 1000], timeout=120)
    assert out.returncode == 0, out.stderr
    assert_same(params(logs, [0]), [bsp_reference])
    for r in (1, 2):
        assert [x["iter"] for x in records(logs, r) if "iter" in x] == list(range(PS_ITERS))
    evals = [x["version"] for x in records(logs, 0) if x.get("event") == "eval"]
    assert evals == [0, 8, PS_ITERS], evals         # at each start and at the end


def test_a_stop_request_to_mpirun_stops_a_parameter_server_run_at_a_final_cut(mpirun, tmp_path):
    """SIGUSR1 to mpirun (what the launch scripts turn Ctrl-C into) under --sync ssp: the server ends the run
    at its next release and every rank saves the final cut, which a resume would start from (resuming
    from a final cut is run in-process for every sync model, tests/test_resume_ps.py)."""
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", 3, sys.executable, "-m", "hopdec.cli",
           "train", "--no-progress", "--threads", 1, "--sync", "ssp", "--iterations", 30, "--compute-time", 0.1,
           "--log-dir", logs, "--checkpoint-dir", ck]
    proc = start(cmd, mpirun.env())
    wait_for_records(logs, 1, 5, proc)
    ranks = pids(logs, range(3))
    os.kill(proc.pid, signal.SIGUSR1)
    out, err = finish(proc)
    assert proc.returncode == 128 + signal.SIGUSR1, err     # stopped, not completed (issue 17 item 11)
    lines = stop_lines(err)
    assert len(lines) == 1 and "(SIGUSR1)" in lines[0] and "mini-batches" in lines[0], err
    assert_none_left(ranks)
    summaries = [C.summary(str(ck), r) for r in range(3)]
    cut, server = C.choose(str(ck), summaries, 3, C.read_manifest(str(ck), 0)["settings"])
    arrays, meta = C.load(str(ck), 0, C.read_manifest(str(ck), 0), cut)
    assert meta["final"] and meta["state"]["core"]["work"] == meta["work"] == server["work"][str(cut)]
    work = meta["work"]
    assert f"after {work} of 60 mini-batches" in lines[0]
    for r in (1, 2):                          # a worker's saved iteration counts only gradients used
        _, wm = C.load(str(ck), r, C.read_manifest(str(ck), r), cut)
        iters = [x["iter"] for x in records(logs, r) if "iter" in x]
        assert iters == list(range(len(iters))) and wm["iteration"] in (len(iters), len(iters) - 1)
    n, resume = resume_args(lines[0])
    assert n == 3 and resume[-2:] == ["--resume", str(ck)]
    # resumed, the server's counts are since the start while the workers' rows are this run's: the line
    # said "server: 27 updates" beside rows of 9 iterations; it splits them now
    out = mpirun(3, resume, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("server: "))
    total = int(line.split()[1])
    assert line.startswith(f"server: {total} updates ({meta['version']} before the resume, "
                           f"{total - meta['version']} in this run), ") and line.endswith(" s in this run"), line


def test_a_resume_into_a_folder_of_another_runs_logs_is_refused_and_leaves_them(mpirun, tmp_path):
    """hopdec train --resume D --log-dir L, L holding another run's logs (not those D's checkpoints logged
    to): the check of --log-dir was skipped for every resume, so the run wrote over that run's rank0/rank1
    logs without --overwrite and left its rank2.jsonl beside them. It is refused now, as a new run would be."""
    ck, own, other = tmp_path / "ck", tmp_path / "own", tmp_path / "other"
    short = [x if x != HOP_ITERS else 4 for x in HOP]
    out = mpirun(RANKS, short + ["--log-dir", own, "--checkpoint-dir", ck], timeout=120)
    assert out.returncode == 0, out.stderr
    os.makedirs(other)
    before = {}
    for r in range(3):
        (other / f"rank{r}.jsonl").write_text(f'{{"rank": {r}, "run": {{"mode": "allreduce", "run_id": "x"}}}}\n')
        before[r] = (other / f"rank{r}.jsonl").read_text()
    out = mpirun(RANKS, HOP + ["--iterations", 8, "--log-dir", other, "--resume", ck], timeout=120)
    errors = [ln for ln in out.stderr.splitlines() if "error" in ln]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"--log-dir {other}: holds the logs of an earlier run" in errors[0]
    assert {r: (other / f"rank{r}.jsonl").read_text() for r in range(3)} == before
