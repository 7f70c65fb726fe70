"""What a run needs on one rank: its settings, communicator, run assembly and device.

:class:`RunContext` is made by :func:`hopdec.runtime.setup.setup` on every rank and handed to the runner
of its mode (:mod:`hopdec.runtime.hop_mpi`, :mod:`hopdec.runtime.ps_mpi`).
"""

from dataclasses import dataclass, field

import torch

from hopdec.errors import ConfigError
from hopdec.heterogeneity import Emulator


def pick_device(spec, local_rank):
    """``auto``: ``cuda:(local rank mod device count)`` when CUDA is there, else CPU; ``cuda``: the same GPU,
    which must be there; ``cpu`` and ``cuda:N`` as named (ConfigError naming ``--device`` when the host
    lacks it). A GPU comes back with its index (logs and summaries name it) and becomes the process's
    current device, so that nothing of this rank lands on GPU 0 by default (pinned memory, synchronize)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "auto":
        return torch.device(f"cuda:{local_rank % gpus}") if gpus else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not gpus:
        raise ConfigError(f"--device {spec}: no CUDA device here (torch {torch.__version__}, "
                          f"{'built without CUDA' if torch.version.cuda is None else 'no GPU visible'}); "
                          f"use --device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= gpus:
        raise ConfigError(f"--device {spec}: this host has {gpus} CUDA device(s), 0..{gpus - 1}")
    if device.type == "cuda" and device.index is None:
        device = torch.device(f"cuda:{local_rank % gpus}")
    return device


def use_device(device):
    """Make a GPU the process's current CUDA device (nothing to do for the CPU)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


@dataclass
class RunContext:
    """One rank's run.

    ``run``: the mode's assembly with its workload (:class:`hopdec.modes.HopRun` or
    :class:`~hopdec.modes.PSRun`); ``fingerprint``: what the run computes, as its checkpoints record it
    (:func:`hopdec.runtime.checkpoint.run_settings`); ``resume``: the cut a ``--resume`` starts from
    (:func:`hopdec.runtime.resume.plan`), else None; ``worker``: this rank's worker id, its rank in the
    first communicator (``comm`` may shrink after a failure); ``healed``: the heals it took part in;
    ``run_id``: the same on every rank of one run (its logs' headers say it, so a reader can tell two
    runs' rank files apart).
    """

    settings: object
    comm: object
    run: object
    device: torch.device = torch.device("cpu")
    fingerprint: dict = None
    resume: dict = None
    worker: int = None
    healed: list = field(default_factory=list)
    run_id: str = None
    _faults: object = None

    @property
    def rank(self):
        return self.comm.Get_rank()

    @property
    def size(self):
        return self.comm.Get_size()

    @property
    def timeout(self):
        """Seconds any wait may last before a peer counts as dead or hung (``--peer-timeout``)."""
        return self.settings.faults.timeout

    @property
    def log_dir(self):
        return self.settings.observe.log_dir

    @property
    def iterations(self):
        """The core's iterations per worker: ``--iterations``, or in rounds of ``--local-steps``."""
        cfg = getattr(self.run, "cfg", None)
        return cfg.iterations if cfg is not None else self.run.work.iterations

    @property
    def faults(self):
        """The tests' fault injection for this rank (:mod:`hopdec.runtime.faults`)."""
        if self._faults is None:
            from hopdec.runtime.faults import Faults
            self._faults = Faults(self.settings.faults, self.rank)
        return self._faults

    def make_emulator(self, rank, workers):
        """The emulated slowdowns of MPI rank ``rank`` among the training ranks ``workers``."""
        em = self.settings.emulation
        return Emulator(list(em.slowdown), rank, workers, compute_time=em.compute_time,
                        seed=self.settings.work.seed)
