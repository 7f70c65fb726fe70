"""Failures: how long a rank waits for a peer, whether the survivors of a failure go on, the tests'
fault injection (hidden options ``--die-rank R --die-at K --die-how H --die-phase P``, see
:mod:`hopdec.runtime.faults`), and the worker deaths ``hopdec sim`` replays through the heal code
(``--deaths``, ``--death-trace``, ``--churn-mttf``, the detection delay and the heal's stall in virtual
time; :mod:`hopdec.sim.churn`)."""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.settings.base import SECONDS_NON_NEGATIVE, SECONDS_POSITIVE, Group, between, is_finite, is_int, option

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


DETECT_S = 0.06
"""Virtual seconds from a simulated death until the survivors start healing: a crashed rank's TCP
connections close and ULFM reports it (measured 0.06 s, last survivor 0.10 s: README "Surviving dead
workers"). A hung rank is found by ULFM's heartbeat detector instead (``HOPDEC_FT_TIMEOUT``, 30 s)."""
HEAL_STALL_S = 0.07
"""Virtual seconds the survivors' recovery takes once all of them joined it (revoke, shrink, exchange of
iterations, heal, reconfigure): the stall measured on 8 workers (README "Surviving dead workers")."""


def plain_float(text):
    """``float(text)`` for a number as a file or a command line writes it: Python's own forms are refused
    (ValueError): ``1_0`` read as 10 seconds, and digits of other scripts (``\u0663``, an Arabic-Indic 3) as
    ASCII ones, without a word."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"not a plain number: {text!r}")
    return float(text)


def plain_int(text):
    """``int(text)``, as :func:`plain_float` reads a number."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"not a plain integer: {text!r}")
    return int(text)


def deaths(values, option_name="--deaths"):
    """``["3@12.5,7@40"]`` (repeatable ``W@T`` lists: worker W dies at virtual second T) ->
    ``((12.5, 3), (40.0, 7))``, in time order; None -> ()."""
    out = []
    for value in values or ():
        if not str(value).strip():      # (an empty shell variable: no deaths asked for, without a word)
            raise ConfigError(f"{option_name} {str(value)!r}: empty value (expected WORKER@SECONDS, e.g. 3@12.5)")
        for part in str(value).split(","):
            if not part.strip():
                continue
            w, at, t = part.strip().partition("@")
            try:
                pair = (plain_float(t), plain_int(w))
            except ValueError:
                raise ConfigError(f"{option_name} {part.strip()!r}: expected WORKER@SECONDS (e.g. 3@12.5), "
                                  f"several separated by commas") from None
            if not at:
                raise ConfigError(f"{option_name} {part.strip()!r}: expected WORKER@SECONDS (e.g. 3@12.5)")
            out.append(pair)
    return tuple(sorted(out))


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
    # hopdec sim only: worker deaths in virtual time (hopdec.sim.churn)
    deaths: tuple = option("--deaths", (), doc="simulated deaths: (virtual second, worker) pairs")
    death_trace: str = option("--death-trace", None, doc="simulated deaths: a file of 'SECONDS WORKER' lines")
    churn_mttf: float = option("--churn-mttf", None, SECONDS_POSITIVE,
                               "simulated churn: every worker's mean time to failure (exponential, seeded)")
    detect_s: float = option("--failure-detection", DETECT_S, SECONDS_NON_NEGATIVE,
                             "virtual seconds from a death until the survivors start healing")
    heal_stall_s: float = option("--heal-stall", HEAL_STALL_S, SECONDS_NON_NEGATIVE,
                                 "virtual seconds the survivors' recovery takes")

    def check(self):
        bad = [p for p in self.die_phase if p not in PHASES]
        if bad:
            raise ConfigError(f"--die-phase {bad[0]}: expected {', '.join(PHASES)} (or a comma-separated list)")
        for t, w in self.deaths:
            if not (is_finite(t) and t >= 0 and is_int(w) and w >= 0):
                raise ConfigError(f"--deaths {w}@{t:g}: expected a worker id >= 0 and a finite time >= 0")
        if self.simulates_deaths and not self.fault_tolerance:
            raise ConfigError(f"{self.deaths_option}: simulated deaths need --fault-tolerance (the survivors "
                              f"heal and go on; without it a death ends the job, with nothing to simulate)")

    @property
    def simulates_deaths(self):
        """Whether ``hopdec sim`` is asked to kill workers."""
        return bool(self.deaths or self.death_trace is not None or self.churn_mttf is not None)

    @property
    def deaths_option(self):
        """The option that asked for deaths (for error lines)."""
        return "--deaths" if self.deaths else "--death-trace" if self.death_trace is not None else "--churn-mttf"

    def ignores(self, run):
        out = {}
        if run.simulated and not self.simulates_deaths:     # (they time the deaths hopdec sim injects)
            why = "it times simulated deaths, and none are asked for (--deaths, --death-trace or --churn-mttf)"
            out = {"--heal-stall": why, "--failure-detection": why}
        if run.mode == "ps":                # (typed at its default value too: churn.check_ps sees only values)
            return {**out, "--heal-stall": "a parameter server has no recovery to stall: it drops a dead worker "
                                           "when it finds it (--failure-detection)"}
        if run.mode != "allreduce":
            return out
        return {**out, "--fault-tolerance": "a synchronous all-reduce needs every worker at every step and cannot go "
                                            "on without one (PyTorch DDP neither: torchrun restarts the job); "
                                            "use --checkpoint-dir and --resume"}

    @property
    def timeout(self):
        """Seconds any wait may last before a peer counts as dead or hung."""
        return float(self.peer_timeout)
