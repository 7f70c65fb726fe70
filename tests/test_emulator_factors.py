"""Emulator.factors (many iterations at once, for the simulator) equals Emulator.factor bit for bit, and
seeded_uniforms equals numpy's SeedSequence + PCG64 draws."""

import random

import numpy as np
import pytest

from hopdec.heterogeneity import Emulator, seeded_uniforms


def test_seeded_uniforms_are_numpys_draws():
    rng = random.Random(0)
    for _ in range(100):
        a, b, c = rng.randrange(2 ** 32), rng.choice([rng.randrange(64), rng.randrange(2 ** 32)]), rng.randrange(6)
        its = np.array([0, 1, 2 ** 32 - 1] + [rng.randrange(100_000) for _ in range(12)])
        ref = [np.random.default_rng(np.random.SeedSequence([a, b, c, int(i)])).random() for i in its]
        assert seeded_uniforms(a, b, c, its).tolist() == ref


@pytest.mark.parametrize("specs, rank, workers, seed", [
    (["random:factor=6,prob=1/n"], 3, 8, 0),
    (["random:factor=6,prob=1/n", "rank=3,factor=2", "random:factor=1.5,prob=0.5,rank=3"], 3, 8, 2 ** 40 + 7),
    (["random:factor=2,prob=0.9", "rank=1,factor=3"], 2, range(1, 9), 5),        # PS ranks; not the straggler
    ([], 0, 4, 1),
])
def test_factors_equal_factor(specs, rank, workers, seed):
    e = Emulator(specs, rank, workers, seed=seed)
    its = np.arange(2000)
    assert e.factors(its).tolist() == [e.factor(int(i)) for i in its]
