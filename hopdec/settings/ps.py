"""The parameter-server mode's settings: the sync model and the options the models read. Which model reads
which option, its defaults and its checks are the model's own (:mod:`hopdec.ps.sync`)."""

from dataclasses import dataclass

from hopdec.ps.sync import sync_policy
from hopdec.settings.base import INT_AT_LEAST_0, INT_AT_LEAST_1, SECONDS, Group, option


@dataclass(frozen=True)
class PS(Group):
    """``--sync`` and its options (``--staleness`` and ``--backup-workers`` are shared with the
    decentralized mode, each mode reading them its own way)."""

    backup_workers: int = option("--backup-workers", None, INT_AT_LEAST_0, "--sync backup: b (None: 1)")
    staleness: int = option("--staleness", None, INT_AT_LEAST_0, "--sync ssp: the gap bound (None: 3)")
    lookahead: int = option("--lookahead", None, INT_AT_LEAST_1, "--sync elastic: R (None: 15)")
    esync_epsilon: float = option("--esync-epsilon", 0.0, SECONDS, "--sync esync: the boundary constant")
    sync: str = option("--sync", doc="the sync model (None: bsp)")
    staleness_range: str = option("--staleness-range", doc="--sync dssp: sL,sU (None: 3,15)")

    @property
    def model(self):
        return self.sync or "bsp"

    def policy(self, workers):
        """The sync model's policy over worker ids ``workers`` (ConfigError names the option)."""
        return sync_policy(self.model, workers, staleness=self.staleness, staleness_range=self.staleness_range,
                           lookahead=self.lookahead, backup_workers=self.backup_workers,
                           esync_epsilon=self.esync_epsilon or 0.0)
