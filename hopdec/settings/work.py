"""What every worker computes: the data, the model, the optimiser and how long (``hopdec train``'s
"model and data" options). Resolving them -- the model a dataset defaults to, the presets, iterations from
``--epochs`` -- needs the data and torch: :mod:`hopdec.modes.work` does it, once."""

import os
from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.ml.registry import DATASETS, DEFAULT_MODEL, MODELS, check_name, is_entry_point
from hopdec.settings.base import INT_AT_LEAST_1, Group, Rule, between, is_finite, is_int, not_empty, option

SEED_LIMIT = 2 ** 32
"""Seeds are 0..2**32-1: the emulator's random draws keep 32 bits of the seed, so larger seeds collide."""
DEFAULT_ITERATIONS = 200
"""Iterations per worker when neither ``--iterations`` nor ``--epochs`` is given."""
MAX_ITERATIONS = 10 ** 9
"""More iterations than any run finishes (a billion 1 ms iterations take 12 days); larger numbers only
overflow the counters of the logs and checkpoints or run until killed."""
MAX_EPOCHS = 10 ** 6
MAX_LR = 1e3
"""A step of lr x gradient larger than this overflows float32 within a few iterations for any model (the
presets use 0.003..10)."""
MAX_WEIGHT_DECAY = 1e3
MAX_BATCH = 2 ** 24
"""Samples per mini-batch: more than any shard held in memory."""


@dataclass(frozen=True)
class Work(Group):
    """The data, model and optimiser of a run (None: the model's preset), and its length."""

    iterations: int = option("--iterations", None, between(1, MAX_ITERATIONS, "an integer", integer=True),
                             "iterations per worker (default 200)")
    epochs: float = option("--epochs", None, between(0, MAX_EPOCHS, low_open=True),
                           "instead of --iterations: passes over each shard")
    lr: float = option("--lr", None, between(0, MAX_LR, low_open=True), "learning rate")
    momentum: float = option("--momentum", None, Rule("a number in [0, 1)",
                                                      lambda x: is_finite(x) and 0 <= x < 1), "SGD momentum")
    weight_decay: float = option("--weight-decay", None, between(0, MAX_WEIGHT_DECAY), "L2 weight decay")
    batch_size: int = option("--batch-size", None, between(1, MAX_BATCH, "an integer", integer=True),
                             "mini-batch size per worker")
    seed: int = option("--seed", 0, Rule(f"an integer in 0..{SEED_LIMIT - 1}",
                                         lambda x: is_int(x) and 0 <= x < SEED_LIMIT),
                       "seed of the initial model, the data order and the emulated slowdowns")
    threads: int = option("--threads", None, INT_AT_LEAST_1, "torch threads per rank")
    dataset: str = option("--dataset", "digits", doc="digits, cifar10, libsvm, kjv, or module:factory (yours)")
    data_dir: str = option("--data-dir", None, not_empty(), "cifar10: folder with the python batches")
    data_path: str = option("--data-path", None, not_empty(), "libsvm: training file")
    test_path: str = option("--test-path", None, not_empty(), "libsvm: test file")
    model: str = option("--model", doc="None: the dataset's model (digits: cnn, cifar10: vgg11, libsvm: svm); "
                                       "module:factory: yours")
    norm: str = option("--norm", "batch", doc="vgg11 normalisation")
    partition: str = option("--partition", "iid", doc="how the training set is split over the workers")
    device: str = option("--device", "auto", doc="cpu, cuda, cuda:N or auto (a real run's)")
    cuda_aware_mpi: str = option("--cuda-aware-mpi", "auto", doc="hand device buffers to MPI (auto, yes, no)")

    def __post_init__(self):
        if self.iterations is not None and self.epochs is not None:
            raise ConfigError("--iterations and --epochs: give one, not both")
        super().__post_init__()

    def check(self):
        for opt, name, builtins in (("--dataset", self.dataset, DATASETS), ("--model", self.model, MODELS)):
            if name is not None:
                why = check_name(name, opt, builtins)
                if why:
                    raise ConfigError(f"{opt} {name!r}: {why}")
        if self.model is None and self.dataset not in DEFAULT_MODEL:
            raise ConfigError(f"--dataset {self.dataset}: a dataset of your own has no default model; give "
                              f"--model ({', '.join(MODELS)}, or module:factory for one of your own)")
        cores = os.cpu_count() or 1
        if self.threads is not None and self.threads > cores:
            raise ConfigError(f"--threads {self.threads}: this host has {cores} cores; more torch threads "
                              f"per rank than cores only slows every rank down")

    @property
    def model_name(self):
        """The model this run trains: ``--model``, else the dataset's default (no torch needed)."""
        return self.model or DEFAULT_MODEL[self.dataset]

    @property
    def user_code(self):
        """Whether the model or the dataset is a factory of the user's own (``module:factory``)."""
        return is_entry_point(self.dataset) or is_entry_point(self.model_name)

    def ignores(self, run):
        out = {}
        if self.dataset != "cifar10":
            out["--data-dir"] = "only --dataset cifar10 reads it"
        if self.dataset != "libsvm":
            out["--data-path"] = out["--test-path"] = "only --dataset libsvm reads it"
        if self.model_name != "vgg11":
            out["--norm"] = "only --model vgg11 has a normalisation choice"
        return out

    def overrides(self):
        """The hyperparameters given on the command line (the others come from the model's preset)."""
        return {k: getattr(self, k) for k in ("lr", "momentum", "weight_decay", "batch_size")
                if getattr(self, k) is not None}
