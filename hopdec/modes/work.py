"""What every worker computes, resolved from the settings once: the model (a dataset's default one), its
hyperparameters (the preset, with the options given), the data, the number of iterations (from
``--epochs`` when given), and one trainer per shard. Every mode and every executor makes its trainers
here, so a worker of a simulated run starts from exactly the model and shard a real rank does."""

import os
from dataclasses import dataclass, field

import numpy as np

from hopdec.errors import ConfigError
from hopdec.ml.catalog import (INPUTS, PRESETS, USER_PRESET, default_model_for, known_parameter_count,
                               steps_per_epoch)
from hopdec.settings.work import DEFAULT_ITERATIONS


@dataclass
class Workload:
    """The resolved work of a run. ``dataset`` is None when it was not loaded (a simulation that times
    messages without training)."""

    settings: object                # hopdec.settings.Work
    model: str
    hparams: dict                   # lr, momentum, weight_decay, batch_size
    iterations: int
    dataset: object = None
    _layout: list = field(default=None, init=False, repr=False, compare=False)

    def trainer(self, part, parts, device="cpu"):
        """A trainer on shard ``part`` of ``parts`` (the same initial model on every worker)."""
        from hopdec.ml.data import partition
        from hopdec.ml.trainer import LocalTrainer
        w, hp = self.settings, self.hparams
        idx = partition(self.dataset.train_y, parts, part, scheme=w.partition, seed=w.seed)
        return LocalTrainer(self.model, self.dataset, idx, lr=hp["lr"], momentum=hp["momentum"],
                            weight_decay=hp["weight_decay"], batch_size=hp["batch_size"], device=device,
                            seed=w.seed, data_seed=w.seed * 7919 + part, norm=w.norm,
                            iterations=self.iterations)

    def numel(self):
        """Trainable parameters of the model: of a built-in model on a dataset of known shape, from
        :data:`hopdec.ml.catalog.PARAMETERS` (no torch: a timing-only simulation never imports it); else
        counted on torch's meta device (no memory, no training)."""
        w = self.settings
        if self.dataset is None:
            known = known_parameter_count(self.model, w.dataset, w.norm)
            if known is not None:
                return known
        return self.layout()[0]

    def layout(self):
        """The :func:`~hopdec.ml.models.tensor_layout` of the model's trainable parameters (meta device;
        built once: the buffers' size check and the ranks' agreement both ask)."""
        if self._layout is None:
            self._layout = self._build_layout()
        return self._layout

    def _build_layout(self):
        from hopdec.ml.models import parameter_layout
        if self.dataset is not None:
            shape, classes = self.dataset.input_shape, self.dataset.num_classes
        elif self.settings.dataset in INPUTS:
            shape, classes = INPUTS[self.settings.dataset]
        else:
            d = load(self.settings)
            shape, classes = d.input_shape, d.num_classes
        return parameter_layout(self.model, shape, classes, norm=self.settings.norm)


def load(work):
    """The dataset the settings name (read, checked)."""
    from hopdec.ml.data import load_dataset
    return load_dataset(work.dataset, data_dir=work.data_dir, path=work.data_path, test_path=work.test_path,
                        seed=work.seed)


def resolve(work, n_workers, load_data=True):
    """The :class:`Workload` of ``work`` (:class:`hopdec.settings.Work`) for ``n_workers`` workers.
    ``load_data``: read the dataset even when nothing here needs it (``--epochs`` does)."""
    model = work.model or default_model_for(work.dataset)
    hparams = dict(PRESETS.get(model, USER_PRESET))     # a model of your own: plain SGD unless told
    hparams.update(work.overrides())
    dataset = load(work) if load_data or work.epochs is not None else None
    if dataset is not None and len(dataset.train_y) // n_workers < 1:
        raise ConfigError(f"--dataset {work.dataset}: {len(dataset.train_y)} training samples cannot give "
                          f"each of the {n_workers} workers a shard (at least one sample each)")
    if work.iterations is None and work.epochs is not None:
        shard = len(dataset.train_y) // n_workers
        iterations = max(1, int(round(work.epochs * steps_per_epoch(shard, hparams["batch_size"]))))
    else:
        iterations = work.iterations or DEFAULT_ITERATIONS
    return Workload(work, model, hparams, iterations, dataset)


def params_path(log_dir, rank):
    """Where ``--save-models`` puts rank ``rank``'s final flat parameters."""
    return os.path.join(log_dir, f"params_rank{rank}.npy")


def save_params(log_dir, rank, params):
    from hopdec.files import writing
    with writing(params_path(log_dir, rank)):
        np.save(params_path(log_dir, rank), params)
