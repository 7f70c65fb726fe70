"""Failures: how long a rank waits for a peer, whether the survivors of a failure go on, and the tests'
fault injection (hidden options ``--die-rank R --die-at K --die-how H --die-phase P``, see
:mod:`hopdec.runtime.faults`)."""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import SECONDS_POSITIVE, Group, option

PHASES = ("setup", "train", "evaluate", "shutdown")
HOWS = ("exit", "hang", "raise")


def ints(value, option_name):
    """``3`` or ``"3,6"`` -> (3,) or (3, 6); None -> ()."""
    if value is None:
        return ()
    try:
        return tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{option_name} {value!r}: expected integers separated by commas") from None


@dataclass(frozen=True)
class Faults(Group):
    peer_timeout: float = option("--peer-timeout", 120.0, SECONDS_POSITIVE,
                                 "seconds a worker waits for a neighbour before giving up on the run")
    fault_tolerance: bool = option("--fault-tolerance", False, doc="survive dead workers (ULFM)")
    die_rank: tuple = option("--die-rank", (), doc="fault injection: the ranks that fail")
    die_at: tuple = option("--die-at", (), doc="fault injection: from which iteration")
    die_how: str = option("--die-how", "exit", doc="fault injection: exit, hang or raise")
    die_phase: tuple = option("--die-phase", ("train",), doc="fault injection: setup, train, evaluate, shutdown")

    def check(self):
        bad = [p for p in self.die_phase if p not in PHASES]
        if bad:
            raise ConfigError(f"--die-phase {bad[0]}: expected {', '.join(PHASES)} (or a comma-separated list)")

    @property
    def timeout(self):
        """Seconds any wait may last before a peer counts as dead or hung."""
        return float(self.peer_timeout)
