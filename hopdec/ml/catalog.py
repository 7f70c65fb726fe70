"""What a run knows of the built-in models before it builds one, without importing torch: their
hyperparameter presets (Hop sec. 7.2), the model each dataset trains by default, the input shapes of the
datasets known without reading them, and the models' parameter counts on those datasets.

A timing-only ``hopdec sim`` needs no more than this (the message size is 4 bytes per parameter), so it
starts without torch (importing it took about 1.4 s). The counts are a table, not a formula: ``tests/test_catalog.py``
builds every combination with :func:`hopdec.ml.models.parameter_count` and compares, so the table cannot
drift from the models; anything not in it (a model of your own, a dataset read from files) is counted on
the model built to train, or where nothing trains on one built on torch's meta device
(:meth:`hopdec.modes.work.Workload.numel`).
"""

from typing import Dict

from hopdec.errors import ConfigError
from hopdec.ml.registry import DEFAULT_MODEL as _DEFAULT_MODEL

# Defaults per model. vgg11/svm: Hop sec. 7.2. cnn/mlp: measured on digits, iid shards, ring
# gossip (average with both neighbours each step): cnn reaches ~96% test accuracy after 100
# iterations and 97-98% after 200 with 4 or 8 workers; mlp ~95% after 200.
PRESETS: Dict[str, Dict[str, float]] = {
    "vgg11": {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 128},
    "svm": {"lr": 10.0, "momentum": 0.9, "weight_decay": 1e-7, "batch_size": 128},
    "cnn": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 32},
    "mlp": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 32},
    # A small causal transformer on bytes (kjv): AdamW (``momentum`` is its beta1), linear warmup over 5%
    # of the run (at least 10 iterations: 2 made the loss spike from 3.8 to 8.2 at lr 3e-3) then cosine
    # decay to 10% of lr at its last iteration, gradients clipped to norm 1.
    "transformer": {"lr": 3e-3, "momentum": 0.9, "weight_decay": 0.01, "batch_size": 16,
                    "optimizer": "adamw", "beta2": 0.99, "schedule": "warmup-cosine", "warmup": 0.05,
                    "warmup_min": 10,
                    "min_lr_ratio": 0.1, "horizon": 1000, "clip": 1.0},
}

USER_PRESET = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "batch_size": 32}
"""The hyperparameters of a model of your own unless ``--lr`` ... ``--batch-size`` say otherwise (SGD)."""

NORMS = ("batch", "running", "group", "none")
"""vgg11's normalisation after each conv (:mod:`hopdec.ml.models` says what each does)."""

INPUTS = {"digits": ((1, 8, 8), 10), "cifar10": ((3, 32, 32), 10), "kjv": ((128,), 256)}
"""Input shape and classes of the datasets whose model size is known without reading them (kjv: windows
of :data:`hopdec.ml.text.CONTEXT` bytes, a vocabulary of 256)."""

NORMED = ("vgg11",)
"""The built-in models whose size ``--norm`` changes; the others' counts hold for every norm."""

PARAMETERS = {
    ("cnn", "digits", None): 151_306,
    ("cnn", "cifar10", None): 151_882,
    ("vgg11", "cifar10", "batch"): 9_756_426,
    ("vgg11", "cifar10", "running"): 9_756_426,
    ("vgg11", "cifar10", "group"): 9_756_426,
    ("vgg11", "cifar10", "none"): 9_750_922,
    ("svm", "digits", None): 650,
    ("svm", "cifar10", None): 30_730,
    ("svm", "kjv", None): 33_024,
    ("mlp", "digits", None): 9_610,
    ("mlp", "cifar10", None): 394_634,
    ("mlp", "kjv", None): 49_536,
    ("transformer", "kjv", None): 842_496,
}
"""Trainable parameters of ``build_model(model, *INPUTS[dataset], norm)`` for every built-in model that
builds on a dataset of :data:`INPUTS` (norm None: the model has none). The combinations missing here do
not build (vgg11 on 8x8 digits, a cnn on text): they go to torch, which says why."""


def default_model_for(dataset_name: str) -> str:
    """The model the paper pairs with a dataset: digits->cnn, cifar10->vgg11, libsvm->svm."""
    try:
        return _DEFAULT_MODEL[dataset_name]
    except KeyError:
        raise ConfigError(f"--dataset {dataset_name!r}: no default model "
                          f"(known: {', '.join(_DEFAULT_MODEL)})") from None


def known_parameter_count(model, dataset, norm="batch"):
    """The parameter count of a built-in ``model`` on a built-in ``dataset`` from :data:`PARAMETERS`, or
    None when it is not there (then build the model to count it)."""
    if norm not in NORMS:
        return None
    return PARAMETERS.get((model, dataset, norm if model in NORMED else None))


def steps_per_epoch(n_indices: int, batch_size: int) -> int:
    """Mini-batches in one pass over ``n_indices`` samples (the last partial batch counts)."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    return max(1, -(-int(n_indices) // int(batch_size)))
