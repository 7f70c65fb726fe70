"""A user's own training loop with ``HopOptimizer``, as the failure campaign runs it (``failure_campaign.py``).

Written the way a user ports a single-process script (README, "Your own training loop"): a small classifier
on synthetic data, a torch optimizer and an lr scheduler, each rank its own number of steps when asked; a
named graph or a topology file, local steps and compressed exchanges when asked. With ``--checkpoint DIR``
it saves its own periodic checkpoints as the README shows (``checkpoint_every``, ``checkpoint_due``; each
rank's files ``DIR/rank{r}/it{K}.pt``, and one where a Ctrl-C stopped every rank), and a job that finds
files there resumes from the latest every rank has (``common_checkpoint``) and says ``resumed at K``.
One rank fails where the campaign says, with plain Python -- not hopdec's fault injection -- as a user's
code or machine would: ``exit`` (``os._exit``, a crash), ``raise`` (a bug), ``sysexit`` (``sys.exit("Loss is
nan")``), ``hang`` (alive and silent) or ``stop`` (SIGSTOP). Rank 0 prints ``== consensus ...`` when the
run ends well.

    launch/local.sh -n 4 --fault-tolerance --victim 2 --phase train --at 5 --how hang   # (HOPDEC_CMD)
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from mpi4py import MPI

from hopdec.optim import HopOptimizer

from failure_campaign import random_digraph      # (this folder: the campaign draws the same graph)

PHASES = ("setup", "built", "train", "finish", "consensus", "shutdown")
OPTIMIZERS = {"sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
              "adamw": (torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.01)),
              "adam": (torch.optim.Adam, dict(lr=3e-3))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--fault-tolerance", action="store_true")
    p.add_argument("--peer-timeout", type=float, default=45.0)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--uneven", action="store_true", help="rank r takes steps + 2r steps")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw")
    p.add_argument("--topology", default="ring",
                   help="a generator kind, a topology file, or random:SEED (random_digraph(ranks, SEED))")
    p.add_argument("--local-steps", type=int, default=1)
    p.add_argument("--compress", default="none")
    p.add_argument("--backup-workers", type=int, default=0)
    p.add_argument("--skip", default=None)
    p.add_argument("--checkpoint", default=None, help="a folder for this loop's own checkpoints")
    p.add_argument("--every", type=int, default=3, help="checkpoint_every, with --checkpoint")
    p.add_argument("--victim", type=int, default=-1)
    p.add_argument("--phase", choices=PHASES, default="train")
    p.add_argument("--at", type=int, default=0)
    p.add_argument("--how", choices=("exit", "raise", "sysexit", "hang", "stop"), default="exit")
    a = p.parse_args()
    rank = MPI.COMM_WORLD.rank

    def fail(phase, step=None):
        if rank != a.victim or phase != a.phase or (step is not None and step != a.at):
            return
        if a.how == "exit":
            os._exit(3)
        if a.how == "raise":
            raise RuntimeError(f"injected in {phase}")
        if a.how == "sysexit":
            sys.exit("Loss is nan")
        if a.how == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    fail("setup")
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    cls, hyper = OPTIMIZERS[a.optimizer]
    graph = (random_digraph(MPI.COMM_WORLD.size, int(a.topology.split(":")[1])) if a.topology.startswith("random:")
             else a.topology)
    opt = HopOptimizer(model, cls, topology=graph, backup_workers=a.backup_workers, skip=a.skip,
                       fault_tolerance=a.fault_tolerance, peer_timeout=a.peer_timeout, local_steps=a.local_steps,
                       compress=a.compress, checkpoint_every=a.every if a.checkpoint else None, **hyper)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    mine = a.checkpoint and os.path.join(a.checkpoint, f"rank{rank}")

    def save(k):
        torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict()),
                   os.path.join(mine, f"it{k}.pt"))
    if mine:
        os.makedirs(mine, exist_ok=True)
        at = opt.common_checkpoint([int(f[2:-3]) for f in os.listdir(mine) if f.startswith("it")
                                    and f.endswith(".pt")])
        if at is not None:
            state = torch.load(os.path.join(mine, f"it{at}.pt"), weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            if rank == 0:
                print(f"resumed at {at}", flush=True)
    fail("built")
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    steps = a.steps + (2 * rank if a.uneven else 0)
    for s in range(steps):
        fail("train", s)
        i = torch.randint(0, 256, (32,), generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[i]), y[i])
        loss.backward()
        try:
            opt.step(loss=loss)
        except KeyboardInterrupt:           # every rank stops at the same iteration: saved there, they resume
            if mine:
                save(opt.iteration)
            raise
        sched.step()
        if mine and opt.checkpoint_due:
            save(opt.iteration)
        time.sleep(0.01)
    fail("finish")
    opt.finish()
    fail("consensus")
    avg = opt.consensus_model(root=0)
    if avg is not None:
        with torch.no_grad():
            acc = (avg(x).argmax(1) == y).float().mean().item()
        print(f"== consensus of {steps} steps: accuracy {acc:.2f} on rank 0's data", flush=True)
    fail("shutdown")


if __name__ == "__main__":
    main()
