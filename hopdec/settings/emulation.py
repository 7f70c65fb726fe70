"""Emulated heterogeneity (Hop sec. 7.3): a real run's padded compute time and the slowdowns (the simulator
applies the same slowdowns to its cost model's compute times, :mod:`hopdec.settings.cost`)."""

from dataclasses import dataclass

from hopdec.heterogeneity import parse_slowdowns
from hopdec.settings.base import SECONDS_POSITIVE, Group, option


@dataclass(frozen=True)
class Emulation(Group):
    """``--compute-time`` (a real run's: pad each iteration's compute to it) and ``--slowdown``."""

    compute_time: float = option("--compute-time", None, SECONDS_POSITIVE,
                                 "pad each iteration's compute to this many seconds (None: as measured)")
    slowdown: tuple = option("--slowdown", (), doc="random:factor=6,prob=1/n or rank=3,factor=4 (several)")

    def check(self):
        parse_slowdowns(list(self.slowdown))        # the syntax; which ranks exist is the run's check
