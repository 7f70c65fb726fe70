"""Compressed exchanges on a static and a one-peer graph: bytes per iteration and loss at equal iterations.

    python3 experiments/compress_graphs.py [--ranks 8] [--iterations 300] [--codecs none,bf16,int8,topk:0.01]

Real ``mpirun`` runs of the digits CNN (``hopdec train``, seed 0, one torch thread per rank) on ring-based
and on the one-peer exponential schedule, for every codec. Prints one markdown row per run: the bytes of
updates each worker sent per iteration (the transport's own counter, keys included), the mean training
loss of the last 20 iterations over all workers, the averaged model's test loss and accuracy, and the
measured iterations/s (on a shared machine: indicative only).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GRAPHS = {"ring-based": "ring-based", "one-peer exp.": "one-peer-exponential"}


def run(ranks, iterations, topology, codec, log_dir, seed):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(ranks), sys.executable, "-m", "hopdec.cli",
           "train", "--threads", "1", "--no-progress", "--iterations", str(iterations), "--seed", str(seed),
           "--topology", topology, "--compress", codec, "--log-dir", log_dir]
    p = subprocess.run(cmd, cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stdout[-2000:] + p.stderr[-2000:])
    sent, losses, rates = [], [], []
    for r in range(ranks):
        rows = [json.loads(x) for x in open(os.path.join(log_dir, f"rank{r}.jsonl"))]
        recs = [x for x in rows if "iter" in x and "event" not in x]
        msg = next(x for x in rows if x.get("event") == "messages")
        sent.append(msg["bytes"] / len(recs))
        losses += [x["loss"] for x in recs[-20:]]
        rates.append((recs[-1]["iter"] - recs[0]["iter"]) / (recs[-1]["time"] - recs[0]["time"]))
    test = p.stdout.split("averaged model: test loss")[1].split()
    return dict(bytes=float(np.mean(sent)), train_loss=float(np.mean(losses)), test_loss=float(test[0].rstrip(",")),
                test_acc=float(test[3]), rate=float(np.mean(rates)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--codecs", default="none,bf16,int8,topk:0.1,topk:0.01")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print("| graph | --compress | bytes / iteration / worker | vs none | train loss (last 20) | test loss | "
          "test acc | iter/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for gname, topo in GRAPHS.items():
            base = None
            for codec in args.codecs.split(","):
                r = run(args.ranks, args.iterations, topo, codec, os.path.join(tmp, f"{topo}-{codec}"), args.seed)
                base = base or r["bytes"]
                print(f"| {gname} | {codec} | {r['bytes']:,.0f} | {r['bytes'] / base:.3f} | {r['train_loss']:.4f} | "
                      f"{r['test_loss']:.4f} | {r['test_acc']:.4f} | {r['rate']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
