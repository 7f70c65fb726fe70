"""A model or dataset of your own in ``hopdec train`` and ``hopdec sim --math``: ``--model pkg.module:factory``
and ``--dataset pkg.module:factory`` (or ``path/to/file.py:factory``), named as uvicorn and setuptools
entry points name objects.

Contracts (a factory breaking one is one line naming the option, never a traceback):

* **model**: ``factory(input_shape, num_classes)`` or ``factory()`` ``-> torch.nn.Module``; the module's output is logits over
  the last dimension (a classifier's ``(batch, classes)``, a language model's ``(batch, time, vocab)``).
  The loss is the module's own ``loss(output, target)`` method when it has one, else cross-entropy over the
  last dimension; accuracy compares ``output.argmax(-1)`` with the target.
* **dataset**: ``factory()`` or ``factory(seed)`` returning a :class:`hopdec.ml.data.Dataset` or
  ``(train_x, train_y, test_x, test_y)`` (tensors or numpy arrays; y holds class indices; ``num_classes``
  is then ``max(y) + 1``). Every rank calls it with the same seed and must get the same data.

The code runs because the command line names it (a file or module of the user's); nothing read from a
log, checkpoint or topology file is ever imported.
"""

import importlib
import importlib.util
import inspect
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from hopdec.errors import ConfigError
from hopdec.ml.catalog import USER_PRESET  # noqa: F401  (torch-free, re-exported)
from hopdec.ml.registry import ENTRY_POINT



def _one_line(err):
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")


def load_object(spec, option):
    """The object ``module:attr`` or ``file.py:attr`` names (ConfigError naming ``option``)."""
    m = ENTRY_POINT.match(spec or "")
    if m is None:
        raise ConfigError(f"{option} {spec!r}: expected module:factory or path/to/file.py:factory")
    module_name, attr = m.group("module"), m.group("attr")
    try:
        if module_name.endswith(".py"):
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise ConfigError(f"{option} {spec}: no such file {module_name}")
            name = "hopdec_user_" + os.path.splitext(os.path.basename(path))[0]
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != path:
                loader_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = module
                loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.append(os.getcwd())        # like ``python -m``: modules in the working directory
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as err:                        # the user's module failed to import: say where
        raise ConfigError(f"{option} {spec}: cannot import {module_name} ({_one_line(err)})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{option} {spec}: {module_name} has no {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{option} {spec}: {attr} is not callable (a factory function or class)")
    return obj


def _takes_arguments(factory, unknown):
    """Whether a factory declares any parameter (``make()`` is called bare, like a class with no arguments);
    ``unknown`` where its signature cannot be read."""
    try:
        return bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return unknown


def build(spec, input_shape, num_classes):
    """A fresh model from the factory ``spec`` names (call ``torch.manual_seed`` first)."""
    factory = load_object(spec, "--model")
    args = (tuple(int(s) for s in input_shape), int(num_classes)) if _takes_arguments(factory, True) else ()
    try:
        model = factory(*args)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"--model {spec}: the factory raised {_one_line(err)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"--model {spec}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"--model {spec}: the model has no trainable parameters")
    _check_tensors(spec, model)
    return model


def _check_tensors(spec, model):
    """What one flat float32 buffer can hold: trainable parameters of float32 (a float64 model was cast to
    float32 by the buffer and failed in its forward mid-run, naming no option) and no lazy module's tensor
    left uninitialized (it failed on "Can't access the shape of an uninitialized parameter")."""
    from torch.nn.parameter import UninitializedTensorMixin
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if isinstance(t, UninitializedTensorMixin):
            raise ConfigError(f"--model {spec}: {name} is not initialized (a lazy module such as LazyLinear): "
                              f"build it with the sizes the factory is given (input_shape), since hopdec lays every "
                              f"parameter out in one buffer before any forward")
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            raise ConfigError(f"--model {spec}: {name} is {p.dtype}: hopdec trains float32 parameters (one "
                              f"float32 buffer, float32 messages); build the model in float32")


def check_output(spec, model, dataset, device="cpu"):
    """The contract on the model's output, on two test samples before any training: a tensor of class scores
    over the last dimension, one per target (``target.shape + (classes,)``), at least ``num_classes`` of
    them. A tuple or dict output trained (its own ``loss`` read it) and then failed at the first evaluation,
    after the whole run; a 1-D output (regression) was scored 0% accurate; too few scores failed in
    cross-entropy as an IndexError naming no option. ConfigError naming ``--model`` otherwise."""
    from hopdec.ml.trainer import _down
    x, y = dataset.test_x[:2], dataset.test_y[:2]
    if len(y) == 0:
        return
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(_down(x, torch.device(device), "the output check"))
    except Exception as err:
        raise ConfigError(f"--model {spec}: the model raised {_one_line(err)} on two samples of the dataset "
                          f"(inputs of shape {tuple(x.shape)})") from None
    finally:
        model.train(was)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"--model {spec}: the model's output is a {type(out).__name__}, not a tensor of class "
                          f"scores; hopdec takes the loss and the accuracy from the scores over its last dimension, "
                          f"so forward must return them")
    want = tuple(y.shape) + (int(dataset.num_classes),)
    if out.dim() != len(want) or tuple(out.shape[:-1]) != want[:-1]:
        raise ConfigError(f"--model {spec}: output of shape {tuple(out.shape)} for targets of shape "
                          f"{tuple(y.shape)}: expected class scores over the last dimension, {want} (targets are "
                          f"class indices: a binary classifier gives 2 scores, not 1 logit; regression is not "
                          f"supported)")
    if out.shape[-1] < want[-1]:
        raise ConfigError(f"--model {spec}: {out.shape[-1]} score(s) per sample for the dataset's "
                          f"{want[-1]} classes (targets up to {want[-1] - 1})")


class UserLoss(torch.nn.Module):
    """The model's own ``loss(output, target)``, else cross-entropy over the last dimension."""

    def __init__(self, model=None):
        super().__init__()
        self.own = getattr(model, "loss", None) if model is not None else None

    def forward(self, out, target):
        if self.own is not None:
            return self.own(out, target)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _tensor(a, what, spec):
    try:
        return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    except Exception as err:
        raise ConfigError(f"--dataset {spec}: {what} is not an array ({_one_line(err)})") from None


def load(spec, seed=0):
    """The :class:`~hopdec.ml.data.Dataset` the factory ``spec`` makes, checked."""
    from hopdec.ml.data import Dataset
    factory = load_object(spec, "--dataset")
    try:
        got = factory(seed) if _takes_arguments(factory, False) else factory()
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"--dataset {spec}: the factory raised {_one_line(err)}") from None
    if isinstance(got, Dataset):
        parts = (got.train_x, got.train_y, got.test_x, got.test_y)
        classes = got.num_classes
    elif isinstance(got, (tuple, list)) and len(got) == 4:
        parts, classes = got, None
    else:
        raise ConfigError(f"--dataset {spec}: the factory returned {type(got).__name__}; expected a "
                          f"hopdec.ml.data.Dataset or (train_x, train_y, test_x, test_y)")
    names = ("train_x", "train_y", "test_x", "test_y")
    tx, ty, vx, vy = (_tensor(a, n, spec) for a, n in zip(parts, names))
    if tx.is_floating_point():
        tx, vx = tx.float(), vx.float()
    if ty.is_floating_point() or vy.is_floating_point():
        raise ConfigError(f"--dataset {spec}: train_y and test_y must hold class indices (integers)")
    ty, vy = ty.long(), vy.long()
    for x, y, which in ((tx, ty, "train"), (vx, vy, "test")):
        if len(x) == 0 or len(x) != len(y):
            raise ConfigError(f"--dataset {spec}: {which}_x has {len(x)} samples and {which}_y {len(y)} "
                              f"(need the same number, at least one)")
    if tuple(tx.shape[1:]) != tuple(vx.shape[1:]):
        raise ConfigError(f"--dataset {spec}: train_x samples have shape {tuple(tx.shape[1:])}, test_x "
                          f"{tuple(vx.shape[1:])}")
    if tx.is_floating_point() and not (torch.isfinite(tx).all() and torch.isfinite(vx).all()):
        raise ConfigError(f"--dataset {spec}: the features hold NaN or infinite values")
    low = min(int(ty.min()), int(vy.min()))
    if low < 0:
        raise ConfigError(f"--dataset {spec}: a label is {low}; labels are class indices >= 0")
    top = max(int(ty.max()), int(vy.max())) + 1
    classes = int(classes) if classes is not None else max(top, 2)
    if top > classes:
        raise ConfigError(f"--dataset {spec}: a label is {top - 1} but num_classes is {classes}")
    return Dataset(tx, ty, vx, vy, classes, tuple(int(s) for s in tx.shape[1:]), spec)
