"""A byte-level language-modelling dataset from a text corpus shipped with hopdec (no download).

``load_text("kjv", context=128)`` gives a :class:`~hopdec.ml.data.Dataset` whose samples are windows of
``context`` bytes: ``train_x[i]`` the input window, ``train_y[i]`` the same window shifted by one byte (the
next byte at every position). The windows are :class:`TokenWindows`, indexed like tensors of shape
``(N, context)`` (an index tensor or a slice), so every part of hopdec that handles (x, y) samples --
shards, batch streams, checkpoints of the data position, evaluation -- handles them unchanged.

The corpus and its licence: ``hopdec/ml/corpora/README.md``. The split is by chapter and deterministic:
every 40th chapter is validation (the same on every machine and seed).
"""

import lzma
import os

import numpy as np
import torch

from hopdec.errors import ConfigError

CORPORA = {"kjv": "kjv.txt.xz"}
CONTEXT = 128
"""Bytes per window (the transformer's context)."""
VALIDATION_EVERY = 40
"""Every 40th chapter (39, 79, ...: 29 chapters, 2.5% of the text) is the validation split."""


def corpus_path(name):
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora", CORPORA[name])


def read_corpus(name="kjv"):
    """The corpus as text (the file is xz-compressed ASCII)."""
    if name not in CORPORA:
        raise ConfigError(f"--dataset {name!r}: unknown text corpus (expected one of {', '.join(CORPORA)})")
    path = corpus_path(name)
    try:
        with lzma.open(path, "rt", encoding="ascii") as f:
            return f.read()
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the shipped corpus ({err}); reinstall hopdec") from None


def split_chapters(text, every=VALIDATION_EVERY):
    """(training text, validation text): chapters are separated by a blank line; chapter i (from 0) is
    validation when ``i % every == every - 1``."""
    chapters = text.strip("\n").split("\n\n")
    train = [c for i, c in enumerate(chapters) if i % every != every - 1]
    val = [c for i, c in enumerate(chapters) if i % every == every - 1]
    return "\n\n".join(train) + "\n", "\n\n".join(val) + "\n"


class TokenWindows:
    """Windows ``tokens[s + shift : s + shift + length]`` for each start ``s`` in ``starts``, indexed like a
    tensor of shape ``(len(starts), length)``: ``w[index_tensor]``, ``w[slice]``, ``w[int]`` give int64
    tensors. Nothing is materialised up front (a 4 MB corpus would be 0.5 GB of int64 windows)."""

    def __init__(self, tokens, starts, length, shift=0):
        self.tokens, self.starts, self.length, self.shift = tokens, starts, int(length), int(shift)
        self._offsets = torch.arange(self.length) + self.shift

    def __len__(self):
        return len(self.starts)

    @property
    def shape(self):
        return (len(self.starts), self.length)

    def __getitem__(self, sel):
        starts = self.starts[sel]
        if starts.dim() == 0:
            return self.tokens[starts + self._offsets].long()
        return self.tokens[starts[:, None] + self._offsets].long()

    @property
    def labels(self):
        """What :func:`hopdec.ml.data.partition` sorts by for ``noniid`` shards: the window's place in the
        text (each worker then gets a contiguous stretch of the corpus)."""
        return self.starts

    def __repr__(self):
        return f"TokenWindows({len(self)} x {self.length})"


def windows(text, context):
    """(inputs, targets): non-overlapping windows of ``context + 1`` bytes of ``text``."""
    tokens = torch.from_numpy(np.frombuffer(text.encode("ascii"), dtype=np.uint8).copy())
    n = (len(tokens) - 1) // context
    starts = torch.arange(n, dtype=torch.int64) * context
    return TokenWindows(tokens, starts, context), TokenWindows(tokens, starts, context, shift=1)


def load_text(name="kjv", context=CONTEXT):
    """The corpus as a byte-level language-modelling :class:`~hopdec.ml.data.Dataset` (vocabulary 256)."""
    from hopdec.ml.data import Dataset
    train, val = split_chapters(read_corpus(name))
    tx, ty = windows(train, context)
    vx, vy = windows(val, context)
    return Dataset(tx, ty, vx, vy, num_classes=256, input_shape=(context,), name=name)


def decode(tokens):
    """Bytes (a tensor or list of ints) as text, for printing samples."""
    return bytes(int(t) for t in tokens).decode("ascii", errors="replace")
