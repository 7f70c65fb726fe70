"""Decentralized training in real ``mpirun`` jobs (4-8 ranks, oversubscribed, with timeouts)."""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from hopdec.ml.data import load_dataset, partition
from hopdec.report.gaps import max_iteration_gap
from hopdec.runtime.metrics import read_log
from hopdec.ml.models import PRESETS
from hopdec.ml.trainer import LocalTrainer
from reference import synchronous_averaging


COMMON = ["train", "--no-progress", "--threads", "1"]


def logs(d):
    files = sorted(glob.glob(os.path.join(d, "rank*.jsonl")), key=lambda p: int(p.split("rank")[-1][:-6]))
    return [read_log(f) for f in files]


def measured_gap(d):
    return int(max_iteration_gap([[(r["time"], r["iter"]) for r in recs] for recs in logs(d)]).max())


CG_ITERS, CG_SEED = 12, 3


@pytest.fixture(scope="module")
def four_rank_runs(mpirun, tmp_path_factory):
    """The default run and the complete-graph runs (both buffer paths) in one ``mpirun -n 4`` job."""
    base = tmp_path_factory.mktemp("four_ranks")
    runs = {"default": ["--iterations", "120"]}
    for buffers in ("no", "yes"):
        runs[f"complete-{buffers}"] = ["--topology", "topologies/complete_4.json", "--iterations", CG_ITERS,
                                       "--seed", CG_SEED, "--save-models", "--cuda-aware-mpi", buffers]
    outs = mpirun.batch(4, [COMMON[1:] + argv + ["--log-dir", base / k] for k, argv in runs.items()])
    return {k: (out, base / k) for k, out in zip(runs, outs)}


def test_default_run_trains_and_summarises(four_rank_runs):
    out, tmp_path = four_rank_runs["default"]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "averaged model: test loss" in out.stdout and "largest iteration gap observed" in out.stdout
    acc = float(out.stdout.split("test accuracy")[1].split()[0])
    assert acc > 0.6                                   # 10 classes: chance is 0.1
    for recs in logs(tmp_path):
        assert [r["iter"] for r in recs] == list(range(120))
        assert {"rank", "iter", "time", "loss", "compute_s", "wait_s", "tokens"} <= set(recs[0])
        first = np.mean([r["loss"] for r in recs[:10]])
        last = np.mean([r["loss"] for r in recs[-10:]])
        assert last < 0.5 * first                      # training loss falls
    # token grants ride in the updates: on this symmetric graph a grant goes as a message of its own
    # only to an out-neighbour the send skipped (known to be past the update); every grant is accounted
    from hopdec.hop.worker import node_views
    from hopdec.topology import default_topology
    for r, view in enumerate(node_views(default_topology(4))):
        with open(tmp_path / f"rank{r}.jsonl") as f:
            sent = [e for e in map(__import__("json").loads, f) if e.get("event") == "messages"]
        assert len(sent) == 1, sent
        m, skipped = sent[0], sum(x["send_skipped"] for x in logs(tmp_path)[r])
        assert m["grants_carried"] + m["grant_messages"] == 119 * len(view.in_neighbors)
        assert m["grant_messages"] == skipped and m["grants_carried"] > 100
        assert m["updates"] == 120 * len(view.out_neighbors) - skipped


@pytest.mark.parametrize("buffers", ["no", "yes"])
def test_complete_graph_equals_synchronous_averaging(four_rank_runs, buffers):
    """``--cuda-aware-mpi yes`` on CPU runs the device-buffer path (torch tensors handed to MPI)."""
    n, iters, seed = 4, CG_ITERS, CG_SEED
    out, tmp_path = four_rank_runs[f"complete-{buffers}"]
    assert out.returncode == 0, out.stdout + out.stderr
    header = __import__("json").loads(open(tmp_path / "rank0.jsonl").readline())["run"]
    assert header["mpi_buffers"] == {"no": "host", "yes": "device"}[buffers]
    ds = load_dataset("digits", seed=seed)
    h = PRESETS["cnn"]
    ref = [LocalTrainer("cnn", ds, partition(ds.train_y, n, r, "iid", seed), lr=h["lr"],
                        momentum=h["momentum"], weight_decay=h["weight_decay"], batch_size=h["batch_size"],
                        seed=seed, data_seed=seed * 7919 + r) for r in range(n)]
    synchronous_averaging(ref, iters)
    for r in range(n):
        got = np.load(tmp_path / f"params_rank{r}.npy")
        np.testing.assert_allclose(got, ref[r].flat.detach().numpy(), atol=1e-6, rtol=0)
    # and the run really was a run of workers that differ: their gradients came from different shards
    assert not np.allclose(ref[0].flat.grad.numpy(), ref[1].flat.grad.numpy())


SETTINGS = {
    "standard": ([], "standard+tokens"),
    "staleness": (["--staleness", "2"], "staleness+tokens"),
    "backup": (["--backup-workers", "1"], "backup+tokens"),
    "hybrid": (["--backup-workers", "1", "--staleness", "1"], "hybrid+tokens"),
}


@pytest.fixture(scope="module")
def ring6(tmp_path_factory):
    path = tmp_path_factory.mktemp("topo") / "ring_6.json"
    out = subprocess.run([sys.executable, "-m", "hopdec.cli", "topo", "generate", "ring", "-n", "6",
                          "-o", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return str(path)


SLOWDOWNS = ["random:factor=6,prob=1/n", "rank=2,factor=4"]
PROTOCOLS = ["queue-only", "notify-ack", "serial"]


@pytest.fixture(scope="module")
def ring6_runs(mpirun, ring6, tmp_path_factory):
    """Every ring-of-6 run below, in one ``mpirun -n 6`` job (:meth:`MPIRun.batch`): each setting under
    each slowdown, and the other protocols. ``{name: (CompletedProcess, log dir)}``."""
    base = tmp_path_factory.mktemp("ring6_runs")
    runs = {}
    for setting, (extra, _) in SETTINGS.items():
        for slowdown in SLOWDOWNS:
            runs[(setting, slowdown)] = ["--topology", ring6, "--iterations", 20, "--max-ig", 2,
                                         "--compute-time", "0.01", "--slowdown", slowdown] + extra
    for protocol in PROTOCOLS:
        how = ["--compute-graph", "serial"] if protocol == "serial" else ["--protocol", protocol]
        runs[protocol] = ["--topology", ring6, "--iterations", 20] + how + [
            "--compute-time", "0.01", "--slowdown", "random:factor=6,prob=1/n"]
    dirs = {k: base / f"run{i}" for i, k in enumerate(runs)}
    argvs = [COMMON[1:] + argv + ["--log-dir", dirs[k]] for k, argv in runs.items()]
    outs = mpirun.batch(6, argvs, timeout=400)
    return {k: (out, dirs[k]) for k, out in zip(runs, outs)}


@pytest.mark.parametrize("slowdown", SLOWDOWNS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_measured_gap_never_exceeds_the_analyzed_bound(mpirun, ring6, ring6_runs, setting, slowdown):
    extra, key = SETTINGS[setting]
    out, log_dir = ring6_runs[(setting, slowdown)]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "EMULATED" in out.stdout
    bound = mpirun.topo_bounds(ring6, max_ig=2, staleness=2 if setting == "staleness" else 1)[key]
    gap = measured_gap(log_dir)
    assert gap <= bound, (gap, bound)
    if setting != "standard":
        assert gap >= 1                                # slowdowns did open a gap


def test_the_straggler_jumps_on_a_directed_graph_without_deadlock(mpirun, tmp_path):
    """Issue 8's reproduction: exponential(7) has disjoint in- and out-neighbours; before the fix the 20x
    straggler sat in Recv(target - 1) while its in-neighbours waited for its tokens (about one run in
    two of 100 iterations ended in a peer timeout; the in-process property tests of
    test_protocol_directed.py find it on every such graph). Only the straggler jumps, and the gap stays bounded."""
    out = mpirun(7, COMMON + ["--topology", "exponential", "--iterations", 50, "--max-ig", 2,
                              "--backup-workers", 2, "--skip", "max-jump=20,trigger=1",
                              "--slowdown", "rank=0,factor=20", "--compute-time", "0.01",
                              "--peer-timeout", 15, "--log-dir", tmp_path], timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    recs = logs(tmp_path)
    jumps = [r for r in recs[0] if "jumped_from" in r]
    assert len(jumps) > 5 and all(2 <= r["iter"] - r["jumped_from"] <= 20 for r in jumps)
    others = [r for rs in recs[1:] for r in rs if "jumped_from" in r]
    assert len(others) * 3 < len(jumps)              # the straggler jumps (others only when the load
    #                                                  of a shared machine makes one fall behind)
    assert all(rs[-1]["iter"] == 49 for rs in recs)
    assert measured_gap(tmp_path) <= float(out.stdout.split("bound from the topology: ")[1].split(")")[0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_other_protocols_run_within_their_bounds(mpirun, ring6, ring6_runs, protocol):
    out, log_dir = ring6_runs[protocol]
    assert out.returncode == 0, out.stdout + out.stderr
    key = {"notify-ack": "notify-ack", "queue-only": "standard"}.get(protocol, "standard+tokens")
    assert measured_gap(log_dir) <= mpirun.topo_bounds(ring6)[key]


def test_a_hung_rank_times_out_its_neighbours(mpirun):
    out = mpirun(4, COMMON + ["--topology", "ring", "--iterations", 200, "--die-rank", 2, "--die-at", 5,
                              "--die-how", "hang",
                              "--peer-timeout", 4], timeout=120)
    assert out.returncode != 0
    # the line names the hung rank, whether its in-neighbour timed out in a receive or a send to it
    assert re.search(r"(from|to) rank\(s\) 2\)? for 4 s; a peer may have died or hung", out.stderr), out.stderr


BAD_INPUT = [
    (["--topology", "topologies/ring_based_8.json"], "has 8 workers but the run has 4 ranks"),
    (["--protocol", "queue-only", "--backup-workers", "1"], "--backup-workers 1 needs --protocol tokens"),
    (["--backup-workers", "3"], "--backup-workers 3: node 0 has 3 in-neighbour(s)"),
    (["--slowdown", "rank=9,factor=4"], "rank=9"),
    (["--topology", "does/not/exist.json"], "does/not/exist.json"),
    (["--skip", "max-jump=3", "--protocol", "notify-ack"], "--skip needs --protocol tokens"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option (see hopdec train --help)"),
    (["--mode", "decentralized", "--sync", "ssp"], "--sync ssp is a parameter-server option"),
]


@pytest.fixture(scope="module")
def bad_input_runs(mpirun):
    """Every bad input below in one ``mpirun -n 4`` job: a refused run returns 2 on every rank and the
    next one starts (:meth:`MPIRun.batch`), so a rank left behind would hang the job."""
    return mpirun.batch(4, [COMMON[1:] + ["--iterations", 5] + args for args, _ in BAD_INPUT], timeout=240)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[a[0] for a, _ in BAD_INPUT])
def test_bad_input_fails_on_every_rank_before_training(bad_input_runs, case):
    """Every rank finds the problem; the user reads it once, and no rank starts training."""
    out, msg = bad_input_runs[case], BAD_INPUT[case][1]
    assert out.returncode == 2
    lines = [l for l in out.stderr.splitlines() if l.startswith("hopdec train: error:")]
    assert len(lines) == 1 and msg in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "usage:" not in out.stderr
    assert "averaged model" not in out.stdout


def test_svm_on_a_libsvm_file_and_vgg11_on_cifar_batches(mpirun, tmp_path):
    """The non-default data paths end to end, on tiny files written here (nothing is downloaded)."""
    import pickle
    rng = np.random.default_rng(0)
    lines = []
    for i in range(200):
        label = 1 if i % 2 else -1
        feats = {j: float(rng.normal() + (0.8 * label if j < 3 else 0)) for j in range(1, 11)}
        lines.append(f"{label} " + " ".join(f"{j}:{v:.4f}" for j, v in feats.items()))
    svm = tmp_path / "tiny.svm"
    svm.write_text("\n".join(lines) + "\n")
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(cifar / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
                         b"labels": [int(v) for v in rng.integers(0, 10, 8)]}, f)
    svm_out, out = mpirun.batch(2, [
        COMMON[1:] + ["--dataset", "libsvm", "--data-path", svm, "--iterations", 30, "--batch-size", 16,
                      "--lr", 0.5, "--log-dir", tmp_path / "svm"],
        COMMON[1:] + ["--dataset", "cifar10", "--data-dir", tmp_path, "--iterations", 2, "--batch-size", 4,
                      "--log-dir", tmp_path / "vgg"]])
    assert svm_out.returncode == 0, svm_out.stdout + svm_out.stderr
    assert float(svm_out.stdout.split("test accuracy")[1].split()[0]) > 0.7      # 2 classes: chance 0.5
    assert read_log(tmp_path / "svm" / "rank0.jsonl")[0]["loss"] > 0
    assert out.returncode == 0, out.stdout + out.stderr
    header = __import__("json").loads(open(tmp_path / "vgg" / "rank0.jsonl").readline())["run"]
    assert header["model"] == "vgg11" and header["params"] > 9_000_000


def test_one_weight_rule_under_mpirun(mpirun, tmp_path):
    """train reads weights as analyze does: the same notes, once; a graph that cannot mix is refused."""
    renorm = tmp_path / "renorm.txt"          # columns sum to 4, 3, 2; edge 2->1 has weight 0
    renorm.write_text("0 1 2\n1 0 2\n0 0 2\n1 1 1\n1 2 1\n2 1 0\n2 0 1\n0 2 1\n2 2 0\n")
    out = mpirun(3, COMMON + ["--topology", renorm, "--iterations", 5], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    warnings = [ln for ln in out.stderr.splitlines() if ln.startswith("hopdec train: warning:")]
    assert len(warnings) == 2, out.stderr
    assert "do not sum to 1" in warnings[1] and "1 edge(s) of weight 0" in warnings[0]
    allzero = tmp_path / "allzero.txt"        # weight 0 is no edge: nobody averages with anybody
    allzero.write_text("0 1 0\n1 0 0\n0 0 1\n1 1 1\n")
    out = mpirun(2, COMMON + ["--topology", allzero, "--iterations", 5], timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "node 0 hears from no other worker" in out.stderr
