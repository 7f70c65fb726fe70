"""A run's settings: its mode and every group, checked together once they are built.

The modes and the groups each takes (:data:`MODES`): a decentralized run reads the protocol group, a
parameter-server run the PS group; both read the work, emulation, observation, checkpoint and failure
groups; a simulated run has a cost model (:class:`~hopdec.settings.cost.Cost`), a real one none.
"""

from dataclasses import dataclass, field, fields

from hopdec.errors import ConfigError
from hopdec.settings.checkpoints import Checkpoints
from hopdec.settings.cost import Cost
from hopdec.settings.emulation import Emulation
from hopdec.settings.faults import Faults
from hopdec.settings.observe import Observe
from hopdec.settings.protocol import Protocol
from hopdec.settings.ps import PS
from hopdec.settings.work import Work

MODES = {
    "decentralized": ("work", "protocol", "emulation", "observe", "checkpoints", "faults"),
    "ps": ("work", "ps", "emulation", "observe", "checkpoints", "faults"),
}
"""Each mode and the settings groups it takes (the run assemblies: :mod:`hopdec.modes`)."""


@dataclass(frozen=True)
class RunSettings:
    """Everything a run was asked to do. ``mode`` None: ``ps`` when a sync model is given, else
    decentralized (``--sync`` implies ``--mode ps``). ``argv``: the command line, for the resume command
    a stopped run prints."""

    mode: str = None
    work: Work = field(default_factory=Work)
    protocol: Protocol = field(default_factory=Protocol)
    ps: PS = field(default_factory=PS)
    emulation: Emulation = field(default_factory=Emulation)
    observe: Observe = field(default_factory=Observe)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)
    faults: Faults = field(default_factory=Faults)
    cost: Cost = None
    argv: tuple = ()

    def __post_init__(self):
        if self.mode is None:
            object.__setattr__(self, "mode", "ps" if self.ps.sync is not None else "decentralized")
        elif self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        elif self.mode == "decentralized" and self.ps.sync is not None:
            raise ConfigError(f"--sync {self.ps.sync} is a parameter-server option: use it with --mode ps "
                              f"(or drop --mode, --sync implies it)")
        self.check()

    @property
    def simulated(self):
        return self.cost is not None

    @property
    def groups(self):
        """The groups this run's mode takes, by name."""
        return {name: getattr(self, name) for name in MODES[self.mode]}

    def check(self):
        """The rules between groups (each group checked its own fields when it was built)."""
        ob = self.observe
        if self.mode == "ps" and self.protocol.compressed:
            raise ConfigError(f"--compress {self.protocol.compress}: decentralized mode only (the parameter "
                              f"server exchanges gradients and weights uncompressed)")
        if self.mode != "decentralized" and self.protocol.local:       # (any mode but Hop's rounds)
            raise ConfigError(f"--local-steps and --outer-*: decentralized mode only (--mode {self.mode} "
                              f"applies every worker's gradient as it comes)")
        if self.protocol.compressed and self.work.cuda_aware_mpi == "yes":
            raise ConfigError(f"--compress {self.protocol.compress}: codes on host buffers; use "
                              f"--cuda-aware-mpi auto or no")
        if ob.consensus_every is not None and self.mode == "ps":
            raise ConfigError("--consensus-every is for decentralized runs (in --mode ps every worker "
                              "starts from the server's model)")
        if self.simulated:
            if ob.save_models and not self.cost.math:
                raise ConfigError("--save-models needs --math (timing only has no parameters)")
            if ob.eval_interval and not self.cost.math:
                raise ConfigError("--eval-interval needs --math (timing only has no model to evaluate)")
        elif ob.eval_interval > 0 and self.mode != "ps" and not ob.consensus_every:
            raise ConfigError("--eval-interval in a decentralized run evaluates the average model that the "
                              "consensus rounds form: give --consensus-every K too")

    def replace(self, **groups):
        """A copy with some groups (or the mode, the argv) replaced, checked again."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(groups)
        return RunSettings(**values)
