"""A run's settings: its mode and every group, checked together once they are built.

The modes and the groups each takes (:data:`MODES`): a decentralized run reads the protocol group, a
parameter-server run the PS group, an all-reduce run neither; all read the work, emulation, observation,
checkpoint and failure groups; a simulated run has a cost model (:class:`~hopdec.settings.cost.Cost`), a
real one none.

An option the run would ignore is refused, in one line naming the option and the mode
(:meth:`RunSettings.unused`): the rule is built once on what the groups declare -- the options each group
takes (:meth:`~hopdec.settings.base.Group.options`), the groups each mode takes (:data:`MODES`), and what
a group's own values leave unused (:meth:`~hopdec.settings.base.Group.ignores`: the options a sync model
reads, whether a protocol has token queues, ...) -- and applied to the options the user typed
(``typed``), so a default is never refused.
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
    "allreduce": ("work", "emulation", "observe", "checkpoints", "faults"),
}
"""Each mode and the settings groups it takes (the run assemblies: :mod:`hopdec.modes`)."""
GROUPS = ("work", "protocol", "ps", "emulation", "observe", "checkpoints", "faults")
"""Every group a run holds (a simulated run also ``cost``)."""


TRAINING_OPTIONS = ("--lr", "--momentum", "--weight-decay", "--partition", "--outer-optimizer", "--outer-lr",
                    "--outer-momentum")
"""What only training reads (see :meth:`RunSettings.untrained`; --local-steps times the rounds, so not it)."""

@dataclass(frozen=True)
class RunSettings:
    """Everything a run was asked to do. ``mode`` None: ``ps`` when a sync model is given, else
    decentralized (``--sync`` implies ``--mode ps``). ``argv``: the command line, for the resume command
    a stopped run prints; ``typed``: the options the user typed (e.g. ``{"--topology", "--lr"}``), the
    ones refused when the run would ignore them."""

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
    typed: frozenset = frozenset()

    def __post_init__(self):
        if self.mode is None:
            object.__setattr__(self, "mode", "ps" if self.ps.sync is not None else "decentralized")
        elif self.mode not in MODES:
            raise ConfigError(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        elif self.mode == "decentralized" and self.ps.sync is not None:
            raise ConfigError(f"--sync {self.ps.sync} is a parameter-server option: use it with --mode ps "
                              f"(or drop --mode, --sync implies it)")
        unused = self.unused()
        if unused:
            raise ConfigError(unused[0])
        if self.mode == "allreduce" and self.ps.sync is not None:
            raise ConfigError(f"--sync {self.ps.sync} is a parameter-server option, not one of --mode allreduce")
        self.check()

    @property
    def simulated(self):
        return self.cost is not None

    @property
    def groups(self):
        """The groups this run's mode takes, by name."""
        return {name: getattr(self, name) for name in MODES[self.mode]}

    def _all_groups(self):
        names = GROUPS + (("cost",) if self.simulated else ())
        return {name: getattr(self, name) for name in names}

    def untrained(self):
        """The training options typed for a timing-only simulation, where they change nothing (no model
        trains): a note names them, not an error, so one command line serves ``hopdec train`` and ``hopdec
        sim`` alike (--batch-size counts with --epochs: it sets the iterations)."""
        if not self.simulated or self.cost.math:
            return []
        opts = TRAINING_OPTIONS + (() if self.work.epochs is not None else ("--batch-size",))
        return [opt for opt in opts if opt in self.typed]

    def unused(self):
        """One line per typed option this run would ignore, naming the option and the mode (empty: none)."""
        if not self.typed:
            return []
        every = self._all_groups()
        mine = {name: g for name, g in every.items() if name in MODES[self.mode] or name == "cost"}
        taken = {opt for g in mine.values() for opt in g.options().values()}
        ignored = {}
        for g in mine.values():
            for opt, why in g.ignores(self).items():
                holders = [h for h in mine.values() if opt in h.options().values()]
                if all(opt in h.ignores(self) for h in holders):
                    ignored.setdefault(opt, why)
        where = f"--mode {self.mode}" + (f" --sync {self.ps.model}" if self.mode == "ps" else "")
        lines = []
        for opt in sorted(self.typed):
            if opt not in taken:
                modes = [m for m, groups in MODES.items()
                         if any(opt in every[name].options().values() for name in groups if name in every)]
                if not modes:
                    continue                    # not a settings option (--mode, --help)
                lines.append(f"{opt} is not used in {where}: {' and '.join(modes)} mode only (drop it)")
            elif opt in ignored:
                lines.append(f"{opt} is not used in {where}: {ignored[opt]} (drop it)")
        return lines

    def check(self):
        """The rules between groups (each group checked its own fields when it was built)."""
        ob = self.observe
        if self.mode != "decentralized" and self.protocol.compressed:
            raise ConfigError(f"--compress {self.protocol.compress}: decentralized mode only (--mode "
                              f"{self.mode} exchanges gradients{' and weights' if self.mode == 'ps' else ''} "
                              f"uncompressed)")
        if self.mode != "decentralized" and self.protocol.local:
            raise ConfigError(f"--local-steps and --outer-*: decentralized mode only (--mode {self.mode} "
                              f"applies every worker's gradient as it comes)")
        if self.protocol.compressed and self.work.cuda_aware_mpi == "yes":
            raise ConfigError(f"--compress {self.protocol.compress}: codes on host buffers; use "
                              f"--cuda-aware-mpi auto or no")
        if ob.consensus_every is not None and self.mode != "decentralized":
            raise ConfigError(f"--consensus-every is for decentralized runs (--mode {self.mode}: "
                              f"{self.observe.ignores(self)['--consensus-every']})")
        em = self.emulation
        if not self.simulated and em.compute_time is not None and \
                em.compute_time * em.worst_factor > self.faults.timeout:
            raise ConfigError(f"--compute-time {em.compute_time:g}"
                              + (f" with --slowdown factors up to {em.worst_factor:g}x" if em.worst_factor > 1 else "")
                              + f": an iteration may take {em.compute_time * em.worst_factor:g} s, longer than "
                                f"--peer-timeout {self.faults.timeout:g} that the others wait for it (raise "
                                f"--peer-timeout)")
        if self.simulated:
            if ob.save_models and not self.cost.math:
                raise ConfigError("--save-models needs --math (timing only has no parameters)")
            if ob.eval_interval and not self.cost.math:
                raise ConfigError("--eval-interval needs --math (timing only has no model to evaluate)")
        elif ob.eval_interval > 0 and self.mode == "decentralized" and not ob.consensus_every:
            raise ConfigError("--eval-interval in a decentralized run evaluates the average model that the "
                              "consensus rounds form: give --consensus-every K too")

    def replace(self, **groups):
        """A copy with some groups (or the mode, the argv) replaced, checked again."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(groups)
        return RunSettings(**values)
