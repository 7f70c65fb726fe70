"""What each rank of the optimizer's MPI tests runs (``tests/test_optim_mpi.py``): several scenarios in one
``mpirun`` job, one after the other; rank 0 prints one ``@@name {json}`` line per scenario."""

import gc
import json
import os
import signal
import sys
import time
from functools import partial

import numpy as np
import torch
from mpi4py import MPI

from hopdec.optim import HopOptimizer

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
torch.set_num_threads(1)


def model_with_batchnorm():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 3))


def batch(step, r=None):
    g = torch.Generator().manual_seed(1000 * (rank if r is None else r) + step)
    return torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)


def train_steps(model, opt, start, stop, sched=None):
    crit = torch.nn.CrossEntropyLoss()
    for k in range(start, stop):
        x, y = batch(k)
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step(loss=loss)
        if sched is not None:
            sched.step()


def report(name, obj):
    everyone = comm.gather(obj)
    if rank == 0:
        print(f"@@{name} {json.dumps(everyone)}", flush=True)


def _can_skip(g, kw, trigger):
    """Whether skipping with this trigger can ever jump (else the optimizer refuses it, as hopdec train does):
    backup workers or staleness >= 1 beside it, and a trigger within max_ig unless some edge goes one way."""
    mechanism = kw.get("staleness") or kw.get("backup_workers")
    symmetric = all(g.has_edge(v, u) for u, v in g.edges if u != v)
    return bool(mechanism) and (trigger <= kw.get("max_ig", 2) or not symmetric)


def scenario_unequal(out):
    """AdamW with two parameter groups, a scheduler, unequal step counts, averaged BatchNorm statistics,
    logs; then the consensus model against the mean of every worker's final state."""
    model = model_with_batchnorm()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = HopOptimizer([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                       torch.optim.AdamW, model=model, lr=0.01, topology="ring", average_buffers=True,
                       log_dir=out, progress=True, progress_interval=0.2, consensus_every=3)
    seen_lr = []
    opt.optimizer.register_step_pre_hook(lambda o, a, k: seen_lr.append(o.param_groups[0]["lr"]))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    steps = 12 + 5 * rank                                   # ranks take 12, 17, 22, 27 steps
    train_steps(model, opt, 0, steps, sched)
    at_finish = opt.iteration
    opt.finish()
    final = np.stack(comm.allgather(opt.flat.write_params().astype(np.float64)))   # what was sent, buffers too
    final_dists = np.linalg.norm(final - final.mean(axis=0), axis=1).tolist()
    state = opt.consensus_state_dict()
    root_only = opt.consensus_state_dict(root=1)
    mine = {k: v.detach().double().numpy().tolist() for k, v in model.state_dict().items()
            if v.is_floating_point()}
    everyone = comm.allgather(mine)
    mean = {k: np.mean([np.asarray(e[k]) for e in everyone], axis=0) for k in mine}
    err = max(float(np.abs(state[k].double().numpy() - mean[k]).max()) for k in mean)
    report("unequal", dict(steps=steps, at_finish=at_finish, end=opt.iteration, lr=seen_lr,
                           sched_lr=opt.param_groups[0]["lr"], consensus_err=err,
                           buffers_differ=bool(np.abs(np.asarray(everyone[0]["1.running_mean"])
                                                      - np.asarray(everyone[-1]["1.running_mean"])).max() > 0),
                           root_only=root_only is not None, final_dists=final_dists,
                           groups_wd=[g["weight_decay"] for g in opt.param_groups]))


def scenario_resume(out):
    """AdamW's state and the protocol position survive a checkpoint: state_dict -> torch.save -> a new model
    and optimizer -> load -> the same parameters after the same steps as an uninterrupted run."""
    def build():
        model = model_with_batchnorm()
        return model, HopOptimizer(model, torch.optim.AdamW, lr=0.01, topology="ring")
    model, opt = build()
    train_steps(model, opt, 0, 6)
    path = os.path.join(out, f"ck{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    train_steps(model, opt, 6, 12)
    opt.finish()
    straight = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    model2, opt2 = build()
    ck = torch.load(path, weights_only=True)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    resumed_at = opt2.iteration
    train_steps(model2, opt2, 6, 12)
    opt2.finish()
    again = torch.cat([p.detach().reshape(-1) for p in model2.parameters()])
    report("resume", dict(resumed_at=resumed_at, position=ck["opt"]["hop"]["position"],
                          max_diff=float((straight - again).abs().max()),
                          adam_steps=float(opt2.state[next(model2.parameters())]["step"])))


def scenario_resume_buffers(out):
    """The same round trip with ``average_buffers``: the BatchNorm statistics too come out as in an
    uninterrupted run (the resumed rank's first update carries them as the uninterrupted run sent them,
    before its forward moved them)."""
    def build():
        model = model_with_batchnorm()
        return model, HopOptimizer(model, torch.optim.AdamW, lr=0.01, topology="ring", average_buffers=True)

    def state(model):
        return torch.cat([v.detach().reshape(-1).float() for v in model.state_dict().values()])
    model, opt = build()
    train_steps(model, opt, 0, 6)
    path = os.path.join(out, f"ckb{rank}.pt")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    train_steps(model, opt, 6, 12)
    opt.finish()
    model2, opt2 = build()
    ck = torch.load(path, weights_only=True)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    train_steps(model2, opt2, 6, 12)
    opt2.finish()
    report("resume_buffers", dict(max_diff=float((state(model) - state(model2)).abs().max())))


def scenario_skip(out):
    """A persistently slow rank (3x its compute) with backup workers and iteration skipping: it jumps, takes
    fewer steps than the others, and the run ends cleanly (the loop stops on the iteration)."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, momentum=0.9, topology="complete",
                       backup_workers=1, skip="max-jump=4,trigger=2", log_dir=out)
    crit = torch.nn.CrossEntropyLoss()
    steps = 0
    while opt.iteration < 60:
        t = time.perf_counter()
        x, y = batch(steps)
        opt.zero_grad()
        crit(model(x), y).backward()
        time.sleep(0.01)
        if rank == size - 1:
            time.sleep(2 * (time.perf_counter() - t))
        opt.step()
        steps += 1
    opt.finish()
    report("skip", dict(steps=steps, jumps=len(opt.jumps), end=opt.iteration))


def raise_mid_loop(opt, model, who, announce=False):
    """Train with ``opt`` until world rank ``who`` raises at step 5; the others keep stepping (and would
    wait for it)."""
    crit = torch.nn.CrossEntropyLoss()
    for k in range(1000):
        x, y = batch(k)
        opt.zero_grad()
        crit(model(x), y).backward()
        if rank == who and k == 5:
            if announce:
                print(f"@@raise {time.time()}", flush=True)
            raise ValueError("a bad batch in the user's code")
        opt.step()
    opt.finish()


def scenario_raise(out):
    """Rank 2 raises in the middle of its loop; the others keep stepping (and would wait for it)."""
    model = model_with_batchnorm()
    raise_mid_loop(HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=60), model, 2,
                   announce=True)


def scenario_raise_split(out):
    """Two groups of ranks (``COMM_WORLD.Split``), one optimizer each on its own communicator; world rank 3,
    rank 1 of its group's communicator, raises mid-loop."""
    group = comm.Split(rank % 2, rank)
    model = model_with_batchnorm()
    raise_mid_loop(HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="complete", comm=group,
                                peer_timeout=60), model, 3)


def scenario_stop_split(out):
    """As :func:`scenario_raise_split`, but world rank 3 (rank 1 of its group's communicator) hangs after
    step 5: its group's other rank, world rank 1, times out waiting for it. (Hung, not SIGSTOPped: under
    load prterun itself once crashed, SIGSEGV, tearing down a job with a stopped rank.)"""
    group = comm.Split(rank % 2, rank)
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="complete", comm=group, peer_timeout=4)
    for k in range(1000 if rank % 2 else 20):
        train_steps(model, opt, k, k + 1)
        if rank == 3 and k == 5:
            print(f"@@stop_split {os.getpid()}", flush=True)
            time.sleep(10 ** 6)
    opt.finish()


def loop_where(who, at, then, steps, peer_timeout=60):
    """Every rank trains ``steps`` steps, rank ``who`` calling ``then()`` after its step ``at``; then finish."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=peer_timeout)
    for k in range(steps):
        train_steps(model, opt, k, k + 1)
        if rank == who and k == at:
            then()
    opt.finish()
    return opt


def scenario_caught_exit(out):
    """Rank 1 catches a ``sys.exit(1)`` of its own and goes on: nothing ends (the next step forgets it)."""
    def caught():
        try:
            sys.exit(1)
        except SystemExit:
            pass
    opt = loop_where(1, 3, caught, 12)
    if rank == 0:
        print(f"@@caught_exit {opt.iteration}", flush=True)


def scenario_exit(out):
    """Rank 2 stops on a NaN loss as public training scripts do -- ``sys.exit("...")`` -- after 5 steps; the
    others keep stepping (its exit handler used to finish it: it served them to their 1000th step)."""
    def nan():
        print(f"@@exit {time.time()}", flush=True)
        sys.exit("Loss is nan, stopping training")
    loop_where(2, 5, nan, 1000)


def scenario_refused(out):
    """Rank 1 alone builds its model in float64 (a rank-dependent bug): the constructor refuses it there
    while the others go on into its collectives."""
    model = model_with_batchnorm()
    if rank == 1:
        model = model.double()
    HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=60)
    print(f"@@refused built on rank {rank}", flush=True)
    comm.Barrier()


def scenario_early(out, how):
    """Rank 1 fails before it builds its optimizer (its data file is missing, or it exits on it) while the
    others wait for it in the constructor's collectives."""
    if rank == 1:
        print(f"@@early {time.time()} {os.getpid()}", flush=True)
        if how == "exit":
            sys.exit(f"no data in {out}/missing.bin")
        if how == "stop":                   # hung (stopped) before it builds its optimizer
            os.kill(os.getpid(), signal.SIGSTOP)
        if how == "crash":                  # its process dies (fault tolerant: the others see a death)
            os._exit(1)
        open(os.path.join(out, "missing.bin"), "rb")
    HopOptimizer(model_with_batchnorm(), torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=60,
                 fault_tolerance=how == "crash")


def scenario_dropped(out, how):
    """Every rank's loop is a function that returns without ``finish()`` (its exit handler finishes it), as
    scripts written ``def main(): ...`` are; rank 2's takes no step (its shard is empty: ``none``) or stops
    on a failure before its first step (``exit``), so its optimizer, never started, is dropped with the
    function's frame before the interpreter's exit."""
    def train():
        model = model_with_batchnorm()
        opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=30)
        if rank == 2:
            print(f"@@dropped {time.time()}", flush=True)
            if how == "exit":
                sys.exit("no batches in this rank's shard")
            return
        train_steps(model, opt, 0, 6)
    train()
    gc.collect()


def scenario_late_exit(out):
    """Every rank trains and finishes; rank 1 then stops with ``sys.exit("...")`` (a check of its own after
    training failed) while the others go on to ``consensus_model()``."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=30,
                       fault_tolerance="--fault-tolerance" in sys.argv)
    train_steps(model, opt, 0, 6)
    opt.finish()
    if rank == 1:
        print(f"@@late_exit {time.time()}", flush=True)
        sys.exit("validation loss diverged")
    opt.consensus_model()
    print(f"@@late_exit consensus on rank {rank}", flush=True)


def scenario_late_crash(out):
    """fault_tolerance=True: every rank trains and finishes; the last rank then crashes (os._exit) while
    the others ask for the consensus model on rank 0 only."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", fault_tolerance=True)
    train_steps(model, opt, 0, 6)
    opt.finish()
    if rank == comm.Get_size() - 1:
        os._exit(1)
    avg = opt.consensus_model(root=0)
    if avg is not None:
        print(f"@@late_crash {opt.comm.Get_size()} survivors", flush=True)


def scenario_rooted(out):
    """fault_tolerance=True, 4 ranks: every rank trains and finishes; rank 1 then crashes while the others
    ask for the consensus model on rank 2, then on rank 1 (the dead one). Each rank that gets one says so."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", fault_tolerance=True)
    train_steps(model, opt, 0, 6)
    opt.finish()
    if rank == 1:
        os._exit(1)
    for root in (2, 1):
        if opt.consensus_model(root=root) is not None:
            print(f"@@rooted root={root} on rank {rank}", flush=True)
    try:
        opt.consensus_model(root=4)
    except Exception as err:
        print(f"@@rooted refused on rank {rank}: {err}", flush=True)


def periodic_checkpoints(out, resume):
    """A user's own periodic checkpoints with skipping: 4 ranks on a ring, one backup worker, jumps of up to
    3, rank 1 slow (so it jumps); ``checkpoint_every=4``: each rank saves model and optimizer state where
    ``checkpoint_due`` (file ``it{K}.pt``). ``resume``: each rank lists its files, loads the latest every
    rank has (``common_checkpoint``) and trains on."""
    folder = os.path.join(os.path.dirname(out), "ckpt_save", f"rank{rank}")
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = HopOptimizer(model, torch.optim.AdamW, lr=0.01, topology="ring", backup_workers=1,
                       skip="max-jump=3", checkpoint_every=4, peer_timeout=60)
    at = None
    if resume:
        mine = [int(f[2:-3]) for f in os.listdir(folder) if f.startswith("it") and f.endswith(".pt")]
        at = opt.common_checkpoint(mine)
        state = torch.load(os.path.join(folder, f"it{at}.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    saved, crit = [], torch.nn.CrossEntropyLoss()
    for k in range(30 if not resume else 12):
        x, y = batch(k)
        opt.zero_grad()
        crit(model(x), y).backward()
        if rank == 1:
            time.sleep(0.05)
        opt.step()
        if opt.checkpoint_due:
            torch.save(dict(model=model.state_dict(), opt=opt.state_dict()),
                       os.path.join(folder, f"it{opt.iteration}.pt"))
            saved.append(opt.iteration)
    last = opt.iteration
    opt.finish()
    report("ckpt_resume" if resume else "ckpt_save", dict(saved=saved, jumps=len(opt.jumps), at=at, last=last))


def scenario_consensus_hang(out):
    """Every rank trains and finishes; rank 2 then hangs (alive, silent) before the consensus call the others
    make (peer timeout 4 s)."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=4)
    train_steps(model, opt, 0, 6)
    opt.finish()
    if rank == 2:
        time.sleep(3600)
    opt.consensus_model()


def scenario_busy(out):
    """Rank 0 evaluates for longer than the peer timeout between two steps, its neighbours waiting."""
    loop_where(0, 3, lambda: time.sleep(10), 20, peer_timeout=3)


def gan(steps, peer_timeout, between=lambda k: None):
    """A GAN's shape: two optimizers on the same ranks (a generator's and a discriminator's, different
    topologies), stepped in turn ``steps`` times, ``between(k)`` after each discriminator step, finished in
    the same order on every rank, then both consensus models on rank 0. Returns (the generator's
    iteration, the discriminator's, whether rank 0's consensus models are finite)."""
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    disc = model_with_batchnorm()
    opt_g = HopOptimizer(gen, torch.optim.Adam, lr=1e-3, topology="ring", peer_timeout=peer_timeout)
    opt_d = HopOptimizer(disc, torch.optim.SGD, lr=0.05, topology="ring-based", peer_timeout=peer_timeout)
    crit = torch.nn.CrossEntropyLoss()
    for k in range(steps):
        x, y = batch(k)
        opt_d.zero_grad()
        crit(disc(torch.cat([x, gen(torch.randn(8, 4)).detach()])), torch.cat([y, torch.zeros(8).long()])).backward()
        opt_d.step()
        between(k)
        opt_g.zero_grad()
        crit(disc(gen(torch.randn(8, 4))), torch.ones(8).long()).backward()
        opt_g.step()
    opt_d.finish()
    opt_g.finish()
    g, d = opt_g.consensus_model(root=0), opt_d.consensus_model(root=0)
    finite = rank != 0 or all(torch.isfinite(p).all() for m in (g, d) for p in m.parameters())
    return opt_g.iteration, opt_d.iteration, bool(finite)


def scenario_two(out):
    """The script's own messages on COMM_WORLD between a GAN's two optimizers' steps (their messages
    matched each other's receives: every rank hung)."""
    heard = []
    g, d, finite = gan(15, 20, lambda k: heard.append(comm.sendrecv(k * 10 + rank, dest=(rank + 1) % size,
                                                                    source=(rank - 1) % size)))
    if rank == 0:
        print("@@two " + json.dumps(dict(g=g, d=d, heard=heard, finite=finite)), flush=True)


def scenario_two_uneven(out):
    """A GAN's two optimizers with a different number of steps per rank: a rank in one optimizer's finish()
    must keep the other's neighbours going (it served only its own: the others hung in the other's step)."""
    steps = 6 + 3 * rank
    g, d, finite = gan(steps, 15)
    report("two_uneven", dict(steps=steps, g=g, d=d, finite=finite))


def scenario_shapes(out):
    """Rank 2 builds a wider first layer (a rank-dependent size): its messages would have another length."""
    torch.manual_seed(0)
    h = 17 if rank == 2 else 16
    model = torch.nn.Sequential(torch.nn.Linear(6, h), torch.nn.ReLU(), torch.nn.Linear(h, 3))
    HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=20)
    print(f"@@shapes built on rank {rank}", flush=True)


def scenario_layout(out):
    """Rank 1 alone turns its model channels_last: the same shapes, its buffer in another order."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 2, 3))
    if rank == 1:
        model = model.to(memory_format=torch.channels_last)
    HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=20)
    print(f"@@layout built on rank {rank}", flush=True)


def scenario_order(out):
    """Rank 1 builds its parameter groups in another order (from a set of names, say): the same shapes
    (two Linear(4, 4)), so the buffers would be averaged crosswise -- a weight with a bias of another layer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    names = ["0.weight", "0.bias", "1.weight", "1.bias"]
    if rank == 1:
        names = ["1.weight", "1.bias", "0.weight", "0.bias"]
    params = dict(model.named_parameters())
    HopOptimizer([{"params": [params[n]]} for n in names], torch.optim.SGD, model=model, lr=0.05,
                 topology="ring", peer_timeout=20)
    print(f"@@order built on rank {rank}", flush=True)


def scenario_plan(out, what):
    """Rank 1 reads another topology file (as if its host's copy differed), or is given another max_ig."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    topo, max_ig = "ring", 2
    if what == "topology":
        from hopdec.topology import generators, graph_io
        topo = os.path.join(out, f"topo{rank}.json")
        graph_io.save(generators.complete(size) if rank == 1 else generators.ring(size), topo)
    elif rank == 1:
        max_ig = 3
    HopOptimizer(model, torch.optim.SGD, lr=0.05, topology=topo, max_ig=max_ig, peer_timeout=20)
    print(f"@@plan built on rank {rank}", flush=True)


def scenario_bad_topology(out):
    """Every rank is given a damaged topology file (bad input, as hopdec train --topology would refuse)."""
    path = os.path.join(os.path.dirname(out), "broken.json")
    if rank == 0:
        with open(path, "w") as f:
            f.write('{"nodes": [0, 1, 2], "edges": [[0, 1]')
    comm.Barrier()
    HopOptimizer(torch.nn.Linear(6, 3), torch.optim.SGD, lr=0.05, topology=path, peer_timeout=20)
    print(f"@@bad_topology built on rank {rank}", flush=True)


def scenario_ft(out):
    """fault_tolerance=True: rank 3 dies (os._exit) after 5 steps, just before every rank's consensus call
    there; the survivors heal the graph, reduce again among themselves, finish their loops and agree where
    to stop among themselves; the consensus model is theirs. (A consensus call that met the death ended
    the job with MPI_ERR_PROC_FAILED.) Rank 1, no neighbour of rank 3 on the ring, is done after 6 steps:
    it may wait in finish() when the others find the death, and only its end channel (a receive from every
    rank) sees it -- that ended the job with MPI_ERR_IN_STATUS. Both found by random fault-tolerant jobs."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", fault_tolerance=True, log_dir=out)
    crit = torch.nn.CrossEntropyLoss()
    how = os.environ.get("FT_HOW")
    if how == "agree" and rank == 3:    # dies once every rank said it is done
        from hopdec.optim import ending
        ending.EndChannel.agree = lambda *a, **k: os._exit(1)
    if how == "close" and rank == 3:    # dies after the ranks agreed where to stop, as it closes
        HopOptimizer._close = lambda self: os._exit(1)
    if how == "start" and rank == 3:    # dies after building its optimizer, before its first step
        os._exit(1)
    for k in range(6 if rank == 1 else 25):
        if rank == 3 and k == 5 and how not in ("agree", "close"):
            if os.environ.get("FT_HOW") == "stop":      # hung: found by the failure detector, never exits
                print(f"@@victim {os.getpid()}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(1)
        x, y = batch(k)
        opt.zero_grad()
        crit(model(x), y).backward()
        time.sleep(0.01)
        opt.step()
        if k == 5:
            opt.consensus_state_dict()
    opt.finish()
    state = opt.consensus_state_dict()
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    from hopdec.transport.collectives import allgather_json
    everyone = allgather_json(opt.comm, mine.tolist(), 30)
    err = float(np.abs(np.asarray(everyone).mean(0) - torch.cat([state[k].reshape(-1) for k, _ in
                                                                  model.named_parameters()]).numpy()).max())
    print(f"@@ft{rank} " + json.dumps(dict(survivors=opt.comm.Get_size(), end=opt.iteration, err=err,
                                              heals=len(opt.healer.events))), flush=True)


def scenario_ft_note(out):
    """fault_tolerance=True with a peer timeout not above the failure detector's: rank 0 warns once (the
    test reads stderr); the steps and finish() go on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", fault_tolerance=True, peer_timeout=20)
    for k in range(3):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    opt.finish()
    if rank == 0:
        print("@@ft_note done", flush=True)


def scenario_ft_all_die(out):
    """fault_tolerance=True and every rank dies after a step, before finish(): the launcher must not say 0."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", fault_tolerance=True)
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    os._exit(17)


def scenario_ft_random(out, seed=55):
    """A seeded random fault-tolerant job (5 ranks): a directed graph, tokens with skipping, unequal steps,
    a consensus call at a shared step, one rank killed mid-run. Seed 55: the death is found while ranks
    wait in finish(), they heal before posting the agreement on where to stop, and a rank that then posted
    it twice on the new channel (once voided at once) hung the others for the peer timeout."""
    import random

    import networkx as nx

    from hopdec.topology import with_default_weights
    rng = random.Random(seed)
    while True:
        g = nx.gnp_random_graph(size, rng.choice([0.4, 0.6]), seed=rng.randrange(10 ** 6), directed=True)
        if nx.is_strongly_connected(g):
            break
    kw = dict(compute_graph=rng.choice(["parallel", "serial"]), max_ig=rng.choice([1, 2, 3]))
    mech = rng.choice(["none", "stale", "backup"])
    if mech == "stale":
        kw["staleness"] = rng.choice([1, 2])
    if mech == "backup" and min(d for _, d in g.in_degree()) >= 3:
        kw["backup_workers"] = 1
    if mech != "none" and rng.random() < 0.5:
        skip = f"max-jump={rng.choice([2, 3])},trigger=2"
        if _can_skip(g, kw, 2):
            kw["skip"] = skip
    steps = [rng.randrange(4, 20) for _ in range(size)]
    victim, die_at = rng.randrange(size), rng.randrange(1, 16)
    consensus_at = rng.randrange(1, min(steps))
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 2)
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology=with_default_weights(g), fault_tolerance=True,
                       peer_timeout=20, **kw)
    x = torch.randn(8, 4)
    for k in range(steps[rank]):
        if rank == victim and k == die_at:
            os._exit(1)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        time.sleep(0.005)
        opt.step()
        if k == consensus_at:
            opt.consensus_state_dict()
    opt.finish()
    print(f"@@ftr{rank} " + json.dumps(dict(end=opt.iteration, survivors=opt.comm.Get_size(), victim=victim)),
          flush=True)


def scenario_periodic(out):
    """A graph whose W is periodic (a directed cycle, no self-weight): the optimizer warns as train does."""
    import warnings

    import networkx as nx
    g = nx.DiGraph()
    g.add_weighted_edges_from([(i, i, 0.0) for i in range(size)] + [(i, (i + 1) % size, 1.0) for i in range(size)])
    model = torch.nn.Linear(4, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = HopOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, topology=g)
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    opt.finish()
    report("periodic", [str(w.message) for w in caught if issubclass(w.category, UserWarning)])


def scenario_seeds(out):
    """Rank 2 builds its model from another seed (then every rank seeds alike): rank 0 warns at the first step,
    once, naming rank 2; a resumed run (different models by design) is not checked."""
    import warnings
    seen = []
    for seeds in ((0, 0, 7, 0), (0, 0, 0, 0)):
        torch.manual_seed(seeds[rank % 4])
        model = torch.nn.Linear(4, 2)
        opt = HopOptimizer(model, torch.optim.SGD, lr=0.1, topology="ring")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                opt.zero_grad()
                model(torch.ones(2, 4)).sum().backward()
                opt.step()
        sd = opt.state_dict()
        opt.finish()
        seen.append([str(w.message) for w in caught if "different parameters" in str(w.message)])
    again = HopOptimizer(model, torch.optim.SGD, lr=0.1, topology="ring")   # models now differ per rank
    again.load_state_dict(sd)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.zero_grad()
        model(torch.ones(2, 4) * (rank + 1)).sum().backward()        # (each rank its own data: they end apart)
        again.step()
    again.finish()
    seen.append([str(w.message) for w in caught if "different parameters" in str(w.message)])
    phase2 = HopOptimizer(model, torch.optim.Adam, lr=0.01, topology="ring")   # a second phase, same model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        phase2.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        phase2.step()
    phase2.finish()
    seen.append([str(w.message) for w in caught if "different parameters" in str(w.message)])
    report("seeds", seen)


def serial_chorded_cycle(peer_timeout):
    """(model, optimizer, input) of the serial graph on a directed graph: a cycle and the chord 0 -> 2."""
    import networkx as nx

    from hopdec.topology import with_default_weights
    g = with_default_weights(nx.DiGraph([(i, (i + 1) % size) for i in range(size)] + [(0, 2)]))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = HopOptimizer(model.parameters(), torch.optim.SGD, model=model, lr=0.1, topology=g,
                       compute_graph="serial", peer_timeout=peer_timeout)
    return model, opt, torch.randn(8, 4)


def quadratic_steps(model, opt, x, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def scenario_serial(out, late=False):
    """The serial graph on a directed graph (a 4-cycle and a chord), unequal step counts: the ranks that stop
    first pause at ComputeGradient before sending that iteration's update, which the others wait for.
    ``late``: rank 1 takes a second between its last step and finish() (a user's evaluation), so the done
    ranks run ahead of it as far as tokens let them."""
    model, opt, x = serial_chorded_cycle(20)
    steps = 6 + 3 * (rank % 2)
    quadratic_steps(model, opt, x, steps)
    if late and rank == 1:
        time.sleep(1.0)
    opt.finish()
    report("serial_late" if late else "serial", dict(steps=steps, end=opt.iteration))


def scenario_serial_consensus(out):
    """The serial graph on a directed graph (a 4-cycle and a chord), unequal step counts, then
    consensus_model() before finish(): a rank waiting there is paused before sending its update, which a
    neighbour still training waits for -- with no edge back, nothing told it so (hung until the peer timeout)."""
    model, opt, x = serial_chorded_cycle(15)
    steps = 6 + 3 * (rank % 2)
    quadratic_steps(model, opt, x, steps)
    at = opt.iteration
    avg = opt.consensus_state_dict()
    after = opt.iteration
    quadratic_steps(model, opt, x, 2)   # and training goes on after it
    opt.finish()
    report("serial_consensus", dict(steps=steps, at=at, after=after, end=opt.iteration,
                                    avg=float(avg["weight"].sum() + avg["bias"].sum())))


def scenario_stale_finish(out):
    """Staleness 2 on a ring, rank 0 done after 6 steps while the others, slow at first, go on to 14: rank 0
    ran ahead on stale updates, so their late updates arrive while it waits in finish(), with the one it
    holds filling every receive slot for that sender. Released only by its next step (never), they kept
    it from hearing that its neighbours were ahead: finish() timed out (found by random jobs)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = HopOptimizer(model.parameters(), torch.optim.SGD, lr=0.05, topology="ring", max_ig=2, staleness=2,
                       peer_timeout=15)
    x = torch.randn(8, 4)
    steps = 6 if rank == 0 else 14
    for k in range(steps):
        if rank != 0 and k < 8:
            time.sleep(0.05)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    opt.finish()
    report("stale_finish", dict(steps=steps, end=opt.iteration))


def scenario_adopt(out):
    """The user replaces the parameters (``load_state_dict(assign=True)``) while updates sent from them are
    still on their way to a slow rank: the values move to a free store of the pool instead of being
    written under the send (``HopOptimizer._off_the_wire``). lr 0 and constant vectors per rank: mixing
    keeps every rank's values constant across elements, so a store written in the wrong place shows."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)                  # 16 KB messages: rendezvous over shared memory
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(rank))
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.0, topology="ring", backup_workers=1, peer_timeout=30)
    x = torch.randn(8, 64)
    grew_before = None
    for k in range(24):
        if rank == size - 1:
            time.sleep(0.03)                         # the straggler: it takes its updates late
        if k == 12:
            grew_before = opt.flat.stores
            loaded = {n: torch.full_like(v, float(v.flatten()[0]) + 1.0) for n, v in model.state_dict().items()}
            model.load_state_dict(loaded, assign=True)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    opt.finish()
    vals = opt.flat.values()
    report("adopt", dict(stores=opt.flat.stores, grew_before=grew_before,
                         constant=bool(torch.all(vals == vals[0])), value=float(vals[0]),
                         in_buffer=model.weight.untyped_storage().data_ptr()
                         == vals.untyped_storage().data_ptr()))


def random_config(seed):
    """A random job for every rank alike: a strongly connected directed graph, a protocol and compute graph,
    staleness, backup workers, skipping, local steps; unequal step counts; a slow rank, and a rank that
    evaluates for a while before finish()."""
    import random

    import networkx as nx

    from hopdec.topology import with_default_weights
    rng = random.Random(seed)
    while True:
        g = nx.gnp_random_graph(size, rng.choice([0.4, 0.6]), seed=rng.randrange(10 ** 6), directed=True)
        if nx.is_strongly_connected(g):
            break
    kw = dict(protocol=rng.choice(["tokens", "tokens", "notify-ack", "queue-only"]),
              compute_graph=rng.choice(["parallel", "serial"]))
    if kw["protocol"] == "tokens":
        kw["max_ig"] = rng.choice([1, 2, 3])
        mech = rng.choice(["none", "backup", "stale", "stale"])
        if mech == "backup" and min(g.in_degree(i) for i in g) >= 2:
            kw["backup_workers"] = 1
        elif mech == "stale":
            kw["staleness"] = rng.choice([1, 2])
        if mech != "none" and rng.random() < 0.5:
            skip = f"max-jump={rng.choice([2, 3])},trigger=2"
            if _can_skip(g, kw, 2):
                kw["skip"] = skip
    if rng.random() < 0.3:
        kw["local_steps"] = rng.choice([2, 3])
    steps = [rng.randrange(3, 15) for _ in range(size)]
    return with_default_weights(g), kw, steps, rng.randrange(size), rng.randrange(size)


def scenario_random(out, seeds=(*range(11), 51)):
    """Random jobs (:func:`random_config`) one after the other: each must end, every rank at one iteration.
    Seed 51 (staleness 2, max_ig 1) hung in finish() 3 times of 3 before late updates were released there."""
    for seed in seeds:
        g, kw, steps, slow, late = random_config(seed)
        torch.manual_seed(rank)
        model = torch.nn.Linear(4, 2)
        opt = HopOptimizer(model.parameters(), torch.optim.SGD, lr=0.05, topology=g, peer_timeout=20, **kw)
        x = torch.randn(8, 4)
        for _ in range(steps[rank]):
            if rank == slow:
                time.sleep(0.01)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        if rank == late:
            time.sleep(0.2)
        opt.finish()
        report(f"random{seed}", dict(steps=steps[rank], end=opt.iteration, jumps=len(opt.jumps), **kw))


def scenario_inference(out):
    """An evaluation under ``torch.inference_mode()`` between epochs of unequal lengths: rank 0, with the
    fewest steps, serves its neighbours inside ``consensus_model()``; its model must still train after."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring")
    steps, inference, failed = 0, [], None
    for epoch in range(3):
        for _ in range(3 + 3 * rank):
            x, y = batch(steps)
            opt.zero_grad()
            if failed is None:
                try:
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                except RuntimeError as err:         # (what the user's forward met: reported, not raised)
                    failed = str(err).splitlines()[0]
            opt.step()
            steps += 1
        with torch.inference_mode():
            opt.consensus_model()
            model.eval()
            model(x)
            model.train()
        inference.append(any(p.is_inference() for p in model.parameters()))
    opt.finish()
    report("inference", dict(inference=inference, failed=failed, steps=steps, end=opt.iteration))


def scenario_consensus_alone(out):
    """Every rank trains and finishes; only rank 0 then asks for the consensus model (the others' scripts
    end): a call nobody else makes."""
    model = model_with_batchnorm()
    opt = HopOptimizer(model, torch.optim.SGD, lr=0.05, topology="ring", peer_timeout=60)
    train_steps(model, opt, 0, 6)
    opt.finish()
    if rank == 0:
        print(f"@@alone {time.time()}", flush=True)
        opt.consensus_model()


SCENARIOS = dict(consensus_alone=scenario_consensus_alone, unequal=scenario_unequal, resume=scenario_resume, resume_buffers=scenario_resume_buffers, skip=scenario_skip, raise_=scenario_raise, raise_split=scenario_raise_split, stop_split=scenario_stop_split, ft=scenario_ft,
                 caught_exit=scenario_caught_exit, exit=scenario_exit, refused=scenario_refused, busy=scenario_busy, two=scenario_two, two_uneven=scenario_two_uneven, shapes=scenario_shapes,
                 early_raise=partial(scenario_early, how="raise"), early_exit=partial(scenario_early, how="exit"),
                 early_stop=partial(scenario_early, how="stop"), early_crash=partial(scenario_early, how="crash"),
                 late_exit=scenario_late_exit, rooted=scenario_rooted, consensus_hang=scenario_consensus_hang,
                 ckpt_save=partial(periodic_checkpoints, resume=False), ckpt_resume=partial(periodic_checkpoints,
                                                                                             resume=True), late_crash=scenario_late_crash, dropped_none=partial(scenario_dropped, how="none"), dropped_exit=partial(scenario_dropped, how="exit"),
                 periodic=scenario_periodic, serial=scenario_serial, serial_consensus=scenario_serial_consensus, seeds=scenario_seeds,
                 serial_late=partial(scenario_serial, late=True), stale_finish=scenario_stale_finish,
                 ft_random=scenario_ft_random, ft_note=scenario_ft_note, ft_all_die=scenario_ft_all_die,
                 adopt=scenario_adopt, random=scenario_random, layout=scenario_layout, order=scenario_order, bad_topology=scenario_bad_topology,
                 plan_topology=partial(scenario_plan, what="topology"), plan_max_ig=partial(scenario_plan, what="max_ig"),
                 inference=scenario_inference)

if __name__ == "__main__":
    out = sys.argv[1]
    for name in [a for a in sys.argv[2:] if not a.startswith("--")]:   # (launch/local.sh's --fault-tolerance)
        d = os.path.join(out, name)
        if rank == 0:
            os.makedirs(d, exist_ok=True)
        comm.Barrier()
        SCENARIOS[name](d)

