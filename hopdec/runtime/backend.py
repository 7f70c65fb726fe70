"""The worker loop's compute backend on torch: a :class:`~hopdec.ml.trainer.LocalTrainer` plus emulated
heterogeneity (:mod:`hopdec.runtime.heterogeneity`), a check that training has not diverged, and the
tests' fault injection (:mod:`hopdec.runtime.faults`)."""

import math
import time

import torch

from hopdec.runtime.failures import RunError


class TorchBackend:
    """Adapts a :class:`LocalTrainer` and an :class:`Emulator` to the worker loops' backend interface."""

    def __init__(self, trainer, emulator, faults=None):
        self.t, self.emu, self.faults = trainer, emulator, faults
        self.send_storage = trainer.send_storage
        self.spare_storage = trainer.spare_storage

    def write_params(self, out=None):
        return self.t.write_params(out)

    def compute(self, iteration):
        if self.faults is not None:
            self.faults.at("train", iteration)
        t0 = time.perf_counter()
        loss = self.t.compute()
        if not math.isfinite(loss):
            raise RunError(f"the training loss became {loss} at iteration {iteration}: training diverged "
                           f"(a smaller --lr may help)")
        if self.t.device.type == "cuda":
            torch.cuda.synchronize(self.t.device)
        measured = time.perf_counter() - t0
        total, factor = self.emu.run(iteration, measured)
        return {"loss": loss, "compute_s": total, "measured_compute_s": measured, "slowdown": factor}

    def reduce(self, pairs):
        self.t.reduce(pairs)

    def apply(self, iteration):
        self.t.apply(iteration)
