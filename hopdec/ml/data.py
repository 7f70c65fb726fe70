"""Datasets, per-worker shards and mini-batch streams for decentralized training.

Everything here is plain torch/numpy (no MPI): each rank calls :func:`load_dataset`, then
:func:`partition` with the same seed to get its own disjoint shard, then :func:`batches`.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from hopdec.errors import ConfigError
from hopdec.files import open_regular
from hopdec.limits import check_alloc
from hopdec.ml.catalog import steps_per_epoch  # noqa: F401  (torch-free, re-exported)
from hopdec.ml.registry import DATASETS  # noqa: F401  (the names, without torch: the CLI reads them)
from hopdec.ml.registry import is_entry_point
from hopdec.ml.safe_pickle import RefusedPickle, load_batch

SCHEMES = ("iid", "noniid")

# Per-channel mean/std of the CIFAR-10 training set (the usual published values).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class Dataset:
    """A train/test split held in memory: x float32, y int64 (class indices)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: Tuple[int, ...]
    name: str

    def __repr__(self):
        return (f"Dataset({self.name!r}, train={len(self.train_y)}, test={len(self.test_y)}, "
                f"input_shape={self.input_shape}, num_classes={self.num_classes})")


def load_dataset(name: str = "digits", data_dir: Optional[str] = None, path: Optional[str] = None,
                 test_path: Optional[str] = None, seed: int = 0) -> Dataset:
    """Load ``digits`` (bundled with scikit-learn), ``cifar10`` (python batches), ``libsvm`` or ``kjv`` (the
    King James Bible shipped with hopdec, byte-level windows for the transformer: :mod:`hopdec.ml.text`).

    Never downloads anything; a missing or unreadable input raises :class:`ConfigError`.
    """
    if is_entry_point(name):                        # --dataset module:factory (yours)
        from hopdec.ml.user import load
        return load(name, seed)
    if name == "kjv":
        from hopdec.ml.text import load_text
        return load_text(name)
    if name == "digits":
        return _load_digits(seed)
    if name == "cifar10":
        return _load_cifar10(data_dir)
    if name == "libsvm":
        return _load_libsvm(path, test_path, seed)
    raise ConfigError(f"--dataset {name!r}: unknown dataset (expected one of {', '.join(DATASETS)})")


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int):
    """Seeded stratified train/test index split: each class gives its share (largest remainders)."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    n_test = int(np.ceil(test_fraction * len(y)))
    share = counts * n_test / len(y)
    take = np.floor(share).astype(int)
    for c in np.argsort(-(share - take), kind="stable")[:n_test - take.sum()]:
        take[c] += 1
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:k] for c, k in zip(classes, take)])
    train = np.setdiff1d(np.arange(len(y)), test)
    return np.sort(train), np.sort(test)


def _digits_arrays():
    """The digits table as scikit-learn ships it (``sklearn/datasets/data/digits.csv.gz``).

    Read straight from the file: importing scikit-learn costs a second or more per rank, which adds
    up when many ranks share a few cores. Falls back to ``sklearn.datasets.load_digits``.
    """
    import importlib.util
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            table = np.loadtxt(path, delimiter=",", dtype=np.float32)
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits
    d = load_digits()
    return d.data.astype(np.float32), d.target.astype(np.int64)


def _load_digits(seed: int) -> Dataset:
    """scikit-learn's 1797 8x8 digits (shipped in the package), scaled to [0,1], 20% held out."""
    data, y = _digits_arrays()
    x = (data / 16.0).reshape(-1, 1, 8, 8)
    tr, te = _stratified_split(y, 0.2, seed)
    return Dataset(torch.from_numpy(x[tr]), torch.from_numpy(y[tr]),
                   torch.from_numpy(x[te]), torch.from_numpy(y[te]),
                   num_classes=10, input_shape=(1, 8, 8), name="digits")


def _cifar_dir(data_dir: Optional[str]) -> str:
    """The folder that holds ``data_batch_1`` (``data_dir`` or ``data_dir/cifar-10-batches-py``)."""
    how = ("download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html "
           "and extract it there")
    if not data_dir:
        raise ConfigError(f"--data-dir is required for cifar10 ({how})")
    for cand in (data_dir, os.path.join(data_dir, "cifar-10-batches-py")):
        if os.path.isfile(os.path.join(cand, "data_batch_1")):
            return cand
    raise ConfigError(f"--data-dir {data_dir}: no CIFAR-10 python batches (data_batch_1..5, "
                      f"test_batch) found; {how}")


def _read_cifar_batch(path: str):
    """One pickle batch -> (N,3,32,32) uint8 array, int64 labels.

    Read with :mod:`hopdec.ml.safe_pickle`, which admits only what a real batch holds: a file that
    names any other global (``os.system``, a module that does not exist) is refused, never run.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: missing CIFAR-10 batch file")
    try:
        with open(path, "rb") as f:
            d = load_batch(f)
        if not isinstance(d, dict):
            raise TypeError(f"expected a dict, got {type(d).__name__}")
        d = {k.encode() if isinstance(k, str) else k: v for k, v in d.items()}
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
    except RefusedPickle as err:
        raise ConfigError(f"{path}: refused: {err}") from None
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError, OverflowError, RecursionError, MemoryError) as err:
        raise ConfigError(f"{path}: not a CIFAR-10 python batch ({type(err).__name__}: "
                          f"{str(err)[:200]})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise ConfigError(f"{path}: expected N x 3072 data and N labels, got data {data.shape} "
                          f"and {len(labels)} labels")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ConfigError(f"{path}: labels must be in 0..9")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar10(data_dir: Optional[str]) -> Dataset:
    """CIFAR-10 from the standard python batches; per-channel normalised, 3x32x32."""
    root = _cifar_dir(data_dir)
    parts = [_read_cifar_batch(os.path.join(root, f"data_batch_{i}")) for i in range(1, 6)]
    test = _read_cifar_batch(os.path.join(root, "test_batch"))
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)

    def norm(a):
        return ((torch.from_numpy(a).float() / 255.0) - mean) / std

    tx = np.concatenate([p[0] for p in parts])
    ty = np.concatenate([p[1] for p in parts])
    return Dataset(norm(tx), torch.from_numpy(ty), norm(test[0]), torch.from_numpy(test[1]),
                   num_classes=10, input_shape=(3, 32, 32), name="cifar10")


def _read_svmlight(path: str):
    """A LIBSVM file -> sparse float32 features (CSR), {0,1} labels. :func:`_dense` makes them dense."""
    from sklearn.datasets import load_svmlight_file
    # (missing, a directory, a FIFO or device: each named for what it is; no size cap but the memory check)
    fh, _ = open_regular(path, 1 << 62, "a LIBSVM file")
    try:
        with fh:
            x, y = load_svmlight_file(fh, dtype=np.float32)
    except OverflowError:
        raise ConfigError(f"{path}: a feature index too large to read (LIBSVM indices are 32-bit)") \
            from None
    except (ValueError, UnicodeDecodeError, OSError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{path}: not a readable LIBSVM file ({msg})") from None
    labels = np.unique(y)
    if len(y) == 0:
        raise ConfigError(f"{path}: no samples")
    bad = np.flatnonzero(~np.isfinite(x.data))
    if bad.size:                            # nan, inf, or too large for float32: not a learning-rate problem
        row = int(np.searchsorted(x.indptr, bad[0], side="right")) - 1
        raise ConfigError(f"{path}: sample {row + 1} has a feature value that is not a finite float32 "
                          f"({x.data[bad[0]]}); {bad.size} such value(s) in the file")
    if set(labels) <= {-1.0, 1.0}:
        y01 = (y > 0).astype(np.int64)
    elif set(labels) <= {0.0, 1.0}:
        y01 = y.astype(np.int64)
    else:
        raise ConfigError(f"{path}: labels must be binary (+1/-1 or 0/1), found "
                          f"{', '.join(f'{v:g}' for v in labels[:5])}")
    return x, y01


def _dense(parts, width, copies, names):
    """The sparse matrices ``parts`` as dense float32 arrays ``width`` columns wide, after checking
    that ``copies`` times their dense size fits in memory: LIBSVM files list only the features they
    use, so a 110-byte file with feature index 2e9 would ask for 75 GiB."""
    rows = sum(p.shape[0] for p in parts)
    check_alloc(copies * rows * width * 4,
                f"{' and '.join(names)}: {rows} samples x {width} features (the largest feature "
                f"index) as dense float32" + (f", {copies} copies" if copies > 1 else ""))
    out = []
    for p in parts:
        p = p.tocsr()
        p.resize((p.shape[0], width))
        out.append(np.asarray(p.toarray(), dtype=np.float32))
    return out


def _load_libsvm(path: Optional[str], test_path: Optional[str], seed: int) -> Dataset:
    """Binary LIBSVM data (e.g. webspam); a seeded 80/20 split unless ``test_path`` is given."""
    if not path:
        raise ConfigError("--data-path is required for the libsvm dataset (a LIBSVM-format file)")
    if test_path:
        sx, y = _read_svmlight(path)
        stx, ty = _read_svmlight(test_path)
        # LIBSVM files only list the features they use: the narrower one gets zero columns.
        x, tx = _dense([sx, stx], max(sx.shape[1], stx.shape[1]), 1, [path, test_path])
    else:
        sx, ya = _read_svmlight(path)
        (xa,) = _dense([sx], sx.shape[1], 2, [path])        # the split below copies it once
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(ya))
        n_test = max(1, int(round(0.2 * len(ya)))) if len(ya) > 1 else 0
        te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        x, y, tx, ty = xa[tr], ya[tr], xa[te], ya[te]
    d = x.shape[1]
    return Dataset(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y),
                   torch.from_numpy(np.ascontiguousarray(tx)), torch.from_numpy(ty),
                   num_classes=2, input_shape=(d,), name="libsvm")


def partition(labels, n_parts: int, part: int, scheme: str = "iid", seed: int = 0) -> torch.Tensor:
    """Indices of shard ``part`` of ``n_parts``: same seed -> same disjoint, covering shards everywhere.

    ``iid``: seeded shuffle, equal contiguous shards (sizes differ by <= 1).
    ``noniid``: seeded shuffle, then stable sort by label, contiguous shards -> few labels per part.
    ``labels`` may also be windows of a text (:class:`hopdec.ml.text.TokenWindows`): ``noniid`` then sorts
    by their place in the text, so each part is a contiguous stretch of the corpus.
    """
    if n_parts < 1:
        raise ConfigError(f"partition: n_parts must be >= 1, got {n_parts}")
    if not 0 <= part < n_parts:
        raise ConfigError(f"partition: part {part} out of range 0..{n_parts - 1}")
    if scheme not in SCHEMES:
        raise ConfigError(f"--partition {scheme!r}: unknown scheme (expected one of {', '.join(SCHEMES)})")
    y = torch.as_tensor(getattr(labels, "labels", labels))
    if y.dim() > 1:                          # per-position targets (a language model's): split the samples
        if scheme == "noniid":
            raise ConfigError(f"--partition noniid: the targets have shape {tuple(y.shape)}, not one class per "
                              f"sample; use iid (or give the windows' place in the text as labels)")
        y = y.reshape(len(y), -1)[:, 0]
    g = torch.Generator().manual_seed(int(seed))
    order = torch.randperm(len(y), generator=g)
    if scheme == "noniid":
        # Shuffle first so samples within a label are in seeded order, then a stable label sort.
        _, by_label = torch.sort(y[order], stable=True)
        order = order[by_label]
    return torch.tensor_split(order, n_parts)[part].clone().long()


class BatchStream:
    """Mini-batches ``(xb, yb)`` from ``x[indices]`` forever, reshuffled each epoch by a seeded generator,
    with a position that can be saved and restored exactly (checkpoints, :mod:`hopdec.runtime.checkpoint`).

    Every epoch visits each index once; the last batch of an epoch may be smaller. The position is the
    current epoch's order, the next batch's offset in it, and the generator's state (which the next
    epoch's shuffle draws from): :meth:`state` gives them as numpy arrays, :meth:`load_state` puts them
    back, and the stream then yields exactly what it would have.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, indices, batch_size: int, seed: int = 0):
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        if len(idx) == 0:
            raise ConfigError("batches: empty shard (more workers than samples?)")
        steps_per_epoch(len(idx), batch_size)  # validates batch_size
        self.x, self.y, self.idx, self.batch_size = x, y, idx, int(batch_size)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.perm = None                    # this epoch's order (None: draw one at the next batch)
        self.pos = 0                        # offset of the next batch in it
        self.batches = 0                    # batches yielded so far

    def __iter__(self):
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.perm is None or self.pos >= len(self.perm):
            self.perm = self.idx[torch.randperm(len(self.idx), generator=self.generator)]
            self.pos = 0
        sel = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        self.batches += 1
        return self.x[sel], self.y[sel]

    def state(self) -> dict:
        """The position as numpy arrays (no Python objects: safe to store and load without pickle)."""
        perm = self.perm.numpy() if self.perm is not None else np.zeros(0, dtype=np.int64)
        return {"generator": self.generator.get_state().numpy().copy(), "perm": perm.copy(),
                "pos": np.array([self.pos, self.batches, self.perm is not None], dtype=np.int64)}

    def load_state(self, state: dict) -> None:
        """Continue from a position :meth:`state` gave (of a stream over the same shard)."""
        perm = np.asarray(state["perm"], dtype=np.int64)
        pos, count, started = (int(v) for v in np.asarray(state["pos"]).reshape(-1)[:3])
        if started and (len(perm) != len(self.idx)
                        or not np.array_equal(np.sort(perm), np.sort(self.idx.numpy()))):
            raise ConfigError("the saved data position is for another shard (different data, "
                              "--partition or number of workers)")
        self.generator.set_state(torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy()))
        self.perm = torch.from_numpy(perm.copy()) if started else None
        self.pos, self.batches = pos, count


def batches(x: torch.Tensor, y: torch.Tensor, indices, batch_size: int,
            seed: int = 0) -> BatchStream:
    """A :class:`BatchStream`: ``(xb, yb)`` from ``x[indices]`` forever, reshuffled each epoch by a
    seeded generator. Every epoch visits each index once; the last batch of an epoch may be smaller."""
    return BatchStream(x, y, indices, batch_size, seed=seed)
