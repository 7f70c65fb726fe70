"""How decentralized workers coordinate (Hop): the topology, the protocol and its mechanisms. The checks
that need the graph (backup workers per node, what each protocol allows) are
:func:`hopdec.hop.config.check_config`'s, made once when the run is assembled."""

from dataclasses import dataclass

from hopdec.hop.config import ProtocolConfig, parse_skip
from hopdec.transport.codec import parse_compress
from hopdec.settings.base import INT_AT_LEAST_0, INT_AT_LEAST_1, Group, option


@dataclass(frozen=True)
class Protocol(Group):
    """The decentralized mode's settings (``--topology`` ... ``--skip``)."""

    max_ig: int = option("--max-ig", 2, INT_AT_LEAST_1, "largest iteration gap between neighbours")
    backup_workers: int = option("--backup-workers", None, INT_AT_LEAST_0,
                                 "updates each worker may go without (None: 0)")
    staleness: int = option("--staleness", None, INT_AT_LEAST_0, "use updates up to S iterations old")
    topology: str = option("--topology", doc="a topology file or a generator kind (None: ring-based)")
    protocol: str = option("--protocol", "tokens", doc="tokens, queue-only or notify-ack")
    compute_graph: str = option("--compute-graph", "parallel", doc="parallel or serial")
    stale_reduce: str = option("--stale-reduce", "weighted", doc="weighted or plain")
    skip: str = option("--skip", doc="iteration skipping: max-jump=J,trigger=G")
    compress: str = option("--compress", "none", doc="the exchanges' codec: none, fp16, bf16, int8, topk:F "
                                                     "(,gamma=G)")

    def check(self):
        parse_skip(self.skip)
        parse_compress(self.compress)

    @property
    def compressed(self):
        """Whether the exchanges are coded (anything but ``--compress none``)."""
        return not parse_compress(self.compress).lossless

    def config(self, iterations, checkpoint_every=0, fault_tolerant=False):
        """The protocol core's settings for a run of ``iterations`` per worker."""
        max_jump, trigger = parse_skip(self.skip)
        spec = parse_compress(self.compress)
        return ProtocolConfig(iterations=iterations, protocol=self.protocol, max_ig=self.max_ig,
                              compute_graph=self.compute_graph, backup_workers=self.backup_workers or 0,
                              staleness=self.staleness, stale_reduce=self.stale_reduce,
                              skip_max_jump=max_jump, skip_trigger=trigger,
                              checkpoint_every=checkpoint_every or 0, fault_tolerant=fault_tolerant,
                              compress=str(spec), consensus_step=spec.gamma)
