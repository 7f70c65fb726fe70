"""Emulated heterogeneity (Hop sec. 7.3): a real run's padded compute time and the slowdowns (the simulator
applies the same slowdowns to its cost model's compute times, :mod:`hopdec.settings.cost`)."""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.heterogeneity import parse_slowdowns
from hopdec.settings.base import Group, between, option

MAX_COMPUTE_S = 3600.0
"""The longest emulated compute of one iteration (a real run sleeps it): an hour; a longer one is a run
that never ends, not an emulation."""
MAX_SLOWDOWN = 1000.0
"""The largest slowdown factor: a worker 1000x slower is already one that never finishes (the papers use
2-10x); larger factors overflow the compute times they multiply."""


@dataclass(frozen=True)
class Emulation(Group):
    """``--compute-time`` (a real run's: pad each iteration's compute to it) and ``--slowdown``."""

    compute_time: float = option("--compute-time", None,
                                 between(0, MAX_COMPUTE_S, "a finite number of seconds", low_open=True),
                                 "pad each iteration's compute to this many seconds (None: as measured)")
    slowdown: tuple = option("--slowdown", (), doc="random:factor=6,prob=1/n or rank=3,factor=4 (several)")

    def check(self):
        for s in parse_slowdowns(list(self.slowdown)):  # the syntax; which ranks exist is the run's check
            if s.factor > MAX_SLOWDOWN:
                raise ConfigError(f"--slowdown {s.spec!r}: factor {s.factor:g} must be in [1, {MAX_SLOWDOWN:g}]")

    @property
    def worst_factor(self):
        """The largest slowdown one iteration can get (every slowdown at once)."""
        f = 1.0
        for s in parse_slowdowns(list(self.slowdown)):
            f *= s.factor
        return f
