"""ZipLine (ElasticBSP barrier search): fast vs plain vs exhaustive, ties, validation."""

import numpy as np
import pytest

import hopdec
from hopdec.errors import ConfigError
from hopdec.ps.zipline import predict_pushes, zipline, zipline_exhaustive, zipline_plain


def _random_instance(rng, integer):
    n = int(rng.integers(1, 6))
    r = int(rng.integers(1, 6))
    while r ** n > 4000:
        n -= 1
    if integer:  # many ties
        t = np.sort(rng.integers(0, 3 * r, size=(n, r)), axis=1).astype(float)
    else:
        t = np.sort(rng.uniform(0, 10, size=(n, r)), axis=1)
    return t


@pytest.mark.parametrize("integer", [False, True])
def test_agrees_with_exhaustive_search(integer):
    rng = np.random.default_rng(1234 + integer)
    for _ in range(1500):
        t = _random_instance(rng, integer)
        idx_e, span_e = zipline_exhaustive(t)
        for solver in (zipline, zipline_plain):
            idx, span = solver(t)
            assert span == span_e, (solver.__name__, t)
            assert np.array_equal(idx, idx_e), (solver.__name__, t, idx, idx_e)
            chosen = t[np.arange(t.shape[0]), idx]
            assert chosen.max() - chosen.min() == span


def test_plain_and_fast_agree_on_large_instances():
    rng = np.random.default_rng(7)
    for n, r in [(50, 15), (200, 30), (1000, 15)]:
        t = predict_pushes(rng.uniform(0, 50, n), rng.uniform(1000, 1500, n), r)
        a, b = zipline(t), zipline_plain(t)
        assert a[1] == b[1] and np.array_equal(a[0], b[0])


def test_earliest_optimum_on_ties():
    # Two workers, periods 1 and 2: spans 0 at t=2, 4, 6 ... the earliest (t=2) wins.
    t = predict_pushes([0.0, 0.0], [1.0, 2.0], 6)
    idx, span = zipline(t)
    assert span == 0.0 and list(idx) == [1, 0]
    # Within the optimal window a worker takes its latest push (ZipLine keeps the newest point).
    t = np.array([[1.0, 2.0, 2.0, 5.0], [2.0, 9.0, 10.0, 11.0]])
    idx, span = zipline(t)
    assert span == 0.0 and list(idx) == [2, 0]
    assert list(zipline_exhaustive(t)[0]) == [2, 0]


def test_single_worker_and_single_column():
    assert zipline([[3.0, 4.0]]) [1] == 0.0
    idx, span = zipline([[1.0], [4.0], [2.0]])
    assert list(idx) == [0, 0, 0] and span == 3.0


def test_public_entry_point_is_a_module_function():
    """``hopdec.ps.zipline`` stays a module (nothing rebinds it to the function of the same name)."""
    import types

    import hopdec.ps.zipline as mod
    assert isinstance(mod, types.ModuleType) and not hasattr(hopdec, "zipline")
    idx, span = mod.zipline([[0.0, 1.0, 2.0], [0.5, 1.9, 4.0]])
    assert list(idx) == [2, 1] and span == pytest.approx(0.1)


def test_predict_pushes():
    t = predict_pushes([10.0, 20.0], [1.5, 2.0], 3)
    assert t.tolist() == [[11.5, 13.0, 14.5], [22.0, 24.0, 26.0]]
    with pytest.raises(ConfigError, match="--lookahead"):
        predict_pushes([0.0], [1.0], 0)


@pytest.mark.parametrize("bad, msg", [
    ([1.0, 2.0], "2-D"),
    (np.zeros((0, 3)), "at least one"),
    ([[2.0, 1.0]], "non-decreasing"),
    ([[0.0, np.nan]], "finite"),
    ([["a", "b"]], "numbers"),
])
def test_bad_input_is_one_line(bad, msg):
    for solver in (zipline, zipline_plain, zipline_exhaustive):
        with pytest.raises(ConfigError, match=msg) as info:
            solver(bad)
        assert "\n" not in str(info.value)
