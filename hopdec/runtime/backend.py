"""The worker loop's compute backend on torch: a :class:`~hopdec.ml.trainer.LocalTrainer` plus emulated
heterogeneity (:mod:`hopdec.runtime.heterogeneity`) and the tests' fault injection."""

import os
import time

import torch


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
