"""The loops' compute backends on torch: :class:`TorchBackend` (a :class:`~hopdec.ml.trainer.LocalTrainer`
plus emulated heterogeneity (:mod:`hopdec.heterogeneity`), a check that training has not diverged, and the
tests' fault injection (:mod:`hopdec.runtime.faults`)); for the parameter-server mode, a worker's
(:class:`WorkerBackend`: loading weights, ESync's model differences) and the server's model
(:class:`ServerModel`). The simulator's ``--math`` runs the same classes in virtual time."""

import math
import time

import numpy as np

from hopdec.errors import RunError
from hopdec.ml import transfers
from hopdec.transport.waiting import count_resumes, resumes


def check_loss(loss, iteration, who=""):
    """RunError when the training loss is NaN or infinite (training diverged); ``who``: a prefix naming the
    worker where the error line does not (the simulator's; under MPI the line names the rank)."""
    if not math.isfinite(loss):
        raise RunError(f"{who}the training loss became {loss} at iteration {iteration}: training diverged "
                       f"(a smaller --lr may help)")


class TorchBackend:
    """Adapts a :class:`LocalTrainer` and an :class:`Emulator` to the worker loops' backend interface."""

    def __init__(self, trainer, emulator, faults=None):
        self.t, self.emu, self.faults = trainer, emulator, faults
        self.send_storage = trainer.send_storage
        self.spare_stores = trainer.spare_stores
        self.add_store = trainer.add_store
        self._last = 0.0                    # the last compute measured without a pause in it
        if emulator.active:
            count_resumes()

    def _unpaused(self, measured, resumed):
        """``measured`` seconds of compute, or, when the process was paused meanwhile (``resumes()`` is no
        longer ``resumed``: Ctrl-Z, Slurm's suspend), the last compute measured without a pause. The
        emulated slowdown multiplies the measured compute: a 4x straggler paused for 8 s inside its compute
        slept 24 s after it resumed, and its neighbours timed out on it."""
        if resumes() != resumed:
            return self._last
        self._last = measured
        return measured

    def write_params(self, out=None):
        return self.t.write_params(out)

    def compute(self, iteration):
        if self.faults is not None:
            self.faults.at("train", iteration)
        if getattr(self.t, "local", None) is not None:
            return self._compute_round(iteration)
        t0, r0 = time.perf_counter(), resumes()
        loss = self.t.compute()
        self._check(loss, iteration)
        measured = self._unpaused(time.perf_counter() - t0, r0)
        total, factor = self.emu.run(iteration, measured)
        return {"loss": loss, "compute_s": total, "measured_compute_s": measured, "slowdown": factor}

    def _check(self, loss, iteration):
        check_loss(loss, iteration)
        if self.t.device.type == "cuda":
            import torch                        # here, not at the top: the simulator's timing-only runs
            torch.cuda.synchronize(self.t.device)   # import this module (hopdec.sim.backends) without torch

    def _compute_round(self, k):
        """Round k's inner steps (``--local-steps``): each mini-batch is emulated as an iteration is
        (``--compute-time`` pads each, ``--slowdown`` draws per inner step); the record has the round's
        mean loss, its inner steps (``inner_steps``, from ``first_step``) and their summed times."""
        total = measured = 0.0
        losses, factors, first = [], [], None
        t0, r0 = time.perf_counter(), resumes()
        for s, loss in self.t.compute_round(k):
            self._check(loss, f"{s} (round {k})")
            m = self._unpaused(time.perf_counter() - t0, r0)
            t, f = self.emu.run(s, m)
            total, measured = total + t, measured + m
            losses.append(loss)
            factors.append(f)
            first = s if first is None else first
            t0, r0 = time.perf_counter(), resumes()
        return {"loss": sum(losses) / len(losses), "compute_s": total, "measured_compute_s": measured,
                "slowdown": max(factors), "inner_steps": len(losses), "first_step": first}

    def reduce(self, pairs, into=None):
        self.t.reduce(pairs, into=into)

    def apply(self, iteration):
        self.t.apply(iteration)


def combine(pairs, out, scratch):
    """out <- sum(weight * buffer) over ``pairs = [(buffer, weight)]``, in the order given (float32)."""
    (b0, a0), rest = pairs[0], pairs[1:]
    np.copyto(out, b0)
    if a0 != 1.0:
        out *= np.float32(a0)
    for b, a in rest:
        if a == 1.0:
            out += b
        else:
            np.multiply(b, np.float32(a), out=scratch)
            out += scratch
    return out


class ServerModel:
    """The server's weights and optimizer: a :class:`~hopdec.ml.trainer.LocalTrainer` (SGD with momentum
    and weight decay on one flat tensor) that applies combined gradients or adds model differences."""

    def __init__(self, trainer):
        import torch
        self.torch, self.t = torch, trainer
        self.P = trainer.numel
        self.cpu = trainer.device.type == "cpu"
        self.grad = trainer.flat.grad.numpy() if self.cpu else np.zeros(self.P, dtype=np.float32)
        self.scratch = np.zeros(self.P, dtype=np.float32)
        self.delta = np.zeros(self.P, dtype=np.float32)

    def apply_gradients(self, pairs):
        combine(pairs, self.grad, self.scratch)
        if not self.cpu:
            transfers.to_device(self.grad.nbytes, "gradient")
            self.t.flat.grad.copy_(self.torch.from_numpy(self.grad).to(self.t.device))
        self.t.apply()

    def add_deltas(self, pairs):                  # ESync: w += sum(1/p * delta), global learning rate 1
        combine(pairs, self.delta, self.scratch)
        if not self.cpu:
            transfers.to_device(self.delta.nbytes, "gradient")
        with self.torch.no_grad():
            self.t.flat.add_(self.torch.from_numpy(self.delta).to(self.t.device))

    def write_params(self, out):
        self.t.write_params(out)


class WorkerBackend:
    """A PS worker's torch side: the shared :class:`~hopdec.runtime.backend.TorchBackend` (compute with
    emulation, SGD step) plus loading weights and forming ESync's model difference."""

    def __init__(self, backend):
        self.b, self.t = backend, backend.t
        self.cpu = self.t.device.type == "cpu"
        self.kept = np.zeros(self.t.numel, dtype=np.float32)
        self.diff = np.zeros(self.t.numel, dtype=np.float32)

    def compute(self, iteration):
        return self.b.compute(iteration)

    def apply(self, iteration):
        self.b.apply(iteration)

    def load_params(self, buf):
        self.t.load_params(buf)

    def keep_params(self):
        self.t.write_params(self.kept)

    def gradient(self):
        g = self.t.flat.grad
        if self.cpu:
            return g.numpy()
        transfers.to_host(g.numel() * 4, "gradient")
        return g.detach().cpu().numpy()

    def delta(self):
        self.t.write_params(self.diff)
        self.diff -= self.kept
        return self.diff
