"""The parameter-server mode's settings: the sync model and the options the models read. Which model reads
which option, its defaults and its checks are the model's own (:mod:`hopdec.ps.sync`)."""

from dataclasses import dataclass

from hopdec.ps.sync import POLICIES, sync_policy
from hopdec.settings.base import INT_AT_LEAST_0, INT_AT_LEAST_1, SECONDS, Group, between, option
from hopdec.settings.work import MAX_ITERATIONS


@dataclass(frozen=True)
class PS(Group):
    """``--sync`` and its options (``--staleness`` and ``--backup-workers`` are shared with the
    decentralized mode, each mode reading them its own way)."""

    backup_workers: int = option("--backup-workers", None, INT_AT_LEAST_0, "--sync backup: b (None: 1)")
    staleness: int = option("--staleness", None, between(0, MAX_ITERATIONS, "an integer", integer=True),
                            "--sync ssp: the gap bound (None: 3)")
    lookahead: int = option("--lookahead", None, INT_AT_LEAST_1, "--sync elastic: R (None: 15)")
    esync_epsilon: float = option("--esync-epsilon", 0.0, SECONDS, "--sync esync: the boundary constant")
    sync: str = option("--sync", doc="the sync model (None: bsp)")
    staleness_range: str = option("--staleness-range", doc="--sync dssp: sL,sU (None: 3,15)")

    @property
    def model(self):
        return self.sync or "bsp"

    def ignores(self, run):
        """The options the sync model does not read (each model declares its own, :attr:`Policy.options`)."""
        cls = POLICIES.get(self.model)
        if cls is None:
            return {}
        out = {}
        for name, opt in self.options().items():
            if name == "sync" or name in cls.options:
                continue
            who = [c.sync for c in POLICIES.values() if name in c.options]
            out[opt] = f"--sync {self.model} does not read it" + (
                f" (only --sync {' and '.join(who)} does)" if who else "")
        return out

    def policy(self, workers):
        """The sync model's policy over worker ids ``workers`` (ConfigError names the option)."""
        return sync_policy(self.model, workers, staleness=self.staleness, staleness_range=self.staleness_range,
                           lookahead=self.lookahead, backup_workers=self.backup_workers,
                           esync_epsilon=self.esync_epsilon or 0.0)
