"""What every worker computes: the data, the model, the optimiser and how long (``hopdec train``'s
"model and data" options). Resolving them -- the model a dataset defaults to, the presets, iterations from
``--epochs`` -- needs the data and torch: :mod:`hopdec.modes.work` does it, once."""

import os
from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import (INT_AT_LEAST_1, NON_NEGATIVE, POSITIVE, Group, Rule, is_finite, is_int,
                                  option)

SEED_LIMIT = 2 ** 32
"""Seeds are 0..2**32-1: the emulator's random draws keep 32 bits of the seed, so larger seeds collide."""
DEFAULT_ITERATIONS = 200
"""Iterations per worker when neither ``--iterations`` nor ``--epochs`` is given."""


@dataclass(frozen=True)
class Work(Group):
    """The data, model and optimiser of a run (None: the model's preset), and its length."""

    iterations: int = option("--iterations", None, INT_AT_LEAST_1, "iterations per worker (default 200)")
    epochs: float = option("--epochs", None, POSITIVE, "instead of --iterations: passes over each shard")
    lr: float = option("--lr", None, POSITIVE, "learning rate")
    momentum: float = option("--momentum", None, Rule("a number in [0, 1)",
                                                      lambda x: is_finite(x) and 0 <= x < 1), "SGD momentum")
    weight_decay: float = option("--weight-decay", None, NON_NEGATIVE, "L2 weight decay")
    batch_size: int = option("--batch-size", None, INT_AT_LEAST_1, "mini-batch size per worker")
    seed: int = option("--seed", 0, Rule(f"an integer in 0..{SEED_LIMIT - 1}",
                                         lambda x: is_int(x) and 0 <= x < SEED_LIMIT),
                       "seed of the initial model, the data order and the emulated slowdowns")
    threads: int = option("--threads", None, INT_AT_LEAST_1, "torch threads per rank")
    dataset: str = option("--dataset", "digits", doc="digits, cifar10 or libsvm")
    data_dir: str = option("--data-dir", doc="cifar10: folder with the python batches")
    data_path: str = option("--data-path", doc="libsvm: training file")
    test_path: str = option("--test-path", doc="libsvm: test file")
    model: str = option("--model", doc="None: the dataset's model (digits: cnn, cifar10: vgg11, libsvm: svm)")
    norm: str = option("--norm", "batch", doc="vgg11 normalisation")
    partition: str = option("--partition", "iid", doc="how the training set is split over the workers")
    device: str = option("--device", "auto", doc="cpu, cuda, cuda:N or auto (a real run's)")
    cuda_aware_mpi: str = option("--cuda-aware-mpi", "auto", doc="hand device buffers to MPI (auto, yes, no)")

    def __post_init__(self):
        if self.iterations is not None and self.epochs is not None:
            raise ConfigError("--iterations and --epochs: give one, not both")
        super().__post_init__()

    def check(self):
        cores = os.cpu_count() or 1
        if self.threads is not None and self.threads > cores:
            raise ConfigError(f"--threads {self.threads}: this host has {cores} cores; more torch threads "
                              f"per rank than cores only slows every rank down")

    def overrides(self):
        """The hyperparameters given on the command line (the others come from the model's preset)."""
        return {k: getattr(self, k) for k in ("lr", "momentum", "weight_decay", "batch_size")
                if getattr(self, k) is not None}
