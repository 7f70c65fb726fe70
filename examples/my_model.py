"""A model and a dataset of your own in ``hopdec train`` and ``hopdec sim --math`` (README: "Your own model
and data in hopdec train"):

    mpirun --oversubscribe -n 4 hopdec train --model examples/my_model.py:make_model \
        --dataset examples/my_model.py:make_data --iterations 200 --log-dir runs/mine

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
    and must get the same data (hopdec splits the training set over the workers). Here: 2-D points around
    three centres, one class each, with overlapping tails."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 1.0], [-0.9, -0.5], [0.9, -0.5]], dtype=np.float32)

    def points(n):
        y = rng.integers(0, 3, n)
        x = centres[y] + rng.normal(0, 0.45, (n, 2)).astype(np.float32)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))
    (tx, ty), (vx, vy) = points(4000), points(1000)
    return tx, ty, vx, vy
