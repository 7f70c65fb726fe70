"""A model and a dataset of your own in ``hopdec train`` and ``hopdec sim --math`` (README: "Your own model
and data in hopdec train"):

    mpirun -n 4 hopdec train --model examples/my_model.py:make_model --dataset examples/my_model.py:make_data \
        --iterations 200 --log-dir runs/mine

A factory may also live in any importable module (``--model mypackage.models:make_model``).
"""

import numpy as np
import torch
from torch import nn


def make_model(input_shape, num_classes):
    """``--model``: called with the dataset's sample shape and number of classes; returns a torch module
    whose output is logits over the last dimension (the loss is cross-entropy unless the module has a
    ``loss(output, target)`` method)."""
    features = int(np.prod(input_shape))
    return nn.Sequential(nn.Flatten(), nn.Linear(features, 64), nn.Tanh(), nn.Linear(64, num_classes))


def make_data(seed):
    """``--dataset``: returns (train_x, train_y, test_x, test_y); every rank calls it with the same seed
    and must get the same data (hopdec splits the training set over the workers). Here: two noisy
    spirals, 2-D points in 2 classes."""
    rng = np.random.default_rng(seed)

    def spirals(n):
        t = rng.uniform(0.5, 3 * np.pi, n)
        y = rng.integers(0, 2, n)
        r = t / (3 * np.pi)
        x = np.stack([r * np.cos(t + np.pi * y), r * np.sin(t + np.pi * y)], axis=1)
        return (x + rng.normal(0, 0.03, x.shape)).astype(np.float32), y.astype(np.int64)
    (tx, ty), (vx, vy) = spirals(4000), spirals(1000)
    return torch.from_numpy(tx), torch.from_numpy(ty), torch.from_numpy(vx), torch.from_numpy(vy)
