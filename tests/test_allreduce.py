"""--mode allreduce: synchronous data parallelism (what DDP does) as a sans-I/O core, in the simulator and
on real MPI ranks, with checkpoints that resume exactly."""

import io
import json

import numpy as np
import pytest

from hopdec.allreduce import AllReduce, Worker
from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.hop.actions import Enter


def actions_until_wait(core):
    out = []
    while True:
        a = core.next_action()
        out.append(a)
        if isinstance(a, (Wait, Finished)):
            return out


def test_an_iteration_is_compute_then_the_mean_all_reduce_then_apply():
    w = Worker(1, 4, iterations=2)
    assert actions_until_wait(w) == [Enter(0), ComputeGradient(0), AllReduce(0, 0.25), Wait((0, 2, 3), "all-reduce")]
    assert w.next_action() == Wait((0, 2, 3), "all-reduce")          # nothing moves until the reduction ends
    w.on_reduced(0)
    assert actions_until_wait(w)[:4] == [ApplyGradient(0), Enter(1), ComputeGradient(1), AllReduce(1, 0.25)]
    with pytest.raises(ValueError):
        w.on_reduced(0)                                                 # not the one under way
    w.on_reduced(1)
    assert actions_until_wait(w) == [ApplyGradient(1), Finished()]


def test_a_stop_ends_at_the_agreed_cut_and_a_resume_starts_there():
    w = Worker(0, 2, iterations=10)
    actions_until_wait(w)
    assert w.position == 0
    with pytest.raises(ValueError):
        w.stop_at(0)                                                    # must be past every position
    w.stop_at(1)
    w.on_reduced(0)
    assert actions_until_wait(w) == [ApplyGradient(0), Finished()]
    r = Worker(0, 2, iterations=10)
    r.resume_at(1)
    assert actions_until_wait(r)[0] == Enter(1)
    with pytest.raises(ValueError):
        Worker(0, 2, iterations=3).resume_at(3)


def simulate(argv):
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate as run
    return run(parse([str(a) for a in argv]), out=io.StringIO())


def test_every_simulated_worker_goes_at_the_slowest_ones_pace_plus_the_ring():
    """Iteration time = compute + a ring all-reduce of 2(n-1) chunks of B/n, each a latency plus its bytes
    at the NIC's rate; with a slow worker every worker goes at its pace (the ring's steps that do not need
    it overlap its compute, as a real ring's do)."""
    n, mb, bw, lat = 4, 8.0, 1.0, 1e-3                                   # 8 MiB gradients, 1 Gb/s, 1 ms
    base = ["--mode", "allreduce", "-n", n, "--iterations", 20, "--compute-time", 0.1, "--message-mb", mb,
            "--bandwidth", bw, "--latency", lat]
    ring = 2 * (n - 1) * (mb * 2 ** 20 / n / (bw * 1e9 / 8) + lat)
    assert simulate(base)["virtual_s"] == pytest.approx(20 * (0.1 + ring), rel=1e-9)
    res = simulate(base + ["--slowdown", "rank=2,factor=3"])
    assert 20 * (0.3 + ring / 2) < res["virtual_s"] <= 20 * (0.3 + ring)
    rates = {r["rank"]: r["iter_per_s"] for r in res["rows"]}
    assert max(rates.values()) == pytest.approx(min(rates.values()), rel=0.02)
    assert res["max_gap"] == 1


def test_a_simulated_all_reduce_keeps_every_replica_identical(tmp_path):
    simulate(["--mode", "allreduce", "-n", 3, "--iterations", 6, "--model", "mlp", "--math", "--threads", 1,
              "--slowdown", "random:factor=4,prob=0.5", "--save-models", "--log-dir", tmp_path])
    params = [np.load(tmp_path / f"params_rank{r}.npy") for r in range(3)]
    assert not np.array_equal(params[0], np.zeros_like(params[0]))
    for p in params[1:]:
        np.testing.assert_array_equal(params[0], p)


def test_a_stopped_and_resumed_all_reduce_run_ends_where_an_uninterrupted_one_does(mpirun, tmp_path):
    """Checkpoint at iteration 4, resume to 8: the same parameters as 8 iterations in one go (momentum and
    the data position included), with a slow rank."""
    common = ["--mode", "allreduce", "--model", "mlp", "--seed", "3", "--no-progress", "--threads", "1",
              "--slowdown", "rank=1,factor=2",
              "--compute-time", "0.005"]     # >= 5 ms per iteration: every boundary is 1 ms past an evaluation
    ck = tmp_path / "ck"
    outs = mpirun.batch(2, [common + ["--iterations", "8", "--save-models", "--log-dir", tmp_path / "whole",
                                      "--eval-interval", "0.001"],
                            common + ["--iterations", "4", "--checkpoint-dir", ck],
                            common + ["--iterations", "8", "--resume", ck, "--save-models",
                                      "--log-dir", tmp_path / "resumed"]], timeout=120)
    for out in outs:
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    assert len(outs) == 3
    for r in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / "whole" / f"params_rank{r}.npy"),
                                      np.load(tmp_path / "resumed" / f"params_rank{r}.npy"))
    evals = [json.loads(line) for line in open(tmp_path / "whole" / "eval.jsonl")]
    assert sorted({e["iter_min"] for e in evals[:-1]}) == list(range(8))   # every iteration boundary,
    assert evals[-1]["iter_min"] == 8                                       # then the end
    assert evals[-1]["final"] and all(e["eval_s"] > 0 for e in evals[:-1])


def test_a_simulated_all_reduce_evaluates_every_interval(tmp_path):
    res = simulate(["--mode", "allreduce", "-n", 2, "--iterations", 10, "--model", "mlp", "--math", "--threads", 1,
                    "--compute-time", 0.1, "--eval-interval", 0.35, "--log-dir", tmp_path])
    evals = [json.loads(line) for line in open(tmp_path / "eval.jsonl")]
    assert evals == res["evals"] and len(evals) >= 4 and evals[-1]["final"]
    assert evals[-1]["test_loss"] < evals[0]["test_loss"]


def test_the_report_reads_an_all_reduce_run_as_one(tmp_path):
    """The report took an all-reduce run's header mode for a bad field (one per rank, with a note blaming a
    killed rank), described it as "decentralized (None) on None" and filed the wait for the slowest
    worker under "wait (other)"."""
    from hopdec.report.data import Run
    simulate(["--mode", "allreduce", "-n", 4, "--iterations", 12, "--slowdown", "rank=2,factor=3",
              "--log-dir", tmp_path])
    run = Run.load(str(tmp_path))
    assert run.bad_lines == 0 and run.mode == "allreduce"
    assert run.describe() == "synchronous all-reduce (4 workers)"
    parts = run.breakdown()
    fast = parts[0]
    assert "wait (other)" not in fast and fast["wait all-reduce"] > fast["compute"]    # waits for rank 2
    assert parts[2]["wait all-reduce"] < fast["wait all-reduce"]
