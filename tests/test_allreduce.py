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


def _random_ring(seed, closed_form):
    """A seeded random all-reduce simulation: 2-9 workers, NICs and links of their own bandwidth and
    latency (zero latency and infinite bandwidth among them), messages of 0 bytes to 8 MB, unequal and
    varying compute times. Its records, in rank and iteration order, and the simulator."""
    import random

    from hopdec.sim.allreduce import AllReduceSim
    from hopdec.sim.network import LinkModel
    rng = random.Random(seed)
    n = rng.randrange(2, 10)
    links = {(i, (i + 1) % n): (rng.choice([None, 1e6, 2e7]), rng.choice([None, 0.0, 2e-3]))
             for i in range(n) if rng.random() < 0.3}
    model = LinkModel(bandwidth=rng.choice([1e6, 1e8, 1e9, float("inf")]), latency=rng.choice([0.0, 1e-5, 1e-3]),
                      node_bandwidth={i: rng.choice([1e6, 5e7, 1e9]) for i in range(n) if rng.random() < 0.3},
                      links=links)
    comp = [rng.choice([0.01, 0.05, 0.1]) for _ in range(n)]
    vary = rng.random() < 0.5
    recs = []
    sim = AllReduceSim(n, rng.randrange(3, 12), lambda r, i: comp[r] * (1 + (0.3 * ((7 * r + 13 * i) % 5) if vary else 0)),
                       network=model, message_bytes=rng.choice([0.0, 1e3, 1e6, 8e6]),
                       on_record=lambda r, rec: recs.append(dict(rec)), closed_form=closed_form).run()
    return sorted(recs, key=lambda x: (x["rank"], x["iter"])), sim


def test_the_rings_closed_form_gives_the_network_models_times_to_the_bit():
    """With full-duplex NICs the ring's times come from a recursion over its steps (``ring_ends``), not from
    2(n - 1) x n network events per iteration (10 s per iteration at 1024 workers). On 60 random rings --
    slow NICs and links, zero latency, infinite bandwidth, empty messages, stragglers -- every record,
    the virtual time and the largest gap equal the event-by-event network model's exactly."""
    for seed in range(60):
        (by_events, a), (closed, b) = _random_ring(seed, False), _random_ring(seed, True)
        assert not a.closed_form and b.closed_form
        assert by_events == closed, seed
        assert (a.now, a.max_gap, a.net.transfers) == (b.now, b.max_gap, b.net.transfers), seed
        assert b.bytes == pytest.approx(a.bytes, rel=1e-12)     # (one sum per worker, not one per chunk)
        assert b.q.events <= a.q.events
        assert all("waited_on" not in r for r in closed)     # n - 1 pairs in every record


def test_a_simulated_all_reduce_keeps_no_per_iteration_entries_unless_asked():
    """Its gap is measured as it runs, so it keeps no (time, iteration) per worker-iteration: at 10,000 x
    1000 they were 10 million tuples, most of its 1.4 GB peak. A caller that reads rates off them asks."""
    import io

    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate as sim_run
    argv = parse(["--mode", "allreduce", "-n", "3", "--iterations", "5"])
    res = sim_run(argv, out=io.StringIO())
    assert all(s.entries is None for s in res["stats"].values()) and res["max_gap"] == 0
    res = sim_run(argv, out=io.StringIO(), entries=True)
    assert [i for _, i in res["stats"][1].entries] == [0, 1, 2, 3, 4]


def test_the_closed_form_is_taken_with_full_duplex_nics_only():
    from hopdec.sim.allreduce import AllReduceSim
    from hopdec.sim.network import LinkModel
    assert AllReduceSim(4, 2, lambda r, i: 0.1, network=LinkModel(bandwidth=1e9)).closed_form
    assert not AllReduceSim(4, 2, lambda r, i: 0.1, network=LinkModel(bandwidth=1e9, duplex="half")).closed_form


def test_a_simulated_all_reduce_keeps_every_replica_identical(tmp_path):
    simulate(["--mode", "allreduce", "-n", 3, "--iterations", 6, "--model", "mlp", "--math", "--threads", 1,
              "--slowdown", "random:factor=4,prob=0.5", "--save-models", "--log-dir", tmp_path])
    params = [np.load(tmp_path / f"params_rank{r}.npy") for r in range(3)]
    assert not np.array_equal(params[0], np.zeros_like(params[0]))
    for p in params[1:]:
        np.testing.assert_array_equal(params[0], p)


def test_a_stopped_and_resumed_all_reduce_run_ends_where_an_uninterrupted_one_does(mpirun, tmp_path):
    """Checkpoint at iteration 4, resume to 8: the same parameters as 8 iterations in one go (momentum and
    the data position included), with a slow rank; the resumed run's eval.jsonl continues the first one's,
    each iteration evaluated once (before: the first run's final row stayed, and the resumed run's first
    evaluation said iteration 0)."""
    common = ["--mode", "allreduce", "--model", "mlp", "--seed", "3", "--no-progress", "--threads", "1",
              "--slowdown", "rank=1,factor=2",
              "--compute-time", "0.005"]     # >= 5 ms per iteration: every boundary is 1 ms past an evaluation
    ck = tmp_path / "ck"
    outs = mpirun.batch(2, [common + ["--iterations", "8", "--save-models", "--log-dir", tmp_path / "whole",
                                      "--eval-interval", "0.001"],
                            common + ["--iterations", "4", "--checkpoint-dir", ck, "--log-dir", tmp_path / "resumed",
                                      "--eval-interval", "0.001"],
                            common + ["--iterations", "8", "--resume", ck, "--save-models",
                                      "--log-dir", tmp_path / "resumed", "--eval-interval", "0.001"]], timeout=120)
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
    resumed = [json.loads(line) for line in open(tmp_path / "resumed" / "eval.jsonl")]
    assert [(e["iter_min"], e.get("final", False)) for e in resumed] == [(k, k == 8) for k in range(9)], resumed


def test_a_hung_rank_in_an_all_reduce_is_named_by_the_failure_election(mpirun):
    """A collective does not say who is missing: the line said only "the all-reduce of iteration 3 did not
    complete within 4 s". The ranks that time out announce it to each other (the failure election); the
    one that never does is named."""
    out = mpirun(4, ["train", "--no-progress", "--threads", 1, "--mode", "allreduce", "--iterations", 50,
                     "--die-rank", 2, "--die-at", 3, "--die-how", "hang", "--peer-timeout", 4], timeout=120)
    lines = [x for x in out.stderr.splitlines() if x.startswith("hopdec train: error:")]
    assert out.returncode != 0 and len(lines) == 1, out.stderr[-3000:]
    assert "the all-reduce of iteration 3 did not complete within 4 s; a peer may have died or hung (rank(s) 2 " \
           "noticed nothing while the others timed out: stopped or hung there?)" in lines[0], lines[0]


def test_the_iteration_training_starts_at_is_evaluated_once(monkeypatch):
    """``--eval-interval``: the evaluation at the start (iteration k) and the one due at Enter(k) were two
    rows for k when the first Enter came more than an interval after the start (a loaded machine: the
    MPI test above failed so in a full run); Enter evaluates only iterations past the last evaluated."""
    import time

    from hopdec.runtime.allreduce_mpi import Evaluations
    clock = iter(range(1000))
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))      # every reading a second later

    class Trainer:
        def evaluate(self):
            return 1.0, 0.5

    for start in (0, 4):                                                # a fresh run, and a resumed one
        ev = Evaluations(type("Run", (), {"eval_model": "m"})(), Trainer(), 0.001, None)
        ev.start(start)
        for k in range(start, start + 3):
            ev.after(Enter(k))
            ev.after(ComputeGradient(k))
        ev.final(start + 3, 1.0, 0.5)
        assert [(r["iter_min"], r.get("final", False)) for r in ev.records] == \
            [(k, False) for k in range(start, start + 3)] + [(start + 3, True)]


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
