"""Hop against PyTorch DDP on the transformer language model, 4 ranks, with and without stragglers.

One training loop (:func:`train`, below) runs under ``mpirun`` either with ``torch.nn.parallel.
DistributedDataParallel`` (gloo) and ``torch.optim.AdamW``, or with ``hopdec.optim.HopOptimizer``
wrapping the same AdamW (no mechanism, backup workers, staleness, iteration skipping): the same model (the
kjv transformer of ``hopdec train --dataset kjv --model transformer``, made smaller by
``--dim/--layers/--seq-len`` so that 4 ranks run on 2 shared cores), the same data shards, batch size,
seed, warmup + cosine schedule (set from the iteration each step), clipping, and the same launcher. The
driver starts ONE ``mpirun`` job that runs every (condition, row) pair interleaved, repeat after repeat
(the ranks start once), then evaluates the snapshots offline and prints the table::

    python3 experiments/ddp_compare.py --quick                       # smoke: seconds per run
    python3 experiments/ddp_compare.py --steps 200 --repeats 3 --out ddp-out

Conditions (emulated: a slowed step sleeps ``factor - 1`` times the compute time measured by a
calibration job, between forward and backward, i.e. before DDP's all-reduce; the same sleep in every run):
``none``; ``straggler``: rank 3 slowed on every step; ``random``: each rank's step slowed with probability
``--random-prob``, drawn once from ``--seed`` (the same schedule for every row).

Measured: steps/s (iterations the whole job completed per second: the slowest rank's arrival at
``--steps``), time to ``--target`` validation loss, and the validation loss at equal iterations. The
validation loss at iteration k is that of the consensus model for Hop (the mean of the 4 workers'
parameters at iteration k, available once the last worker reached k; a jump past k counts with the
parameters it landed on) and of DDP's model (identical on every rank). Parameters are snapshotted every
``--eval-every`` iterations into memory (a copy, microseconds) and evaluated after the run, off the clock.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CONDITIONS = ("none", "straggler", "random")

# The rows: the optimizer and its mechanisms (HopOptimizer keywords). ``ddp`` is PyTorch's
# DistributedDataParallel; ``allreduce`` is ``hopdec train --mode allreduce`` where that mode exists.
ROWS = {
    "ddp": None,
    "hop": {},
    "hop-backup": {"backup_workers": 1},
    "hop-backup-ig4": {"backup_workers": 1, "max_ig": 4},      # Hop sec. 7's max_ig for these mechanisms
    "hop-stale": {"max_ig": 4, "staleness": 5},
    "hop-skip": {"backup_workers": 1, "max_ig": 4, "skip": "max-jump=4,trigger=2"},
    "hop-skip-stale": {"staleness": 5, "max_ig": 4, "skip": "max-jump=4,trigger=2"},
    "allreduce": None,
}
DEFAULT_ROWS = "ddp,hop,hop-backup,hop-backup-ig4,hop-stale,hop-skip"   # allreduce: added where `hopdec train` has it
HOP_TOPOLOGY = "ring-based"                    # hopdec's default for 4 workers


# --------------------------------------------------------------------------------------- arguments
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 24 steps, rows ddp and hop, condition none, 1 repeat")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200, help="iterations per run (the schedule's length)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every (condition, row)")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated subset of "
                   + ", ".join(CONDITIONS))
    p.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated subset of " + ", ".join(ROWS))
    p.add_argument("--with-allreduce", choices=("auto", "yes", "no"), default="auto",
                   help="add a row of `hopdec train --mode allreduce` (auto: when `hopdec train --help` "
                        "offers it)")
    p.add_argument("--factor", type=float, default=3.0, help="a slowed step takes FACTOR x its compute")
    p.add_argument("--slow-rank", type=int, default=3, help="the persistent straggler")
    p.add_argument("--random-prob", type=float, default=0.25,
                   help="condition random: probability that a rank's step is slowed")
    p.add_argument("--compute-time", type=float, default=None,
                   help="seconds of compute per step to scale the sleep by (default: measured by a "
                        "calibration job)")
    p.add_argument("--target", type=float, default=None,
                   help="target validation loss (default: DDP's median loss at 3/4 of the steps without "
                        "stragglers)")
    p.add_argument("--eval-every", type=int, default=None, help="snapshot every N iterations (default "
                   "steps/20)")
    p.add_argument("--val-windows", type=int, default=256, help="validation windows evaluated (evenly "
                   "spaced over the validation split)")
    # the model and recipe (the kjv transformer preset, smaller)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the mpirun job is killed")
    p.add_argument("--out", default=None, help="folder for results.json and table.md (default: a temporary "
                   "folder, removed)")
    p.add_argument("--job", metavar="PLAN", default=None, help=argparse.SUPPRESS)   # under mpirun
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.repeats = min(a.steps, 24), 1
        if a.conditions == ",".join(CONDITIONS):
            a.conditions = "none"
        if a.rows == DEFAULT_ROWS:
            a.rows = "ddp,hop"
    a.conditions = [c for c in a.conditions.split(",") if c]
    a.rows = [r for r in a.rows.split(",") if r]
    if a.quick and a.with_allreduce == "auto":
        a.with_allreduce = "no"
    bad = [c for c in a.conditions if c not in CONDITIONS] + [r for r in a.rows if r not in ROWS]
    if bad:
        p.error(f"unknown condition or row: {', '.join(bad)}")
    if "ddp" not in a.rows:
        p.error("--rows: ratios are against ddp; include it")
    if a.steps < 4 or a.repeats < 1 or a.ranks < 2:
        p.error("--steps >= 4, --repeats >= 1, --ranks >= 2")
    if not 0 <= a.slow_rank < a.ranks:
        p.error(f"--slow-rank {a.slow_rank}: not a rank of {a.ranks}")
    if not 0 <= a.random_prob <= 1 or a.factor < 1:
        p.error("--random-prob in [0, 1], --factor >= 1")
    a.eval_every = a.eval_every or max(1, a.steps // 20)
    return a


def slowdown_schedule(condition, ranks, steps, slow_rank=3, prob=0.25, seed=0):
    """Which (rank, step) is slowed: a bool array [ranks, steps]; step = the rank's own gradient step."""
    slow = np.zeros((ranks, steps), dtype=bool)
    if condition == "straggler":
        slow[slow_rank] = True
    elif condition == "random":
        slow = np.random.default_rng(10007 + seed).random((ranks, steps)) < prob
    elif condition != "none":
        raise ValueError(f"unknown condition {condition!r}")
    return slow


def lr_factor(k, steps):
    """The kjv preset's schedule (``hopdec train``): linear warmup over 5% (at least 10), cosine to 10%."""
    from hopdec.ml.models import PRESETS
    h = PRESETS["transformer"]
    warmup = max(min(h["warmup_min"], steps), int(h["warmup"] * steps))
    if k < warmup:
        return (k + 1) / warmup
    t = min(1.0, (k - warmup) / max(1, steps - warmup))
    return h["min_lr_ratio"] + (1 - h["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * t))


def build_model(a):
    from hopdec.ml.models import TransformerLM
    return TransformerLM(256, a.seq_len, a.dim, a.layers, a.heads)


def param_groups(model):
    """The GPT recipe as ``lm_loop.py``: weight decay 0.1 on matrices, none on biases and norms."""
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def make_model(input_shape, num_classes):
    """``hopdec train --model ddp_compare.py:make_model`` (the allreduce row): this script's transformer,
    its size from ``DDP_COMPARE_MODEL`` (dim,layers,heads), which the job sets."""
    from hopdec.ml.models import TransformerLM
    dim, layers, heads = (int(x) for x in os.environ.get("DDP_COMPARE_MODEL", "64,2,4").split(","))
    # vocabulary 256 (bytes) as the other rows, whatever num_classes was inferred from the targets (123)
    return TransformerLM(256, input_shape[0], dim, layers, heads)


def make_data(seed=0):
    """``hopdec train --dataset ddp_compare.py:make_data``: the kjv windows of ``DDP_COMPARE_SEQ`` bytes, as
    plain tensors (what the factory contract names; 2 x 33 MB at 32 bytes)."""
    import torch
    from hopdec.ml.text import load_text
    d = load_text("kjv", int(os.environ.get("DDP_COMPARE_SEQ", "32")))
    train, test = torch.arange(len(d.train_y)), torch.arange(len(d.test_y))
    return d.train_x[train], d.train_y[train], d.test_x[test], d.test_y[test]


# --------------------------------------------------------------------------------------- the job
def job(a):
    """Every rank of the one mpirun job: calibrate the compute time, then each run of the plan ``a.job`` in order
    (interleaved by the driver), each writing run_dir/rank{r}.npz. One job: the ranks start once."""
    import torch
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    with open(a.job) as f:
        plan = json.load(f)
    w = torch.zeros(1, requires_grad=True)                     # torch.optim's first step imports dynamo
    w.grad = torch.zeros(1)
    torch.optim.AdamW([w]).step()
    compute = plan["compute_time"]
    if compute is None:
        compute = calibrate(a, comm)
    sleep = (a.factor - 1) * compute
    if comm.Get_rank() == 0:
        with open(os.path.join(os.path.dirname(a.job), "calibrate.json"), "w") as f:
            json.dump({"compute_time": compute, "sleep": sleep}, f)
        print(f"compute time per step ({comm.Get_size()} ranks at once): {compute * 1e3:.1f} ms; a slowed "
              f"step sleeps {sleep * 1e3:.1f} ms (emulated {a.factor:g}x)", flush=True)
    if any(r["row"] == "ddp" for r in plan["runs"]):
        import torch.distributed as dist
        port = comm.bcast(_free_port() if comm.Get_rank() == 0 else None)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                                world_size=comm.Get_size())
    for r in plan["runs"]:
        t = time.time()
        if r["row"] == "allreduce":
            train_allreduce(a, r["condition"], r["dir"], comm)
        else:
            train(a, r["row"], r["condition"], sleep, r["dir"], comm)
        comm.Barrier()
        if comm.Get_rank() == 0:
            print(f"  ran {r['dir']} in {time.time() - t:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    if any(r["row"] == "ddp" for r in plan["runs"]):
        torch.distributed.destroy_process_group()


def calibrate(a, comm):
    """Median compute time of a step (forward, backward, clipping, AdamW) with every rank computing at once:
    what a slowed step's sleep is scaled by."""
    import torch
    from hopdec.ml.models import PRESETS, LMLoss
    model, stream = _model_and_data(a, comm)
    opt, crit, times = torch.optim.AdamW(param_groups(model), lr=a.lr), LMLoss(), []
    for i in range(13):
        xb, yb = next(stream)
        t = time.perf_counter()
        opt.zero_grad()
        crit(model(xb), yb).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), PRESETS["transformer"]["clip"])
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(comm.allgather(statistics.median(times[3:])))


def _model_and_data(a, comm):
    import torch
    from hopdec.ml.data import batches, partition
    from hopdec.ml.text import load_text
    data = load_text("kjv", a.seq_len)
    torch.manual_seed(a.seed)                                  # the same initial model on every rank
    model = build_model(a)
    rank, size = comm.Get_rank(), comm.Get_size()
    stream = batches(data.train_x, data.train_y, partition(data.train_y, size, rank, "iid", a.seed),
                     a.batch_size, seed=a.seed * 7919 + rank)
    return model, stream


def train(a, row, condition, sleep, run_dir, comm):
    """One run on this rank: ``a.steps`` iterations of the same loop under DDP or HopOptimizer."""
    import torch
    from mpi4py import MPI
    from hopdec.ml.models import PRESETS, LMLoss
    h = PRESETS["transformer"]
    rank, size = comm.Get_rank(), comm.Get_size()
    model, stream = _model_and_data(a, comm)
    criterion = LMLoss()
    hop = row != "ddp"
    betas = (h["momentum"], h["beta2"])
    if hop:
        from hopdec.optim import HopOptimizer
        net = model
        opt = HopOptimizer(param_groups(model), torch.optim.AdamW, model=model, lr=a.lr, betas=betas,
                           topology=HOP_TOPOLOGY, steps=a.steps, peer_timeout=120, **ROWS[row])
    else:
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(param_groups(model), lr=a.lr, betas=betas)
    slow = slowdown_schedule(condition, size, a.steps, a.slow_rank, a.random_prob, a.seed)[rank]

    iters, times, snaps = [], [], []
    step = iteration = slept = in_step = 0
    nxt = a.eval_every
    comm.Barrier()
    t0 = comm.allreduce(time.time(), op=MPI.MAX)
    cpu0 = time.process_time()
    while iteration < a.steps:
        xb, yb = next(stream)
        for g in opt.param_groups:
            g["lr"] = a.lr * lr_factor(iteration, a.steps)
        opt.zero_grad()
        loss = criterion(net(xb), yb)
        if step < len(slow) and slow[step]:                    # emulated: after forward, before backward
            time.sleep(sleep)                                  # (DDP's all-reduce runs in backward)
            slept += sleep
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), h["clip"])
        t = time.perf_counter()
        if hop:
            opt.step(loss=loss)
        else:
            opt.step()
        in_step += time.perf_counter() - t
        step += 1
        iteration = opt.iteration if hop else step
        while nxt <= min(iteration, a.steps):                  # a jump may pass several multiples
            iters.append(nxt)
            times.append(time.time() - t0)
            snaps.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy())
            nxt += a.eval_every
    t_end = time.time() - t0
    cpu = time.process_time() - cpu0
    jumps = len(opt.jumps) if hop else 0
    if hop:
        opt.finish()
    np.savez(os.path.join(run_dir, f"rank{rank}.npz"), iters=np.array(iters), times=np.array(times),
             params=np.stack(snaps), steps=step, jumps=jumps, t_end=t_end, slept=slept, cpu=cpu, in_step=in_step)


def train_allreduce(a, condition, run_dir, comm):
    """The allreduce row: ``hopdec train --mode allreduce`` in this job (its own loop, logs, slowdown
    emulation and recipe for a model of one's own), on this script's model and data by factories."""
    from hopdec.cli.train import main as hopdec_train
    os.environ["DDP_COMPARE_MODEL"] = f"{a.dim},{a.layers},{a.heads}"
    os.environ["DDP_COMPARE_SEQ"] = str(a.seq_len)
    me = os.path.abspath(__file__)
    slowdown = {"none": [], "straggler": ["--slowdown", f"rank={a.slow_rank},factor={a.factor:g}"],
                "random": ["--slowdown", f"random:factor={a.factor:g},prob={a.random_prob:g}"]}[condition]
    rc = hopdec_train(["--mode", "allreduce", "--model", f"{me}:make_model", "--dataset", f"{me}:make_data",
                       "--iterations", str(a.steps), "--batch-size", str(a.batch_size), "--seed", str(a.seed),
                       "--log-dir", run_dir, "--save-models", "--no-progress"] + slowdown)
    if rc:
        raise RuntimeError(f"hopdec train --mode allreduce exited {rc}")


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------- the driver
def mpirun_cmd(a, plan):
    """The launcher line of the job: the same script, model and data for every row."""
    model = ["--ranks", a.ranks, "--seq-len", a.seq_len, "--dim", a.dim, "--layers", a.layers,
             "--heads", a.heads, "--batch-size", a.batch_size, "--lr", a.lr, "--seed", a.seed,
             "--steps", a.steps, "--eval-every", a.eval_every, "--factor", a.factor,
             "--slow-rank", a.slow_rank, "--random-prob", a.random_prob]
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(a.ranks), sys.executable,
            os.path.abspath(__file__), "--job", plan] + [str(x) for x in model]


def run_env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def launch(cmd, timeout):
    """Run the mpirun job in its own session (its output goes to ours); kill the whole group past
    ``timeout``."""
    import signal
    proc = subprocess.Popen(cmd, env=run_env(), start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise SystemExit(f"ddp_compare: the mpirun job ran past {timeout:.0f} s; killed")
    except BaseException:                      # Ctrl-C: the job runs in a session of its own; end it too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if rc != 0:
        raise SystemExit(f"ddp_compare: the mpirun job failed (exit {rc}): {' '.join(map(str, cmd))}")


def allreduce_available():
    """Whether ``hopdec train`` offers ``--mode allreduce`` (the modes branch adds it)."""
    out = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", "--help"], env=run_env(),
                         capture_output=True, text=True, timeout=120)
    return "allreduce" in out.stdout


class Evaluator:
    """Validation loss of a parameter vector (the model rebuilt from the script's config)."""

    def __init__(self, a):
        import torch
        from hopdec.ml.models import LMLoss
        from hopdec.ml.text import load_text
        torch.set_num_threads(1)
        data = load_text("kjv", a.seq_len)
        n = len(data.test_y)
        pick = torch.linspace(0, n - 1, min(a.val_windows, n)).long()
        self.x, self.y = data.test_x[pick], data.test_y[pick]
        self.model, self.crit = build_model(a), LMLoss()

    def __call__(self, vec):
        import torch
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(torch.from_numpy(vec), self.model.parameters())
            total = 0.0
            for s in range(0, len(self.y), 256):
                x, y = self.x[s:s + 256], self.y[s:s + 256]
                total += float(self.crit(self.model(x), y)) * y.numel()
            return total / self.y.numel()


def collect_allreduce(run_dir, ranks, steps, evaluate):
    """The allreduce row's figures from ``hopdec train``'s logs: iteration times, the final model."""
    from hopdec.runtime.metrics import read_log
    logs = [read_log(os.path.join(run_dir, f"rank{r}.jsonl")) for r in range(ranks)]
    t0 = min(recs[0]["time"] for recs in logs)
    t_end = max(recs[-1]["time"] for recs in logs) - t0
    final = np.load(os.path.join(run_dir, "params_rank0.npy"), allow_pickle=False).astype(np.float32)
    return {"iters": [steps], "times": [t_end], "loss": [evaluate(final)], "t_end": t_end,
            "steps": [len(recs) for recs in logs], "jumps": [0] * ranks, "slept": [0.0] * ranks,
            "cpu": [0.0] * ranks, "in_step": [0.0] * ranks}


def collect(run_dir, ranks, evaluate):
    """One run's figures from its ranks' files: consensus losses and when each became available."""
    per = []
    for r in range(ranks):
        with np.load(os.path.join(run_dir, f"rank{r}.npz"), allow_pickle=False) as z:
            per.append({k: z[k] for k in z.files})
    iters = per[0]["iters"]
    for p in per:
        assert np.array_equal(p["iters"], iters), "ranks snapshotted different iterations"
    params = np.mean([p["params"] for p in per], axis=0)
    avail = np.max([p["times"] for p in per], axis=0)
    return {"iters": iters.tolist(), "times": avail.tolist(), "loss": [evaluate(v) for v in params],
            "t_end": max(float(p["t_end"]) for p in per),
            "steps": [int(p["steps"]) for p in per], "jumps": [int(p["jumps"]) for p in per],
            "slept": [float(p["slept"]) for p in per], "cpu": [float(p["cpu"]) for p in per],
            "in_step": [float(p["in_step"]) for p in per]}


def time_to(run, target):
    """Seconds until the first snapshot with validation loss <= target (None: not reached)."""
    for t, loss in zip(run["times"], run["loss"]):
        if loss <= target:
            return t
    return None


def default_target(runs, steps):
    """DDP's median validation loss at 3/4 of the steps, no stragglers (every DDP run then reaches it)."""
    vals = []
    for r in runs:
        if r["row"] == "ddp" and r["condition"] == "none":
            k = min(range(len(r["iters"])), key=lambda i: abs(r["iters"][i] - 0.75 * steps))
            vals.append(r["loss"][k])
    if not vals:
        vals = [min(r["loss"][-1] for r in runs if r["row"] == "ddp")]
    return statistics.median(vals)


def summarize(runs, target, steps):
    """Rows of the table: per (condition, row), medians over repeats and per-repeat ratios against the DDP
    run of the same repeat and condition (interleaved neighbours)."""
    by = {(r["condition"], r["row"], r["repeat"]): r for r in runs}
    out = []
    conditions = [c for c in CONDITIONS if any(r["condition"] == c for r in runs)]
    rows = list(dict.fromkeys(r["row"] for r in runs))
    for c in conditions:
        for row in rows:
            mine = sorted((r for r in runs if r["condition"] == c and r["row"] == row), key=lambda r: r["repeat"])
            if not mine:
                continue
            sps, tt, loss, sp_ratio, tt_ratio = [], [], [], [], []
            for r in mine:
                s = steps / r["t_end"]
                sps.append(s)
                t = time_to(r, target)
                tt.append(t)
                loss.append(r["loss"][-1])
                d = by.get((c, "ddp", r["repeat"]))
                if d is not None:
                    sp_ratio.append(s / (steps / d["t_end"]))
                    td = time_to(d, target)
                    if t is not None and td is not None:
                        tt_ratio.append(td / t)
            reached = [t for t in tt if t is not None]
            out.append({
                "condition": c, "row": row, "runs": len(mine),
                "steps_per_s": statistics.median(sps),
                "steps_ratio": statistics.median(sp_ratio) if sp_ratio else None,
                "time_to_target": statistics.median(reached) if reached else None,
                "reached": len(reached),
                "speedup_to_target": statistics.median(tt_ratio) if tt_ratio else None,
                "loss_at_steps": statistics.median(loss),
                "loss_half": statistics.median(r["loss"][len(r["loss"]) // 2 - 1] for r in mine)
                if len(mine[0]["loss"]) > 1 else None,
                "slow_rank_steps": statistics.median(r["steps"][-1] for r in mine)
                if mine[0].get("steps") else None,
                "jumps": statistics.median(sum(r["jumps"]) for r in mine) if mine[0].get("jumps") else 0,
            })
    return out


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def table(summary, target, steps, slow_rank=3):
    """The markdown table of :func:`summarize`'s rows."""
    lines = [f"| condition | row | steps/s | vs DDP | time to loss {target:.3f} (s) | speed-up vs DDP | "
             f"val. loss at {steps // 2} | at {steps} | rank {slow_rank}'s gradient steps | jumps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        tt = _f(s["time_to_target"], ".1f") + ("" if s["reached"] == s["runs"] else
                                                f" ({s['reached']}/{s['runs']} reached)")
        lines.append(f"| {s['condition']} | {s['row']} | {s['steps_per_s']:.2f} | {_f(s['steps_ratio'], '.2f')}x"
                     f" | {tt} | {_f(s['speedup_to_target'], '.2f')}x | {_f(s['loss_half'], '.3f')} | "
                     f"{s['loss_at_steps']:.3f} | {_f(s['slow_rank_steps'], '.0f')} | {s['jumps']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(argv)
    if a.job is not None:
        return job(a)
    want = "allreduce" in a.rows or a.with_allreduce == "yes"
    if want or a.with_allreduce == "auto":
        have = allreduce_available()
        if want and not have:
            print("ddp_compare: the allreduce row: this hopdec's `hopdec train` has no --mode allreduce",
                  file=sys.stderr)
            return 2
        if have and "allreduce" not in a.rows:
            a.rows.append("allreduce")
    out = a.out or tempfile.mkdtemp(prefix="ddp_compare-")
    os.makedirs(out, exist_ok=True)
    try:
        return _drive(a, out)
    finally:
        if a.out is None:
            shutil.rmtree(out, ignore_errors=True)


def run_plan(a, out):
    """The runs in the order they run: repeat after repeat, condition after condition, every row once,
    the rows' order rotated each repeat (no row always first after a condition change)."""
    runs = []
    for rep in range(a.repeats):
        for c in a.conditions:
            k = rep % len(a.rows)
            for row in a.rows[k:] + a.rows[:k]:
                runs.append({"condition": c, "row": row, "repeat": rep,
                             "dir": os.path.join(out, f"{c}-{row}-{rep}")})
    return runs


def _drive(a, out):
    load = [os.getloadavg()]
    runs = run_plan(a, out)
    for r in runs:
        os.makedirs(r["dir"], exist_ok=True)
    plan = os.path.join(out, "plan.json")
    with open(plan, "w") as f:
        json.dump({"compute_time": a.compute_time, "runs": runs}, f)
    t = time.time()
    launch(mpirun_cmd(a, plan), a.timeout)
    wall = time.time() - t
    load.append(os.getloadavg())
    with open(os.path.join(out, "calibrate.json")) as f:
        cal = json.load(f)
    compute, sleep = cal["compute_time"], cal["sleep"]
    evaluate = Evaluator(a)
    for r in runs:
        d = r.pop("dir")
        r.update(collect_allreduce(d, a.ranks, a.steps, evaluate) if r["row"] == "allreduce"
                 else collect(d, a.ranks, evaluate))
        print(f"repeat {r['repeat']} {r['condition']:9s} {r['row']:10s} {a.steps / r['t_end']:6.2f} steps/s  "
              f"loss@{a.steps} {r['loss'][-1]:.3f}  steps {r['steps']} jumps {r['jumps']}  CPU/step "
              f"{1e3 * sum(r['cpu']) / sum(r['steps']):.0f} ms, in step() "
              f"{1e3 * sum(r['in_step']) / sum(r['steps']):.0f} ms", flush=True)
    target = a.target if a.target is not None else default_target(runs, a.steps)
    summary = summarize(runs, target, a.steps)
    text = table(summary, target, a.steps, a.slow_rank)
    loads = [x[0] for x in load]
    conditions = (f"{a.ranks} ranks, {a.steps} iterations, transformer dim {a.dim} x {a.layers} layers, "
                  f"context {a.seq_len}, batch {a.batch_size} per rank, AdamW lr {a.lr:g}, {a.repeats} "
                  f"interleaved repeat(s); emulated slowdowns: sleep {sleep * 1e3:.0f} ms = "
                  f"{a.factor - 1:g} x measured compute {compute * 1e3:.1f} ms; random prob {a.random_prob:g}; "
                  f"load average (1 min) {min(loads):.1f} at start, {loads[-1]:.1f} at end; job {wall:.0f} s")
    print(text + "\n\n" + conditions, flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(a).items()}, "compute_time": compute, "sleep": sleep,
                   "target": target, "load": load, "runs": runs, "summary": summary}, f, indent=1)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n\n" + conditions + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
