"""The simulator's cost model (``hopdec sim``): how many workers, how long a mini-batch takes, how large a
message is, the network, and the fidelity (timing only, or ``--math``). Parsing the per-rank specs
(``3@normal:mean=1,std=0.1``, ``0@100``) needs the worker ranks: :mod:`hopdec.sim.costs` does it."""

import math
from dataclasses import dataclass

from hopdec.settings.base import Group, Rule, between, one_of, option

MAX_VIRTUAL_S = 1e6
"""The largest virtual time one mini-batch or one message latency may take (11 days): larger ones make
virtual times that overflow to infinity once slowdowns multiply them."""
MAX_MESSAGE_MB = 2.0 ** 20
"""A TiB per message: more than any model."""
MIN_BANDWIDTH_GBPS = 1e-6
"""1 kbit/s: a slower NIC makes a message take longer than :data:`MAX_VIRTUAL_S`."""
DEFAULT_BANDWIDTH_GBPS = 10.0
DEFAULT_LATENCY_S = 5e-5
CHECK_UP_TO = 16
"""``--invariants auto`` checks them at every event up to this many workers (O(n^2) each: ~10x the
simulation itself at 64 workers)."""


@dataclass(frozen=True)
class Cost(Group):
    """A simulated run's cost model and fidelity."""

    workers: int = option("-n", None, Rule(">= 1", lambda x: isinstance(x, int) and x >= 1),
                          "workers (None: the topology file's; at most hopdec.limits.MAX_WORKERS)")
    message_mb: float = option("--message-mb", None, between(0, MAX_MESSAGE_MB),
                               "MiB per parameter message (None: the model's size)")
    latency: float = option("--latency", DEFAULT_LATENCY_S,
                            Rule(f"a finite number of seconds in [0, {MAX_VIRTUAL_S:g}]",
                                 lambda x: isinstance(x, (int, float)) and math.isfinite(x) and 0 <= x <= MAX_VIRTUAL_S,
                                 "repr"),
                            "seconds per message")
    compute_time: tuple = option("--compute-time", (), doc="[WHO@]DIST virtual seconds per iteration (several)")
    bandwidth: tuple = option("--bandwidth", (), doc="[WHO@]GBPS NIC bandwidth (several)")
    nic_duplex: str = option("--nic-duplex", "full", one_of("full", "half"), "full or half")
    math: bool = option("--math", False, doc="every worker holds a real replica of the model")
    invariants: str = option("--invariants", "auto", one_of("auto", "on", "off"), "check the invariants")
    send_path: str = option("--send-path", "zero-copy", one_of("zero-copy", "copy"),
                            "decentralized sends: zero-copy (a real CPU run's) or copy (hopdec.sim.sends)")
    eager_limit: float = option("--eager-limit", None, Rule("a number of bytes >= 0", lambda x: x >= 0),
                                "messages up to it are eager (None: 65536, Open MPI over TCP)")
    rendezvous: str = option("--rendezvous", "take", one_of("take", "push"),
                             "how larger messages move: take (shared memory) or push (TCP)")

    def ignores(self, run):
        if run.mode == "decentralized":
            return {}
        why = ("it models how a Hop worker's parameter sends complete (hopdec.sim.sends); the simulated "
               f"--mode {run.mode} times its messages by the network alone")
        return {"--send-path": why, "--eager-limit": why, "--rendezvous": why}

    @property
    def fidelity(self):
        """What made the figures, as every log and summary of the run says it."""
        return "SIMULATED (--math)" if self.math else "SIMULATED (timing only)"

    def check_invariants(self, n):
        """Whether the invariants are checked at every event of a run of ``n`` workers."""
        return self.invariants == "on" or (self.invariants == "auto" and n <= CHECK_UP_TO)
