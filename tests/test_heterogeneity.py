"""Slowdown specs parse (or fail with one clear line); the emulator is reproducible and honest."""

import pytest

from hopdec.errors import ConfigError
from hopdec.heterogeneity import Emulator, Slowdown, parse_slowdown, parse_slowdowns


def test_parse_random_forms():
    s = parse_slowdown("random:factor=6,prob=1/n")
    assert isinstance(s, Slowdown) and s.kind == "random" and s.factor == 6.0 and s.rank is None
    assert s.probability(8) == pytest.approx(1 / 8)
    assert parse_slowdown("random:factor=6,prob=0.25").probability() == 0.25
    assert parse_slowdown("random:factor=2.5,prob=3/4").probability() == 0.75
    assert parse_slowdown("random:factor=6,prob=2/(n+2)").probability(6) == pytest.approx(0.25)
    only_two = parse_slowdown("random: factor=3, prob=1, rank=2")
    assert only_two.rank == 2 and only_two.probability() == 1.0


def test_parse_straggler_forms():
    for spec in ("rank=3,factor=4", "straggler:rank=3,factor=4", "rank:rank=3,factor=4"):
        s = parse_slowdown(spec)
        assert (s.kind, s.rank, s.factor) == ("rank", 3, 4.0)


@pytest.mark.parametrize("spec,n,words", [
    ("random:factor=0.5,prob=1/n", 8, "factor must be a finite number >= 1"),
    ("random:factor=six,prob=1/n", 8, "factor 'six' is not a number"),
    ("random:factor=6,prob=1.5", None, "outside [0, 1]"),
    ("random:factor=6,prob=n", 4, "outside [0, 1]"),
    ("random:factor=6,prob=-0.1", None, "outside [0, 1]"),
    ("random:factor=6,prob=open('x')", None, "not a number"),
    ("random:factor=6,prob=1/n,speed=2", 8, "unknown key 'speed'"),
    ("random:factor=6", 8, "missing prob="),
    ("rank=3", 8, "missing factor="),
    ("rank=9,factor=4", 8, "rank 9 is not a worker: the workers are ranks 0..7"),
    ("rank=2,factor=4", 1, "rank 2 is not a worker: the only worker is rank 0"),     # (not "ranks 0..0")
    ("rank=x,factor=4", 8, "not an integer"),
    ("burst:factor=2", 8, "unknown kind 'burst'"),
    ("factor=2", 8, "expected random:"),
    ("random:factor", 8, "not key=value"),
])
def test_parse_errors_quote_spec(spec, n, words):
    with pytest.raises(ConfigError) as err:
        parse_slowdown(spec, n)
    msg = str(err.value)
    assert repr(spec.strip()) in msg and words in msg and "\n" not in msg


def test_rank_range_checked_once_n_known():
    s = parse_slowdown("rank=9,factor=4")  # fine without n
    with pytest.raises(ConfigError, match="rank 9 is not a worker"):
        Emulator([s], rank=0, workers=4)
    with pytest.raises(ConfigError, match="rank 9 is not a worker"):
        Emulator("rank=9,factor=4", rank=0, workers=4)


def test_parse_several():
    specs = parse_slowdowns("random:factor=6,prob=1/n; rank=1,factor=4")
    assert [s.kind for s in specs] == ["random", "rank"]
    assert parse_slowdowns(None) == [] and parse_slowdowns("none") == [] and parse_slowdowns([]) == []


def test_random_factor_reproducible_and_frequency():
    a = Emulator("random:factor=6,prob=1/n", rank=2, workers=8, seed=5)
    b = Emulator("random:factor=6,prob=1/n", rank=2, workers=8, seed=5)
    fa = [a.factor(i) for i in range(4000)]
    assert fa == [b.factor(i) for i in range(4000)]
    assert fa[1234] == a.factor(1234)  # order-independent: same answer when asked again
    assert set(fa) == {1.0, 6.0}
    freq = fa.count(6.0) / len(fa)
    assert abs(freq - 1 / 8) < 0.02
    other_rank = Emulator("random:factor=6,prob=1/n", rank=3, workers=8, seed=5)
    other_seed = Emulator("random:factor=6,prob=1/n", rank=2, workers=8, seed=6)
    assert [other_rank.factor(i) for i in range(200)] != fa[:200]
    assert [other_seed.factor(i) for i in range(200)] != fa[:200]


def test_straggler_only_on_its_rank_and_combination():
    slow = Emulator("rank=3,factor=4", rank=3, workers=8)
    fast = Emulator("rank=3,factor=4", rank=0, workers=8)
    assert all(slow.factor(i) == 4.0 for i in range(50))
    assert all(fast.factor(i) == 1.0 for i in range(50))
    both = Emulator(["random:factor=6,prob=1", "rank=3,factor=4"], rank=3, workers=8)
    assert both.factor(0) == 24.0
    none = Emulator(None, rank=0, workers=2)
    assert none.factor(0) == 1.0 and not none.active and none.pad(0, 0.01) == 0.0


def test_pad_arithmetic():
    e = Emulator("rank=0,factor=4", rank=0, workers=2)
    assert e.pad(0, 0.01) == pytest.approx(0.03)  # 0.01*4 - 0.01
    c = Emulator("rank=0,factor=4", rank=0, workers=2, compute_time=0.002)
    assert c.pad(0, 0.001) == pytest.approx(0.007)  # 0.002*4 - 0.001
    assert c.overruns == 0
    plain = Emulator(None, rank=1, workers=2, compute_time=0.002)
    assert plain.pad(0, 0.0005) == pytest.approx(0.0015)
    # measured compute slower than compute_time: never negative, flagged, measured time kept
    assert plain.pad(1, 0.01) == 0.0
    assert plain.overruns == 1 and plain.max_overrun_s == pytest.approx(0.01)
    assert "exceeded" in plain.describe() and "0.01" in plain.describe()


def test_slowdown_survives_a_loaded_machine():
    """A factor-f slowdown makes the iteration f times the larger of the nominal and the measured compute:
    on a machine where real compute overruns --compute-time the straggler must stay f times slower."""
    slow = Emulator("rank=3,factor=4", rank=3, workers=4, compute_time=0.01)
    fast = Emulator("rank=3,factor=4", rank=0, workers=4, compute_time=0.01)
    measured = 0.05                                      # 5x the nominal: a loaded machine
    slow_total = measured + slow.pad(0, measured)
    fast_total = measured + fast.pad(0, measured)
    assert slow_total == pytest.approx(4 * measured) and fast_total == pytest.approx(measured)
    assert slow_total / fast_total == pytest.approx(4.0)
    assert slow.overruns == 1 and fast.overruns == 1      # still reported
    # and a random slowdown the same way
    r = Emulator("random:factor=6,prob=1", rank=0, workers=2, compute_time=0.01)
    assert measured + r.pad(0, measured) == pytest.approx(6 * measured)


def test_run_sleeps_and_returns_totals():
    e = Emulator("rank=0,factor=2", rank=0, workers=1)
    total, f = e.run(0, 0.001)
    assert f == 2.0 and total >= 0.002 - 1e-6
    total0, f0 = Emulator(None, rank=0, workers=1).run(0, 0.003)
    assert (total0, f0) == (0.003, 1.0)


def test_describe():
    e = Emulator(["random:factor=6,prob=1/n", "rank=3,factor=4"], rank=0, workers=8,
                 compute_time=0.05)
    assert e.describe() == ("compute padded to 0.05 s/iter; random 6x slowdown with prob 1/8; "
                            "rank 3 4x slower")
    assert Emulator(None, rank=0, workers=8).describe() == "no emulation"
    assert Emulator("random:factor=2,prob=0.3,rank=1", 0, 4).describe() == \
        "random 2x slowdown with prob 0.3 on rank 1"


def test_emulator_bad_settings():
    with pytest.raises(ConfigError, match="compute-time"):
        Emulator(None, rank=0, workers=2, compute_time=0)
    with pytest.raises(ConfigError, match="rank 2 is not one of the workers"):
        Emulator(None, rank=2, workers=2)


class _Rank:
    """A rank that counts how often it is read as an int."""
    reads = 0

    def __init__(self, r):
        self.r = r

    def __int__(self):
        _Rank.reads += 1
        return self.r


def test_emulators_of_the_same_workers_read_them_once():
    """A simulator makes one Emulator per worker, each given the same tuple of all n workers: the tuple is
    read once, not n times (10,000 workers took 20 s before the first event), and membership stays exact."""
    n = 300
    workers = tuple(_Rank(r) for r in range(1, n + 1))          # a parameter server's workers: 1..n
    _Rank.reads = 0
    emus = [Emulator(["random:factor=6,prob=1/n", "rank=7,factor=2"], w, workers, seed=1) for w in range(1, n + 1)]
    assert _Rank.reads == n
    assert all(e.n_workers == n for e in emus) and emus[6].factor(0) >= 2 and emus[5].factor(0) in (1.0, 6.0)
    with pytest.raises(ConfigError, match="rank 0 is not one of the workers 1..300"):
        Emulator("rank=7,factor=2", 0, workers)
    with pytest.raises(ConfigError, match=r"rank 301 is not a worker: the workers are ranks 1..300 \(rank 0"):
        Emulator("rank=301,factor=2", 1, workers)
    ranks = [0, 1, 2]                                            # a list can change between calls: read each time
    assert Emulator("rank=2,factor=3", 0, ranks).factor(0) == 1.0
    ranks.pop()
    with pytest.raises(ConfigError, match="rank 2 is not a worker"):
        Emulator("rank=2,factor=3", 0, ranks)
    assert Emulator("rank=2,factor=3", 2, (0, 1, 2)).factor(5) == 3.0     # another tuple: its own ranks
