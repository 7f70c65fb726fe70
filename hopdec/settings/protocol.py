"""How decentralized workers coordinate (Hop): the topology, the protocol and its mechanisms. The checks
that need the graph (backup workers per node, what each protocol allows) are
:func:`hopdec.hop.config.check_config`'s, made once when the run is assembled."""

from dataclasses import dataclass

from hopdec.errors import ConfigError
from hopdec.hop.config import OUTER_OPTIMIZERS, ProtocolConfig, outer_step, parse_skip, rounds
from hopdec.hop.protocols import PROTOCOLS
from hopdec.settings.base import (INT_AT_LEAST_0, INT_AT_LEAST_1, POSITIVE, Group, Rule, between, is_finite,
                                  not_empty, one_of, option)
from hopdec.settings.work import MAX_ITERATIONS
from hopdec.transport.codec import parse_compress

FRACTION = Rule("a number in [0, 1)", lambda x: is_finite(x) and 0 <= x < 1)
MAX_MAX_IG = 10 ** 6
"""The largest ``--max-ig``: every worker keeps max_ig + 1 update slots per in-neighbour (a real run's
buffers are also checked against memory, :mod:`hopdec.runtime.buffers`); a gap of a million iterations
bounds nothing a run can reach."""


@dataclass(frozen=True)
class Protocol(Group):
    """The decentralized mode's settings (``--topology`` ... ``--skip``)."""

    max_ig: int = option("--max-ig", 2, between(1, MAX_MAX_IG, "an integer", integer=True),
                         "largest iteration gap between neighbours")
    backup_workers: int = option("--backup-workers", None, INT_AT_LEAST_0,
                                 "updates each worker may go without (None: 0)")
    staleness: int = option("--staleness", None, between(0, MAX_ITERATIONS, "an integer", integer=True),
                            "use updates up to S iterations old")
    topology: str = option("--topology", None, not_empty("a topology file or a generator kind"),
                           "a topology file or a generator kind (None: ring-based)")
    protocol: str = option("--protocol", "tokens", doc="tokens, queue-only or notify-ack")
    compute_graph: str = option("--compute-graph", "parallel", doc="parallel or serial")
    stale_reduce: str = option("--stale-reduce", "weighted", doc="weighted or plain")
    skip: str = option("--skip", doc="iteration skipping: max-jump=J,trigger=G")
    compress: str = option("--compress", "none", doc="the exchanges' codec: none, fp16, bf16, int8, topk:F "
                                                     "(,gamma=G)")
    local_steps: int = option("--local-steps", 1, INT_AT_LEAST_1, "inner steps per round (DiLoCo's H; "
                              "--iterations counts inner steps, the protocol counts rounds)")
    outer_optimizer: str = option("--outer-optimizer", None, one_of(*OUTER_OPTIMIZERS),
                                  "the outer step on a round's pseudo-gradient (None: nesterov with local steps, "
                                  "else the plain sgd step)")
    outer_lr: float = option("--outer-lr", None, POSITIVE, "the outer step's lr (None: 0.7 nesterov, 1 sgd)")
    outer_momentum: float = option("--outer-momentum", None, FRACTION,
                                   "the outer step's momentum (None: 0.9 nesterov, 0 sgd)")

    def check(self):
        if self.skip is not None:
            max_jump, trigger = parse_skip(self.skip)
            if not (2 <= max_jump <= MAX_ITERATIONS and 1 <= trigger <= MAX_ITERATIONS):
                raise ConfigError(f"--skip {self.skip!r}: max-jump must be in [2, {MAX_ITERATIONS:g}] and trigger "
                                  f"in [1, {MAX_ITERATIONS:g}] (a jump of 0 or 1 never skips anything; drop --skip "
                                  f"for no skipping)")
        parse_compress(self.compress)
        self.outer()

    def outer(self):
        """The outer step ``(optimizer, lr, momentum)``, defaults filled in (DiLoCo's with local steps)."""
        return outer_step(self.local_steps, self.outer_optimizer, self.outer_lr, self.outer_momentum)

    @property
    def local(self):
        """Whether any local-steps option was given (a mode without rounds refuses them)."""
        return self.local_steps != 1 or any(v is not None for v in (self.outer_optimizer, self.outer_lr,
                                                                       self.outer_momentum))

    def ignores(self, run):
        out = {}
        if self.protocol in PROTOCOLS and not PROTOCOLS[self.protocol].token_queues:
            out["--max-ig"] = f"--protocol {self.protocol} has no token queues (only --protocol tokens reads it)"
        if self.staleness is None:
            out["--stale-reduce"] = "it weighs stale updates, and only --staleness S uses any"
        return out

    @property
    def compressed(self):
        """Whether the exchanges are coded (anything but ``--compress none``)."""
        return not parse_compress(self.compress).lossless

    def config(self, iterations, checkpoint_every=0, fault_tolerant=False):
        """The protocol core's settings for a run of ``iterations`` inner steps per worker (rounds of
        ``--local-steps`` of them are the core's iterations)."""
        max_jump, trigger = parse_skip(self.skip)
        spec = parse_compress(self.compress)
        opt, lr, momentum = self.outer()
        return ProtocolConfig(iterations=rounds(iterations, self.local_steps), protocol=self.protocol,
                              max_ig=self.max_ig, local_steps=self.local_steps, outer_optimizer=opt,
                              outer_lr=lr, outer_momentum=momentum,
                              compute_graph=self.compute_graph, backup_workers=self.backup_workers or 0,
                              staleness=self.staleness, stale_reduce=self.stale_reduce,
                              skip_max_jump=max_jump, skip_trigger=trigger,
                              checkpoint_every=checkpoint_every or 0, fault_tolerant=fault_tolerant,
                              compress=str(spec), consensus_step=spec.gamma)
