"""What a run needs on one rank: the parsed options, communicator, data, presets and device.

:class:`RunContext` is built by :mod:`hopdec.cli.train` and handed to the decentralized runner
(:mod:`hopdec.runtime.decentralized`) or the parameter-server runner (:mod:`hopdec.ps.mpi`).
"""

import os
from dataclasses import dataclass, field

import torch

from hopdec.errors import ConfigError
from hopdec.ml.data import partition
from hopdec.ml.trainer import LocalTrainer
from hopdec.runtime.heterogeneity import Emulator


def pick_device(spec, local_rank):
    """``auto``: ``cuda:(local rank mod device count)`` when CUDA is there, else CPU; ``cpu``, ``cuda``
    and ``cuda:N`` must exist on this host (ConfigError naming ``--device`` otherwise)."""
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
    return device


def local_rank_and_size():
    """This rank's index and count on its host, from the launcher's environment (Open MPI, MPICH, Slurm)."""
    for r, s in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        if r in os.environ:
            try:
                return int(os.environ[r]), int(os.environ.get(s, "1").split("(")[0])
            except ValueError:
                pass
    return 0, 1


@dataclass
class RunContext:
    """What a run mode needs on one rank. ``hparams``: lr, momentum, weight_decay, batch_size."""

    args: object
    comm: object
    dataset: object
    model_name: str
    hparams: dict
    iterations: int
    device: torch.device
    log_dir: str = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def rank(self):
        return self.comm.Get_rank()

    @property
    def timeout(self):
        """Seconds any wait may last before a peer counts as dead or hung (``--peer-timeout``)."""
        return float(getattr(self.args, "peer_timeout", None) or 120.0)

    @property
    def faults(self):
        """The tests' fault injection for this rank (:mod:`hopdec.runtime.faults`)."""
        from hopdec.runtime.faults import Faults
        if "faults" not in self.extra:
            self.extra["faults"] = Faults(self.args, self.rank)
        return self.extra["faults"]

    @property
    def size(self):
        return self.comm.Get_size()

    def make_trainer(self, part, n_parts):
        """A trainer on shard ``part`` of ``n_parts`` (same initial model on every rank)."""
        a = self.args
        idx = partition(self.dataset.train_y, n_parts, part, scheme=a.partition, seed=a.seed)
        return LocalTrainer(self.model_name, self.dataset, idx, lr=self.hparams["lr"],
                            momentum=self.hparams["momentum"], weight_decay=self.hparams["weight_decay"],
                            batch_size=self.hparams["batch_size"], device=self.device, seed=a.seed,
                            data_seed=a.seed * 7919 + part, norm=getattr(a, "norm", "batch"),
                            iterations=self.iterations)

    def make_emulator(self, rank, workers):
        """The emulated slowdowns of MPI rank ``rank`` among the training ranks ``workers``."""
        a = self.args
        return Emulator(a.slowdown or [], rank, workers, compute_time=a.compute_time, seed=a.seed)
