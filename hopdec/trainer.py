"""The torch side of a worker: a model whose parameters live in one flat buffer, and the runs built on it.

* :class:`LocalTrainer` -- model + data shard + SGD (momentum, weight decay) on ONE contiguous flat
  parameter tensor: every ``nn.Parameter`` of the model is a view into it, and so is every ``.grad``.
  Sending, averaging and the optimizer step are then single-tensor operations, with no per-parameter
  messages or loops. It works as an optimizer-like object in any training loop:
  ``loss = t.compute(); t.reduce([...]); t.apply()``.
* :class:`RunContext` -- everything a run mode needs on one rank (args, communicator, data, presets,
  device, emulation); built by :mod:`hopdec.train_cli` and handed to :func:`run_decentralized` or to
  ``hopdec.ps.run(ctx)``.
* :func:`run_decentralized` -- the Hop engine over MPI: the protocol core (:mod:`hopdec.protocol`) driven
  by the shared worker loop (:mod:`hopdec.loop`) with the MPI transport (:mod:`hopdec.transport.mpi`).
"""

import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hopdec.data import batches, partition
from hopdec.heterogeneity import Emulator
from hopdec.models import build_model, loss_fn, predict


# ---- the local model ----
def flatten_parameters(module):
    """Move every trainable parameter of ``module`` into one contiguous tensor; return it.

    The returned ``nn.Parameter`` (on the module's device) owns the storage: each parameter becomes a
    view into it and each ``.grad`` a view into ``flat.grad``, so one optimizer step, one copy or one
    message covers the whole model.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    flat = torch.nn.Parameter(torch.empty(numel, device=device))
    flat.grad = torch.zeros(numel, device=device)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[off:off + n].copy_(p.reshape(-1))
            p.data = flat.data[off:off + n].view_as(p)
            p.grad = flat.grad[off:off + n].view_as(p)
            off += n
    return flat


def regather_grads(module, flat):
    """Put gradients back into ``flat.grad`` if something replaced them (``model.zero_grad()`` sets
    ``.grad = None`` by default, after which backward allocates new tensors). Cheap when nothing did."""
    off = 0
    base = flat.grad.data_ptr()
    for p in (p for p in module.parameters() if p.requires_grad):
        n = p.numel()
        view = flat.grad[off:off + n]
        if p.grad is None or p.grad.data_ptr() != base + off * flat.grad.element_size():
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)
        off += n


def write_params(flat, out=None):
    """Copy ``flat`` into host array ``out`` (or a new one): the device -> host staging of a send."""
    src = flat.detach()
    if out is None:
        return src.cpu().numpy().copy()
    (out if torch.is_tensor(out) else torch.from_numpy(out)).copy_(src)
    return out


def weighted_sum_into(flat, pairs, acc=None, copy_back=True):
    """``flat <- sum(weight * params)`` over ``pairs = [(array, or None for flat itself, weight)]``;
    an array is a host numpy buffer (staged) or a tensor already on a device (CUDA-aware MPI).

    Summed in the given order into ``acc`` (pass a preallocated tensor like ``flat`` to avoid a fresh
    allocation, and its page faults, every iteration), so equal inputs give bit-identical results.
    With ``copy_back=False`` the result stays in ``acc`` (the caller makes it the parameters).
    """
    with torch.no_grad():
        acc = torch.empty_like(flat) if acc is None else acc
        for i, (arr, w) in enumerate(pairs):
            if arr is None:
                src = flat
            else:
                src = (arr if torch.is_tensor(arr) else torch.from_numpy(arr)).to(flat.device,
                                                                                non_blocking=True)
            if i == 0:
                torch.mul(src, w, out=acc)
            else:
                acc.add_(src, alpha=w)
        if copy_back:
            flat.copy_(acc)


class LocalTrainer:
    """One worker's model, shard and optimizer, with all parameters in the flat tensor ``self.flat``."""

    def __init__(self, model_name, dataset, indices, lr, momentum=0.9, weight_decay=0.0, batch_size=32,
                 device="cpu", seed=0, data_seed=None, norm="batch"):
        torch.manual_seed(seed)                     # same seed on every rank: identical initial model
        self.model_name = model_name
        self.device = torch.device(device)
        self.model = build_model(model_name, dataset.input_shape, dataset.num_classes, norm=norm)
        self.model.to(self.device)
        self.flat = flatten_parameters(self.model)
        self.numel = self.flat.numel()
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._acc = None                            # Reduce's accumulator, allocated once
        self._stores = None                         # two host arrays when sends go without a copy
        self._cur = 0
        self.optimizer = torch.optim.SGD([self.flat], lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.criterion = loss_fn(model_name)
        self.dataset = dataset
        self.stream = batches(dataset.train_x, dataset.train_y, indices, batch_size,
                              seed=seed if data_seed is None else data_seed)
        self.loss = None

    @property
    def nbytes(self):
        return self.numel * self.flat.element_size()

    def compute(self):
        """Gradient of the next mini-batch at the current parameters, into ``self.flat.grad``."""
        xb, yb = next(self.stream)
        xb, yb = xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
        self.model.train()
        self.flat.grad.zero_()
        loss = self.criterion(self.model(xb), yb)
        loss.backward()
        self.loss = float(loss.detach())
        return self.loss

    def apply(self):
        """Apply the stored gradient with SGD (momentum and weight decay act on the flat tensor)."""
        self.optimizer.step()

    def write_params(self, out=None):
        return write_params(self.flat, out)

    def reduce(self, pairs):
        if self._stores is not None:              # write the other store, then make it the parameters
            spare = 1 - self._cur
            weighted_sum_into(self.flat.data, pairs, torch.from_numpy(self._stores[spare])[:self.numel],
                              copy_back=False)
            self._point_at(spare)
            return
        if self._acc is None:
            self._acc = torch.empty_like(self.flat.data)
        weighted_sum_into(self.flat.data, pairs, self._acc)

    # ---- zero-copy sends: parameters alternate between two message-sized host arrays ----
    def use_send_storage(self, length):
        """Keep the parameters in the first ``numel`` floats of one of two host arrays of ``length``
        floats; Reduce writes the other one and swaps. A transport then sends straight from
        :meth:`send_storage` (no send copy, and Reduce has no copy-back) while the spare is free to be
        overwritten once its sends completed. CPU only (a GPU model is staged anyway). Returns whether on.
        """
        if self.device.type != "cpu":
            return False
        self._stores = [np.zeros(length, dtype=np.float32) for _ in range(2)]
        self._stores[0][:self.numel] = self.write_params()
        self._point_at(0)
        return True

    def send_storage(self):
        return None if self._stores is None else self._stores[self._cur]

    def spare_storage(self):
        return None if self._stores is None else self._stores[1 - self._cur]

    def _point_at(self, i):
        """Make store ``i`` the parameters: the flat tensor and every parameter view move to it."""
        self._cur = i
        data = torch.from_numpy(self._stores[i])[:self.numel]
        self.flat.data = data
        off = 0
        for p in self._params:
            n = p.numel()
            p.data = data[off:off + n].view_as(p)
            off += n

    def load_params(self, arr):
        with torch.no_grad():
            self.flat.copy_(torch.from_numpy(np.asarray(arr)).to(self.device))

    @torch.no_grad()
    def evaluate(self, flat=None, batch_size=1024):
        """(loss, accuracy) on the held-out split, for the current or the given flat parameters."""
        saved = None
        if flat is not None:
            saved = self.flat.detach().clone()
            self.load_params(flat)
        self.model.eval()
        total, correct, loss_sum = 0, 0, 0.0
        x, y = self.dataset.test_x, self.dataset.test_y
        for s in range(0, len(y), batch_size):
            xb, yb = x[s:s + batch_size].to(self.device), y[s:s + batch_size].to(self.device)
            out = self.model(xb)
            loss_sum += float(self.criterion(out, yb)) * len(yb)
            correct += int((predict(self.model_name, out) == yb).sum())
            total += len(yb)
        if saved is not None:
            self.flat.copy_(saved)
        return loss_sum / max(total, 1), correct / max(total, 1)


class TorchBackend:
    """Adapts a :class:`LocalTrainer` and an :class:`Emulator` to the worker loop's backend interface."""

    def __init__(self, trainer, emulator, die_at=None, die_how="exit"):
        self.t, self.emu, self.die_at, self.die_how = trainer, emulator, die_at, die_how
        self.send_storage = trainer.send_storage
        self.spare_storage = trainer.spare_storage

    def write_params(self, out=None):
        return self.t.write_params(out)

    def compute(self, iteration):
        if self.die_at is not None and iteration >= self.die_at:   # fault injection for the tests
            if self.die_how == "hang":
                time.sleep(10 ** 6)                 # a hung node: alive, silent
            os._exit(17)                            # a crashed node
        t0 = time.perf_counter()
        loss = self.t.compute()
        if self.t.device.type == "cuda":
            torch.cuda.synchronize(self.t.device)
        measured = time.perf_counter() - t0
        total, factor = self.emu.run(iteration, measured)
        return {"loss": loss, "compute_s": total, "measured_compute_s": measured, "slowdown": factor}

    def reduce(self, pairs):
        self.t.reduce(pairs)

    def apply(self, iteration):
        self.t.apply()


# ---- the run context ----------------------------------------------------------------------------
def pick_device(spec, local_rank):
    """``auto``: ``cuda:(local rank mod device count)`` when CUDA is there, else CPU."""
    if spec == "auto":
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
        return torch.device("cpu")
    return torch.device(spec)


def local_rank_and_size():
    """This rank's index and count on its host, from the launcher's environment (Open MPI, MPICH, Slurm)."""
    for r, s in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        if r in os.environ:
            try:
                return int(os.environ[r]), int(os.environ.get(s, "1").split("(")[0])
            except ValueError:
                pass
    return 0, 1


@dataclass
class RunContext:
    """What a run mode needs on one rank. ``hparams``: lr, momentum, weight_decay, batch_size."""

    args: object
    comm: object
    dataset: object
    model_name: str
    hparams: dict
    iterations: int
    device: torch.device
    log_dir: str = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def rank(self):
        return self.comm.Get_rank()

    @property
    def size(self):
        return self.comm.Get_size()

    def make_trainer(self, part, n_parts):
        """A trainer on shard ``part`` of ``n_parts`` (same initial model on every rank)."""
        a = self.args
        idx = partition(self.dataset.train_y, n_parts, part, scheme=a.partition, seed=a.seed)
        return LocalTrainer(self.model_name, self.dataset, idx, lr=self.hparams["lr"],
                            momentum=self.hparams["momentum"], weight_decay=self.hparams["weight_decay"],
                            batch_size=self.hparams["batch_size"], device=self.device, seed=a.seed,
                            data_seed=a.seed * 7919 + part, norm=getattr(a, "norm", "batch"))

    def make_emulator(self, worker, n_workers):
        a = self.args
        return Emulator(a.slowdown or [], worker, n_workers, compute_time=a.compute_time, seed=a.seed)


def progress_bar(ctx, total, desc):
    """A tqdm bar on rank 0 (stderr), or a no-op object elsewhere."""
    if ctx.rank == 0 and ctx.progress:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=0.5, leave=False)

    class _Null:
        def update(self, n=1):
            pass

        def close(self):
            pass
    return _Null()


# ---- end of run: gather, evaluate, summarise ------------------------------------------------------
def report(ctx, logger, trainer, emulator, title, eval_flat="average", bound=None, extra=None,
           workers=None, model_label="averaged model", bound_label="bound from the topology"):
    """Gather every rank's figures on rank 0, evaluate, print the summary table; returns it on rank 0.

    ``eval_flat``: "average" evaluates the average of all ranks' parameters (one Allreduce); an array
    evaluates those parameters (e.g. a parameter server's). ``workers``: the ranks that train (default:
    all); ``bound``: the iteration-gap bound to print beside the measured gap. Collective: every rank
    must call it.
    """
    from mpi4py import MPI

    from hopdec.metrics import format_table, max_iteration_gap

    comm = ctx.comm
    loss, acc = trainer.evaluate() if trainer is not None else (None, None)
    mine = dict(rank=ctx.rank, iterations=logger.iterations, wait_s=logger.wait_s,
                compute_s=logger.compute_s, loss=logger.last_loss, test_loss=loss, test_acc=acc,
                entries=logger.entries, jumps=logger.jumps,
                iter_per_s=logger.progress_rate,
                emulation=emulator.describe(overruns=False) if emulator is not None else "no emulation",
                overruns=emulator.overruns if emulator is not None else 0,
                max_overrun_s=emulator.max_overrun_s if emulator is not None else 0.0,
                **(extra or {}))
    if isinstance(eval_flat, str) and eval_flat == "average":
        buf = trainer.write_params(np.empty(trainer.numel, dtype=np.float32))
        total = np.empty_like(buf)
        comm.Allreduce(buf, total, op=MPI.SUM)
        eval_flat = total / comm.Get_size()
    everyone = comm.gather(mine, root=0)
    if ctx.rank != 0:
        return None
    avg_loss, avg_acc = trainer.evaluate(eval_flat) if eval_flat is not None else (None, None)
    rows = [r for r in everyone if workers is None or r["rank"] in workers]
    table = format_table(
        ["rank", "iters run", "iter/s", "mean wait s", "mean compute s", "jumps", "train loss", "test acc"],
        [[r["rank"], r["iterations"], r["iter_per_s"],
          r["wait_s"] / max(r["iterations"], 1), r["compute_s"] / max(r["iterations"], 1),
          r["jumps"], r["loss"], r["test_acc"]] for r in rows])
    gap = max_iteration_gap([r["entries"] for r in rows])
    emulations = sorted({r["emulation"] for r in rows})
    over = [r for r in rows if r["overruns"]]
    if over:
        emulations.append(f"measured compute exceeded the pad in {sum(r['overruns'] for r in over)} "
                          f"iterations on {len(over)} rank(s), up to {max(r['max_overrun_s'] for r in over):.3g} s "
                          f"(the measured time was used there)")
    lines = [f"== {title} ==", table,
             f"{model_label}: test loss {avg_loss:.4f}, test accuracy {avg_acc:.4f}"
             if avg_acc is not None else "",
             f"largest iteration gap observed: {int(gap.max())}"
             + (f" ({bound_label}: {bound:g})" if bound is not None else ""),
             "times: " + ("EMULATED -- " + "; ".join(emulations) if emulations != ["no emulation"]
                          else "measured, no emulation")]
    text = "\n".join(line for line in lines if line)
    print(text, flush=True)
    return dict(text=text, ranks=everyone, avg_loss=avg_loss, avg_acc=avg_acc, max_gap=int(gap.max()))
