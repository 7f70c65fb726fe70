"""What the launcher (``mpirun``, ``srun``, ...) told this process through its environment: whether one
started it, its rank, and its place among the ranks on its host. Read before MPI is initialised (a bad
command line is reported by rank 0 alone without it) and by what prints (a bar only without a launcher).
A network testbed (:mod:`hopdec.testbed`) also tells every rank the emulated network's conditions, for
its log header and summary.
"""

import json
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


# ---- the emulated network a run had (hopdec.testbed): pure, no kernel access ----
NETWORK_ENV = "HOPDEC_NETWORK"
"""JSON conditions a testbed passes to every rank (:meth:`hopdec.testbed.spec.Testbed.conditions`):
``hopdec train`` writes them into every log header (key ``network``) and names them on the summary's
``times:`` line, so a figure is never read without the links it was measured on."""
MAX_NETWORK_CHARS = 1 << 16


def network_conditions(environ=None):
    """The conditions in the environment: a dict, ``None`` when not set; a value that is not a JSON
    object (or is too long) is kept as ``{"unparsed": first 200 characters}`` -- a label, never code."""
    text = (os.environ if environ is None else environ).get(NETWORK_ENV)
    if not text:
        return None
    try:
        value = json.loads(text) if len(text) <= MAX_NETWORK_CHARS else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"unparsed": text[:200]}


def network_label(cond):
    """One line for the summary: ``network EMULATED (...)`` with hosts and the distinct link settings."""
    if not cond:
        return ""
    if "hosts" not in cond:
        return "network EMULATED (conditions not readable)"
    hosts = cond.get("hosts") or []
    nics = sorted({h.get("nic_mbit") for h in hosts}, key=lambda x: (x is None, x or 0))
    links = sorted({(lk.get("mbit"), lk.get("delay_ms")) for lk in cond.get("links") or []},
                   key=lambda x: (x[0] is None, x[0] or 0, x[1] or 0))

    def bw(x):
        return "unshaped" if x is None else f"{x:g} Mbit/s"
    parts = [f"{len(hosts)} hosts in network namespaces" + (f" ({cond['testbed']})" if cond.get("testbed") else ""),
             "NICs " + ", ".join(bw(x) for x in nics)]
    if links:
        parts.append("links " + ", ".join(bw(m) + (f" +{d:g} ms" if d else "") for m, d in links))
    return "network EMULATED: " + "; ".join(parts)
