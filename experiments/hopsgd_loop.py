"""A training loop of your own with hopdec's drop-in optimizer (run under mpirun).

    mpirun -n 4 --oversubscribe python3 experiments/hopsgd_loop.py --steps 100

Each rank trains the small CNN on its shard of the bundled digits data; ``HopSGD.step()`` averages
parameters with the rank's graph neighbours exactly as ``hopdec train`` does (same seeds: same result).
"""

import argparse

import numpy as np
import torch
from mpi4py import MPI

from hopdec.ml.data import batches, load_dataset, partition
from hopdec.ml.models import PRESETS, build_model, loss_fn
from hopdec.optim import HopSGD


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--topology", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="save each rank's final parameters as SAVE/params_rank{r}.npy")
    p.add_argument("--compress", default="none", help="as hopdec train --compress (e.g. int8)")
    p.add_argument("--local-steps", type=int, default=1, help="as hopdec train --local-steps")
    p.add_argument("--outer-optimizer", default=None, help="as hopdec train --outer-optimizer")
    p.add_argument("--compute-graph", default="parallel", help="as hopdec train --compute-graph")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.set_num_threads(1)
    h = PRESETS["cnn"]

    data = load_dataset("digits", seed=args.seed)
    torch.manual_seed(args.seed)                       # the same initial model on every rank
    model = build_model("cnn", data.input_shape, data.num_classes)
    stream = batches(data.train_x, data.train_y, partition(data.train_y, size, rank, "iid", args.seed),
                     h["batch_size"], seed=args.seed * 7919 + rank)
    criterion = loss_fn("cnn")
    opt = HopSGD(model, lr=h["lr"], momentum=h["momentum"], weight_decay=h["weight_decay"],
                 topology=args.topology, steps=args.steps, compress=args.compress, local_steps=args.local_steps,
                 outer_optimizer=args.outer_optimizer, compute_graph=args.compute_graph)

    for step in range(args.steps):
        xb, yb = next(stream)
        opt.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        opt.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    opt.close()

    with torch.no_grad():
        acc = (model(data.test_x).argmax(1) == data.test_y).float().mean().item()
    accs = comm.gather(acc)
    if rank == 0:
        print("test accuracy per rank:", " ".join(f"{a:.3f}" for a in accs), flush=True)
    if args.save:
        np.save(f"{args.save}/params_rank{rank}.npy", opt.write_params())


if __name__ == "__main__":
    main()
