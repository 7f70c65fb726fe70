"""A small causal transformer language model trained in a plain PyTorch loop with ``hopdec.optim.HopOptimizer``
(run under mpirun). The model, data and recipe are ``hopdec train --dataset kjv --model transformer``'s:
bytes of the King James Bible shipped with hopdec (``hopdec/ml/corpora``), AdamW, linear warmup + cosine
decay (``LambdaLR``), gradient clipping; evaluated by the consensus model's validation loss.

    mpirun -n 4 --oversubscribe python3 experiments/lm_loop.py --steps 300 --topology ring

Each rank reads its own shard and steps until its Hop iteration reaches ``--steps`` (with iteration
skipping a rank gets there in fewer steps of its own; unequal step counts are fine). Add ``--skip max-jump=4,trigger=2 --backup-workers 1`` and
``--slow-rank 3`` to see iteration skipping help a persistently slow rank.
"""

import argparse
import math
import time

import torch
from mpi4py import MPI

from hopdec.ml.data import batches, load_dataset, partition
from hopdec.ml.models import PRESETS, build_model, loss_fn
from hopdec.optim import HopOptimizer


@torch.no_grad()
def validation_loss(model, data, batch_size=256):
    """Mean next-byte cross-entropy (nats) over the whole validation split."""
    model.eval()
    crit, total, n = loss_fn("transformer"), 0.0, 0
    for s in range(0, len(data.test_y), batch_size):
        x, y = data.test_x[s:s + batch_size], data.test_y[s:s + batch_size]
        total += float(crit(model(x), y)) * y.numel()
        n += y.numel()
    model.train()
    return total / n


def main():
    h = PRESETS["transformer"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per rank (the schedule's length)")
    p.add_argument("--topology", default=None, help="file or generator kind (ring, exponential, ...)")
    p.add_argument("--lr", type=float, default=h["lr"])
    p.add_argument("--batch-size", type=int, default=h["batch_size"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default=None, help="iteration skipping: max-jump=J,trigger=G")
    p.add_argument("--backup-workers", type=int, default=0)
    p.add_argument("--staleness", type=int, default=None)
    p.add_argument("--slow-rank", type=int, default=None, help="this rank sleeps 2x its compute every step")
    p.add_argument("--log-dir", default=None, help="rank{r}.jsonl for hopdec report/plot/trace")
    p.add_argument("--eval-every", type=int, default=100, help="consensus validation loss every N iterations (0: only at the end)")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)

    data = load_dataset("kjv")
    torch.manual_seed(args.seed)                              # the same initial model on every rank
    model = build_model("transformer", data.input_shape, data.num_classes)
    stream = batches(data.train_x, data.train_y, partition(data.train_y, size, rank, "iid", args.seed),
                     args.batch_size, seed=args.seed * 7919 + rank)
    criterion = loss_fn("transformer")
    decay = [p for p in model.parameters() if p.dim() >= 2]   # GPT recipe: no decay on biases and norms
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = HopOptimizer([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                       torch.optim.AdamW, model=model, lr=args.lr, betas=(h["momentum"], h["beta2"]),
                       topology=args.topology, skip=args.skip, backup_workers=args.backup_workers,
                       staleness=args.staleness, log_dir=args.log_dir, progress=True, steps=args.steps)
    warmup = max(min(h["warmup_min"], args.steps), int(h["warmup"] * args.steps))   # as hopdec train

    def factor(k):                                            # linear warmup, cosine to 10%
        if k < warmup:
            return (k + 1) / warmup
        t = min(1.0, (k - warmup) / max(1, args.steps - warmup))
        return h["min_lr_ratio"] + (1 - h["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * t))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)

    t0 = time.time()
    step = last_eval = 0
    while opt.iteration < args.steps:                         # skipping may take a rank past steps early
        xb, yb = next(stream)
        t = time.perf_counter()
        opt.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), h["clip"])
        if args.slow_rank == rank:
            time.sleep(2 * (time.perf_counter() - t))          # a persistently 3x slower worker
        opt.step(loss=loss)
        sched.step()
        step += 1
        # consensus_model() is collective: call it when the iteration passes a multiple of eval_every (a
        # jump may pass one: every rank still passes each multiple once, so every rank calls it as often)
        if args.eval_every and opt.iteration // args.eval_every > last_eval and opt.iteration < args.steps:
            last_eval = opt.iteration // args.eval_every
            avg = opt.consensus_model(root=0)
            if rank == 0:
                print(f"iteration {opt.iteration}: consensus validation loss {validation_loss(avg, data):.4f} "
                      f"({time.time() - t0:.0f} s)", flush=True)
    opt.finish()
    avg = opt.consensus_model(root=0)
    steps = comm.gather((step, opt.iteration, len(opt.jumps)))
    if rank == 0:
        print("steps, final iteration, jumps per rank:", steps)
        print(f"final consensus validation loss {validation_loss(avg, data):.4f} nats/byte "
              f"after {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
