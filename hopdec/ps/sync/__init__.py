"""The parameter-server sync models, one module each, and the registry that makes them ``--sync`` choices.

======== =============================================== =========================================
``sync``  model                                           paper
======== =============================================== =========================================
bsp       bulk synchronous                                ZipLine paper sec. 2
asp       asynchronous                                    ZipLine paper sec. 2
ssp       stale synchronous, threshold s                  DSSP paper sec. I-A3
dssp      dynamic threshold in [s_L, s_U]                 DSSP paper, Algorithms 1-2
elastic   ElasticBSP, barrier chosen by ZipLine           ZipLine paper, sec. 4-5
backup    sync SGD with b backup workers                  Chen et al., Algorithms 3-4
esync     ESync: state-query server, model differences    ESync, Algorithms 1-2
======== =============================================== =========================================

A new sync model is one module -- a :class:`~hopdec.ps.sync.base.Policy` subclass declaring its ``sync``
name, ``usage``, ``options`` and :meth:`~hopdec.ps.sync.base.Policy.from_options` -- plus its entry in
:data:`SHIPPED` below (or :func:`register` from your own code). ``--sync``, its help, the checkpoint
decoder, the worker core and both executors (MPI, simulator) then take it with no other change.
"""

from hopdec.errors import ConfigError, did_you_mean
from hopdec.ps.sync.asp import ASPPolicy
from hopdec.ps.sync.backup import DEFAULT_BACKUP_WORKERS, BackupPolicy  # noqa: F401  (re-exported)
from hopdec.ps.sync.base import Policy
from hopdec.ps.sync.bsp import BSPPolicy
from hopdec.ps.sync.dssp import DEFAULT_STALENESS_RANGE, DSSPPolicy, parse_staleness_range  # noqa: F401
from hopdec.ps.sync.elastic import DEFAULT_LOOKAHEAD, MAX_LOOKAHEAD, ElasticPolicy  # noqa: F401
from hopdec.ps.sync.esync import ESyncPolicy
from hopdec.ps.sync.ssp import DEFAULT_STALENESS, SSPPolicy  # noqa: F401

POLICIES = {}
"""``--sync`` name -> policy class, in registration order (the order ``--sync`` lists them in)."""


def register(cls):
    """Make ``cls`` (a :class:`Policy` subclass with a ``sync`` name of its own) a ``--sync`` choice."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)) or not cls.sync:
        raise TypeError(f"{cls!r}: a sync model is a Policy subclass with a sync name")
    if POLICIES.get(cls.sync, cls) is not cls:
        raise ValueError(f"--sync {cls.sync} is registered already ({POLICIES[cls.sync].__name__})")
    POLICIES[cls.sync] = cls
    return cls


SHIPPED = (BSPPolicy, ASPPolicy, SSPPolicy, DSSPPolicy, ElasticPolicy, BackupPolicy, ESyncPolicy)
for _cls in SHIPPED:
    register(_cls)

SYNC_MODES = tuple(POLICIES)
"""The shipped sync models' names (:data:`POLICIES` also holds any registered later)."""


def sync_usage():
    """The ``--sync`` help's list of models with their options."""
    return ", ".join(cls.usage or cls.sync for cls in POLICIES.values())


def sync_policy(sync, workers, **options):
    """Validate the options ``sync`` reads and build its policy (ConfigError: one line naming the option).

    ``workers``: the worker ids (MPI ranks), or a count n for ids 0..n-1. ``options``: the PS settings
    (``staleness``, ``staleness_range``, ``lookahead``, ``backup_workers``, ``esync_epsilon``); a model
    looks only at its own (:attr:`Policy.options`), None takes its documented default. Call it before
    any communication.
    """
    cls = POLICIES.get(sync)
    if cls is None:
        raise ConfigError(f"--sync must be one of {', '.join(POLICIES)}, got {sync!r}"
                          f"{did_you_mean(str(sync), list(POLICIES))}")
    if isinstance(workers, int):
        if workers < 1:
            raise ConfigError(f"--mode ps needs at least 2 ranks (1 server + 1 worker), got {workers}+1 "
                              f"(run it under mpirun -n 2 or more)")
        workers = range(workers)
    return cls.from_options(workers, **options)
