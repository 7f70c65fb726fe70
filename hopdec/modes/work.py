"""What every worker computes, resolved from the settings once: the model (a dataset's default one), its
hyperparameters (the preset, with the options given), the data, the number of iterations (from
``--epochs`` when given), and one trainer per shard. Every mode and every executor makes its trainers
here, so a worker of a simulated run starts from exactly the model and shard a real rank does.

The model is built once per process, since a factory of a user's (``--model module:factory``) may download
or load weights, or print: a run that trains counts and lays out the model it trains; one that only times
messages counts on torch's meta device."""

import copy
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
    trains: bool = False
    """This process trains (a rank of ``hopdec train``, ``hopdec sim --math``): :meth:`layout` and
    :meth:`numel` read the model built for it; else they build one on torch's meta device."""
    notes: tuple = ()
    """Lines to print once before training (:func:`small_shard_note`)."""
    copies: bool = False
    """This process makes several trainers (a simulation's workers): each gets a copy of the one model
    built, which is kept; else the first trainer takes it (a rank's: no second copy in memory)."""
    _layout: list = field(default=None, init=False, repr=False, compare=False)
    _built: object = field(default=None, init=False, repr=False, compare=False)
    _rng: tuple = field(default=None, init=False, repr=False, compare=False)

    def trainer(self, part, parts, device="cpu", model=None):
        """A trainer on shard ``part`` of ``parts`` (the same initial model on every worker:
        :meth:`initial_model`, unless ``model`` is given)."""
        from hopdec.ml.data import partition
        from hopdec.ml.trainer import LocalTrainer
        w, hp = self.settings, self.hparams
        idx = partition(self.dataset.train_y, parts, part, scheme=w.partition, seed=w.seed)
        model = self.initial_model() if model is None else model
        self._restore_rng()                 # where building the model left it, as if it was just built
        return LocalTrainer(self.model, self.dataset, idx, lr=hp["lr"], momentum=hp["momentum"],
                            weight_decay=hp["weight_decay"], batch_size=hp["batch_size"], device=device,
                            seed=w.seed, data_seed=w.seed * 7919 + part, norm=w.norm,
                            iterations=self.iterations, model=model)

    def evaluator(self, trainer, part, parts, device="cpu"):
        """``flat -> (loss, accuracy)`` on a model of its own (rank 0's evaluation of the workers' average,
        while its worker's parameters may be in flight): a copy of ``trainer``'s model, whose values each
        call replaces, so it costs no second factory call."""
        return self.trainer(part, parts, device, model=_copy(trainer.model)).evaluate

    def initial_model(self):
        """The model every worker starts from (``torch.manual_seed(seed)``, then built), built once per
        process; the first trainer takes it, or (:attr:`copies`) each gets a copy. A second trainer in a
        process without :attr:`copies` builds another."""
        model = self._built if self._built is not None else self._build()
        if self.copies:
            self._built = model
            return _copy(model) or self._build()
        self._built = None
        return model

    def _build(self):
        import torch

        from hopdec.ml.models import build_model, tensor_layout
        w = self.settings
        torch.manual_seed(w.seed)                   # same seed on every rank: identical initial model
        model = build_model(self.model, self.dataset.input_shape, self.dataset.num_classes, norm=w.norm)
        self._rng = (torch.get_rng_state(),
                     torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        if self._layout is None:
            self._layout = tensor_layout([p for p in model.parameters() if p.requires_grad])
        return model

    def _restore_rng(self):
        """Put torch's random state where building the model left it (dropout's draws then come out as
        they did when every trainer built its own model)."""
        import torch
        torch.manual_seed(self.settings.seed)
        if self._rng is not None:
            cpu, cuda = self._rng
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def numel(self):
        """Trainable parameters of the model: of a built-in model on a dataset of known shape, from
        :data:`hopdec.ml.catalog.PARAMETERS` (no torch: a timing-only simulation never imports it; nothing
        built before the buffers' size check); else counted by :meth:`layout`."""
        w = self.settings
        known = known_parameter_count(self.model, w.dataset, w.norm)
        return known if known is not None else self.layout()[0]

    def layout(self):
        """The :func:`~hopdec.ml.models.tensor_layout` of the model's trainable parameters (found once: the
        buffers' size check and the ranks' agreement both ask): of the model built to train
        (:attr:`trains`), else of one built on torch's meta device (no memory, no training)."""
        if self._layout is None:
            if self.trains:
                self._built = self._build()
            else:
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


def resolve(work, n_workers, load_data=True, trains=False, copies=False):
    """The :class:`Workload` of ``work`` (:class:`hopdec.settings.Work`) for ``n_workers`` workers.
    ``load_data``: read the dataset even when nothing here needs it (``--epochs`` does); ``trains`` and
    ``copies``: see :class:`Workload` (``trains`` needs the data)."""
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
    trains = trains and dataset is not None
    note = trains and small_shard_note(len(dataset.train_y), n_workers, hparams["batch_size"])
    return Workload(work, model, hparams, iterations, dataset, trains=trains, copies=copies,
                    notes=(note,) if note else ())


def small_shard_note(samples, workers, batch_size):
    """The note on shards smaller than a batch, or None: a worker's batches are then its whole shard, and a
    user who asked for 128 trained on 62 without a word. (Every shard holds a sample: :func:`resolve`.)"""
    smallest = samples // workers                   # shards differ by at most one (hopdec.ml.data.partition)
    if smallest >= batch_size:
        return None
    if workers == 1:
        return (f"the training set holds {samples} samples, fewer than --batch-size {batch_size}: every batch "
                f"is the whole set, {samples} samples, not {batch_size}")
    return (f"the smallest shard holds {smallest} training samples ({samples} over {workers} workers), fewer "
            f"than --batch-size {batch_size}: its batches are the whole shard, {smallest} samples, not "
            f"{batch_size} (a --batch-size of at most {smallest}, or fewer workers, gives the batches asked for)")


def _copy(model):
    """A deep copy of ``model``; None where it cannot be copied (a module holding a lock or an open file:
    the factory is then called again)."""
    try:
        return copy.deepcopy(model)
    except Exception:
        return None


def params_path(log_dir, rank):
    """Where ``--save-models`` puts rank ``rank``'s final flat parameters."""
    return os.path.join(log_dir, f"params_rank{rank}.npy")


def save_params(log_dir, rank, params):
    from hopdec.files import writing
    with writing(params_path(log_dir, rank)):
        np.save(params_path(log_dir, rank), params)
