"""Bytes and time to a target loss: local steps x compression x graph, with and without a straggler.

    python3 experiments/comm_efficiency.py sim [--workers 64] [--iterations 160] [--budget 2.5] \\
        [--local-steps 1,8,32] [--codecs none,bf16,int8] [--graphs ring-based,one-peer-exponential] \\
        [--straggler no,yes] [--outer sgd] [--message-mb 42.6] [--bandwidth 1]
    python3 experiments/comm_efficiency.py real [--ranks 8] [--iterations 240] [--budget 2] ...
    python3 experiments/comm_efficiency.py timing --workers 512 --iterations 32 --budget 4 \
        --only one-peer-exponential:8:int8,...

``sim``: ``hopdec sim --math`` -- every worker a real replica of the digits MLP (9,610 parameters, its
presets), messages charged as ``--message-mb`` MiB (ResNet-18's 42.6 by default; coded messages scaled
alike) on a ``--bandwidth`` Gb/s link, 0.1 s of compute per mini-batch, the straggler (``yes``) worker 0
4x slower on every step. ``real``: ``mpirun hopdec train`` of the digits CNN on this machine (bytes from
the transport's counters; time is measured on a shared machine). ``timing``: timing-only simulator runs
(no loss: for 512 workers, where --math is too costly here): virtual time and bytes per mini-batch.

Today's exchange is the baseline: ring-based, float32, one step per exchange (H = 1), ``--iterations``
mini-batches per worker. Its final test loss (the averaged model's) plus 1% is the target; every other
run gets ``--budget`` times the mini-batches, and the first evaluation at or under the target gives the
bytes each worker sent to get there (its update messages, keys included) and the (virtual) time. One
markdown row per run, with the reduction in bytes against the baseline.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STRAGGLER = ["--slowdown", "rank=0,factor=4"]


def sim_run(args, H, codec, graph, straggler, steps, log_dir):
    cmd = [sys.executable, "-m", "hopdec.cli", "sim", "-n", str(args.workers), "--math", "--model", "mlp",
           "--topology", graph, "--iterations", str(steps), "--local-steps", str(H), "--compress", codec,
           "--message-mb", str(args.message_mb), "--bandwidth", str(args.bandwidth), "--compute-time", "0.1",
           "--eval-interval", str(args.eval_interval), "--no-progress", "--seed", str(args.seed),
           "--invariants", "off", "--log-dir", log_dir]
    if H > 1:
        cmd += ["--outer-optimizer", args.outer]
    if straggler:
        cmd += STRAGGLER
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(" ".join(cmd) + "\n" + p.stdout[-2000:] + p.stderr[-2000:])
    evals = [json.loads(x) for x in open(os.path.join(log_dir, "eval.jsonl"))]
    return [(e["time"], e["test_loss"], e["sent_bytes"]) for e in evals], time.time() - t0


def real_run(args, H, codec, graph, straggler, steps, log_dir):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rounds = -(-steps // H)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(args.ranks), sys.executable, "-m",
           "hopdec.cli", "train", "--threads", "1", "--no-progress", "--iterations", str(steps), "--seed",
           str(args.seed), "--topology", graph, "--compress", codec, "--local-steps", str(H),
           "--log-dir", log_dir, "--consensus-every", str(max(1, rounds // 30)), "--eval-interval", "0.01"]
    if H > 1:
        cmd += ["--outer-optimizer", args.outer]
    if straggler:
        cmd += STRAGGLER
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(" ".join(cmd) + "\n" + p.stdout[-2000:] + p.stderr[-2000:])
    evals = [json.loads(x) for x in open(os.path.join(log_dir, "eval.jsonl"))]
    sent, start = [], []
    for r in range(args.ranks):
        rows = [json.loads(x) for x in open(os.path.join(log_dir, f"rank{r}.jsonl"))]
        recs = [x for x in rows if "iter" in x and "event" not in x]
        sent.append(next(x for x in rows if x.get("event") == "messages")["bytes"] / max(len(recs), 1))
        start.append(recs[0]["time"] - recs[0]["compute_s"])
    per_round, t_start = sum(sent) / len(sent), min(start)
    # the averaged model at round `at`: the bytes a worker sent per round (its whole run's mean) times at
    return [(e["time"] - t_start, e["test_loss"], per_round * e["at"]) for e in evals], time.time() - t0


def timing_run(args, H, codec, graph, straggler, steps):
    """A timing-only run (no --math: no loss): virtual seconds and bytes per worker per mini-batch."""
    cmd = [sys.executable, "-m", "hopdec.cli", "sim", "-n", str(args.workers), "--topology", graph,
           "--iterations", str(steps), "--local-steps", str(H), "--compress", codec, "--message-mb",
           str(args.message_mb), "--bandwidth", str(args.bandwidth), "--compute-time", "0.1", "--no-progress",
           "--seed", str(args.seed), "--invariants", "off"] + (STRAGGLER if straggler else [])
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(" ".join(cmd) + "\n" + p.stdout[-2000:] + p.stderr[-2000:])
    virtual = float(p.stdout.split("\nsimulated ")[1].split()[0])
    per = float(p.stdout.split("\ntraffic: ")[1].split()[0].replace(",", ""))    # per worker and round
    rounds = -(-steps // H)
    return virtual / steps, per * rounds / steps, time.time() - t0


def timing(args):
    """``timing``: per mini-batch, the virtual time and the bytes each worker sends (no loss)."""
    print("| straggler | graph | H | --compress | mini-batches | virtual s per mini-batch | vs today | "
          "bytes/worker per mini-batch | vs today | wall s |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for straggler in [s == "yes" for s in args.straggler.split(",")]:
        base = None
        for item in ["ring-based:1:none"] + [x for x in (args.only or "").split(",") if x]:
            graph, H, codec = item.split(":")
            H = int(H)
            steps = args.iterations * (1 if H == 1 else int(args.budget))
            t, b, wall = timing_run(args, H, codec, graph, straggler, steps)
            base = base or (t, b)
            print(f"| {'yes' if straggler else 'no'} | {graph} | {H} | {codec} | {steps} | {t:.3f} | "
                  f"{base[0] / t:.1f}x | {b:,.0f} | {base[1] / b:.1f}x | {wall:.0f} |", flush=True)


def reached(evals, target):
    """(time, bytes) at the first evaluation at or under the target, or None."""
    for t, loss, sent in evals:
        if loss <= target:
            return t, sent
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("where", choices=["sim", "real", "timing"])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--iterations", type=int, default=160, help="the baseline's mini-batches per worker")
    p.add_argument("--budget", type=float, default=2.5, help="the others' mini-batches, times the baseline's")
    p.add_argument("--local-steps", default="1,8,32")
    p.add_argument("--codecs", default="none,bf16,int8")
    p.add_argument("--graphs", default="ring-based,one-peer-exponential")
    p.add_argument("--straggler", default="no,yes")
    p.add_argument("--outer", default="sgd", help="--outer-optimizer for H > 1")
    p.add_argument("--message-mb", type=float, default=42.6)
    p.add_argument("--bandwidth", type=float, default=1.0)
    p.add_argument("--eval-interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="graph:H:codec,... (the baseline always runs)")
    args = p.parse_args(argv)
    if args.where == "timing":
        return timing(args)
    run = sim_run if args.where == "sim" else real_run
    only = None if args.only is None else set(args.only.split(","))
    print("| straggler | graph | H | --compress | mini-batches | bytes/worker to target | vs today | "
          "time to target (s) | vs today | final test loss | wall s |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for straggler in [s == "yes" for s in args.straggler.split(",")]:
            base_evals, wall = run(args, 1, "none", "ring-based", straggler, args.iterations,
                                   os.path.join(tmp, f"base{straggler}"))
            target = base_evals[-1][1] * 1.01
            base = reached(base_evals, target)
            print(f"| {'yes' if straggler else 'no'} | ring-based | 1 | none | {args.iterations} | "
                  f"{base[1]:,.0f} | 1.0x | {base[0]:.1f} | 1.0x | {base_evals[-1][1]:.4f} (target "
                  f"{target:.4f}) | {wall:.0f} |", flush=True)
            for graph in args.graphs.split(","):
                for H in map(int, args.local_steps.split(",")):
                    for codec in args.codecs.split(","):
                        if (graph, H, codec) == ("ring-based", 1, "none"):
                            continue
                        if only is not None and f"{graph}:{H}:{codec}" not in only:
                            continue
                        steps = args.iterations if H == 1 else int(args.iterations * args.budget)
                        evals, wall = run(args, H, codec, graph, straggler, steps,
                                          os.path.join(tmp, f"{graph}-{H}-{codec}-{straggler}"))
                        got = reached(evals, target)
                        cells = (["not reached", "-", "-", "-"] if got is None else
                                 [f"{got[1]:,.0f}", f"{base[1] / got[1]:.1f}x", f"{got[0]:.1f}",
                                  f"{base[0] / got[0]:.1f}x"])
                        print(f"| {'yes' if straggler else 'no'} | {graph} | {H} | {codec} | {steps} | "
                              + " | ".join(cells) + f" | {evals[-1][1]:.4f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
