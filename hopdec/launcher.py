"""What the launcher (``mpirun``, ``srun``, ...) told this process through its environment: whether one
started it, its rank, and its place among the ranks on its host. Read before MPI is initialised (a bad
command line is reported by rank 0 alone without it) and by what prints (a bar only without a launcher).
"""

import os

LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "SLURM_NTASKS", "MPI_LOCALNRANKS")
"""Variables one of the launchers hopdec knows sets in every process it starts (Open MPI, PMIx, MPICH/PMI,
Slurm, MPICH's Hydra)."""


def under_launcher():
    """True when an MPI launcher or batch system started this process."""
    return any(v in os.environ for v in LAUNCHER_VARS)


def launcher_rank():
    """This process's rank as the MPI launcher set it (Open MPI, MPICH/PMI, PMIx, Slurm), else 0."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


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
