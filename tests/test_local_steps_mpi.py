"""Local steps under real ``mpirun`` (issue 18 item 1): a user's loop with ``HopSGD(local_steps=4)`` computes
exactly what ``hopdec train --local-steps 4`` computes (DiLoCo's Nesterov outer step, int8 exchanges), and
the run's logs count rounds. One job for both."""

import json
import os

import numpy as np

DRIVER = """
import runpy, sys
save, loop_argv, train_argv = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
sys.argv = ["hopsgd_loop.py", "--steps", "30", "--seed", "2", "--save", save] + loop_argv
runpy.run_path("experiments/hopsgd_loop.py", run_name="__main__")   # the user's loop, as they run it
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    print("@@train@@", flush=True)
from hopdec.cli.train import main
sys.exit(main(train_argv))
"""


def test_a_users_loop_with_local_steps_matches_hopdec_train(mpirun, tmp_path):
    """30 steps in rounds of 4 (the last round has 2): the same parameters on every rank."""
    (tmp_path / "loop").mkdir()
    local = ["--local-steps", "4", "--compress", "int8"]
    out = mpirun.python(4, ["-c", DRIVER, tmp_path / "loop", " ".join(local), "--no-progress", "--threads", "1",
                            "--iterations", 30, "--seed", 2, "--log-dir", tmp_path / "train", "--save-models",
                            *local], timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    loop_out, _, train_out = out.stdout.partition("@@train@@")
    assert "+local(H=4, outer nesterov lr 0.7 momentum 0.9)" in train_out
    assert "rounds: 8 rounds of 4 local steps (30 inner steps per worker" in train_out
    for r in range(4):
        a = np.load(tmp_path / "loop" / f"params_rank{r}.npy")
        b = np.load(tmp_path / "train" / f"params_rank{r}.npy")
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    with open(tmp_path / "train" / "rank0.jsonl") as f:
        header = json.loads(f.readline())["run"]
        recs = [json.loads(x) for x in f if '"iter"' in x]
    assert header["local_steps"] == 4 and header["iterations"] == 8 and header["inner_steps"] == 30
    assert [r.get("inner_steps") for r in recs if "iter" in r] == [4] * 7 + [2]


def test_a_run_with_local_steps_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(mpirun, tmp_path):
    """24 inner steps in rounds of 4 with DiLoCo's Nesterov outer step, against 12 steps checkpointed and
    resumed to 24: the outer step's momentum and the round's start parameters survive the checkpoint."""
    common = ["--local-steps", "4", "--model", "mlp", "--seed", "5", "--no-progress", "--threads", "1",
              "--topology", "complete"]
    ck = tmp_path / "ck"
    outs = mpirun.batch(2, [common + ["--iterations", "24", "--save-models", "--log-dir", tmp_path / "whole"],
                            common + ["--iterations", "12", "--checkpoint-dir", ck],
                            common + ["--iterations", "24", "--resume", ck, "--save-models",
                                      "--log-dir", tmp_path / "resumed"]], timeout=180)
    for out in outs:
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    assert len(outs) == 3
    for r in range(2):
        whole = np.load(tmp_path / "whole" / f"params_rank{r}.npy")
        resumed = np.load(tmp_path / "resumed" / f"params_rank{r}.npy")
        np.testing.assert_allclose(resumed, whole, atol=1e-6, rtol=0)
    with open(tmp_path / "resumed" / "rank0.jsonl") as f:
        header = json.loads(f.readline())["run"]
    assert header["local_steps"] == 4 and header.get("resumed_from") == 3      # rounds, not inner steps


def test_a_checkpoint_ending_a_short_last_round_resumes_from_its_inner_step(mpirun, tmp_path):
    """10 inner steps in rounds of 4 end with a round of 2 (its exchange and outer step taken). Resumed to 24,
    round 3 started at inner step 12: 22 mini-batches while the run said 24 (then it was refused). Now the
    rounds go on from inner step 10 -- 10-13, 14-17, 18-21, 22-23, each inner step once -- and the run ends as
    the same rounds resumed in two legs (10 -> 18 -> 24) do, bit for bit. A run of whole rounds (12 steps)
    resumes from its checkpoint as before."""
    common = ["--local-steps", "4", "--model", "mlp", "--seed", "5", "--no-progress", "--threads", "1",
              "--topology", "complete"]
    short, legs, whole = tmp_path / "short", tmp_path / "legs", tmp_path / "whole"
    outs = mpirun.batch(2, [common + ["--iterations", "10", "--checkpoint-dir", short],
                            common + ["--iterations", "24", "--resume", short, "--save-models",
                                      "--log-dir", tmp_path / "once"],
                            common + ["--iterations", "10", "--checkpoint-dir", legs],
                            common + ["--iterations", "18", "--resume", legs],
                            common + ["--iterations", "24", "--resume", legs, "--save-models",
                                      "--log-dir", tmp_path / "twice"],
                            common + ["--iterations", "24", "--resume", legs],
                            common + ["--iterations", "12", "--checkpoint-dir", whole],
                            common + ["--iterations", "16", "--resume", whole],
                            common + ["--iterations", "16", "--checkpoint-dir", whole]], timeout=240)
    assert [o.returncode for o in outs] == [0, 0, 0, 0, 0, 2, 0, 0, 2], \
        [(o.stdout[-800:], o.stderr[-800:]) for o in outs]
    assert "rounds: 7 rounds of 4 local steps (24 inner steps per worker; the iterations above are rounds; " \
        "resumed at round 3 after 10 inner steps" in outs[1].stdout, outs[1].stdout
    with open(tmp_path / "once" / "rank0.jsonl") as f:
        header = json.loads(f.readline())["run"]
        recs = [json.loads(x) for x in f if '"iter"' in x]
    assert header["iterations"] == 7 and header["inner_steps"] == 24 and header["resumed_from"] == 3
    assert [(r["iter"], r["first_step"], r["inner_steps"]) for r in recs] == \
        [(3, 10, 4), (4, 14, 4), (5, 18, 4), (6, 22, 2)]
    with open(short / "rank0" / "manifest.json") as f:
        assert json.load(f)["complete"]["7"]["work"] == 24          # the checkpoint counts them so too
    for r in range(2):
        once = np.load(tmp_path / "once" / f"params_rank{r}.npy")
        twice = np.load(tmp_path / "twice" / f"params_rank{r}.npy")
        np.testing.assert_array_equal(once, twice)
    # the legs' end, resumed with nothing left: said in inner steps
    assert "the checkpoint is at round 7 (24 inner steps), which is --iterations 24 already; raise" \
        in outs[5].stderr, outs[5].stderr
    # a new run into that directory: refused, naming its last checkpoint in rounds (it said "iteration 4")
    assert "holds the checkpoints of another run (up to round 4, 16 inner steps)" in outs[8].stderr
    assert "rounds: 4 rounds of 4 local steps (16 inner steps per worker; the iterations above are rounds)" \
        in outs[7].stdout


def test_a_resume_with_nothing_left_names_the_iterations_the_user_gave(mpirun, tmp_path):
    """--iterations 12 in rounds of 4, resumed with --iterations 12: the line said "the checkpoint is at
    iteration 3, which is --iterations 3 already" -- rounds, where the user gave 12 mini-batches."""
    common = ["--local-steps", "4", "--model", "mlp", "--seed", "5", "--no-progress", "--threads", "1",
              "--topology", "complete"]
    ck = tmp_path / "ck"
    outs = mpirun.batch(2, [common + ["--iterations", "12", "--checkpoint-dir", ck],
                            common + ["--iterations", "12", "--resume", ck]], timeout=180)
    assert [o.returncode for o in outs] == [0, 2], [(o.stdout[-800:], o.stderr[-800:]) for o in outs]
    lines = [x for x in outs[1].stderr.splitlines() if x.startswith("hopdec train: error:")]
    assert len(lines) == 1 and "the checkpoint is at round 3 (12 inner steps), which is --iterations 12 (3 rounds " \
        "of --local-steps 4) already; raise --iterations" in lines[0], outs[1].stderr


def test_a_run_of_local_steps_stopped_by_ctrl_c_says_where_in_rounds_and_inner_steps(mpirun, tmp_path):
    """Ctrl-C to a run of --iterations 40 in rounds of 2 said "stopped at iteration 5 of 20": 20 read as the
    iterations given (40). The line now says the round and the inner steps; the run resumes from it."""
    import signal

    from test_resume_mpi import LOCAL, finish, resume_args, start, stop_lines, wait_for_records
    ck, logs = tmp_path / "ck", tmp_path / "logs"
    args = ["--local-steps", "2", "--model", "mlp", "--no-progress", "--threads", "1", "--topology", "complete",
            "--iterations", "40", "--compute-time", "0.1", "--log-dir", logs, "--checkpoint-dir", ck]
    proc = start(["bash", LOCAL, "-n", 2, *args], mpirun.env())
    wait_for_records(logs, 1, 3, proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = finish(proc)
    lines = stop_lines(err)
    assert proc.returncode == 130 and len(lines) == 1, err
    k = int(lines[0].split("stopped at round ")[1].split()[0])
    assert f"stopped at round {k} of 20 ({2 * k} of 40 inner steps)" in lines[0] and 3 <= k < 20, lines[0]
    n, resume = resume_args(lines[0])
    assert n == 2 and "--resume" in resume
    import shlex
    import subprocess
    out = subprocess.run(shlex.split(lines[0].split("resume with: ", 1)[1]), env=mpirun.env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "rounds: 20 rounds of 2 local steps (40 inner steps" in out.stdout, out.stderr
    with open(logs / "rank0.jsonl") as f:
        iters = [json.loads(x)["iter"] for x in f if '"iter"' in x]
    assert iters == list(range(20))                      # the log continues where the stop left it
