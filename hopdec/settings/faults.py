"""Failures: how long a rank waits for a peer, whether the survivors of a failure go on, and the tests'
fault injection (hidden options ``--die-rank R --die-at K --die-how H --die-phase P``, see
:mod:`hopdec.runtime.faults`)."""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import Group, between, option

MAX_PEER_TIMEOUT = 86400.0
"""A day: a peer silent for longer is a hung job, whatever the model."""

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
    peer_timeout: float = option("--peer-timeout", 120.0,
                                 between(0, MAX_PEER_TIMEOUT, "a finite number of seconds", low_open=True),
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

    def ignores(self, run):
        if run.mode != "allreduce":
            return {}
        return {"--fault-tolerance": "a synchronous all-reduce needs every worker at every step and cannot go "
                                     "on without one (PyTorch DDP neither: torchrun restarts the job); "
                                     "use --checkpoint-dir and --resume"}

    @property
    def timeout(self):
        """Seconds any wait may last before a peer counts as dead or hung."""
        return float(self.peer_timeout)
