"""The parameter-server sync models, one module each, and :func:`make_policy` to build one from options.

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
"""

import math

from hopdec.errors import ConfigError
from hopdec.ps.sync.asp import ASPPolicy
from hopdec.ps.sync.backup import BackupPolicy
from hopdec.ps.sync.base import Policy  # noqa: F401
from hopdec.ps.sync.bsp import BSPPolicy
from hopdec.ps.sync.dssp import DSSPPolicy
from hopdec.ps.sync.elastic import ElasticPolicy
from hopdec.ps.sync.esync import ESyncPolicy
from hopdec.ps.sync.ssp import SSPPolicy

SYNC_MODES = ("bsp", "asp", "ssp", "dssp", "elastic", "backup", "esync")

# Defaults when an option is not given. ssp: DSSP Table I's s=3. dssp: Table I's s_L=3, r=12,
# i.e. (s_L, s_U) = (3, 15). elastic: the ZipLine paper's "SmallR" lookahead R=15. backup: b = 1.
DEFAULT_STALENESS = 3
DEFAULT_STALENESS_RANGE = (3, 15)
DEFAULT_LOOKAHEAD = 15
DEFAULT_BACKUP_WORKERS = 1
MAX_LOOKAHEAD = 10_000
"""ZipLine's input is workers x R floats: a bound keeps ``--lookahead`` from exhausting memory."""


def parse_staleness_range(text):
    """``"sL,sU"`` -> (sL, sU); a tuple/list passes through; None gives the default. The range itself is
    checked by :class:`DSSPPolicy` (one place)."""
    if text is None:
        return DEFAULT_STALENESS_RANGE
    parts = list(text) if isinstance(text, (tuple, list)) else str(text).split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        return tuple(_check_int("--staleness-range", x.strip() if isinstance(x, str) else x, None)
                     for x in parts)
    except ConfigError:
        raise ConfigError(f"--staleness-range must be two integers sL,sU (e.g. 3,15), got {text!r}") from None
    except ValueError:
        raise ConfigError(f"--staleness-range must be two integers sL,sU (e.g. 3,15), got {text!r}") from None


def _check_int(name, value, minimum):
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, int):
        try:
            if float(value) != int(float(value)):
                raise ValueError
            value = int(float(value))
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def make_policy(sync, workers, *, staleness=None, staleness_range=None, lookahead=None,
                backup_workers=None, esync_epsilon=0.0):
    """Validate the settings ``sync`` uses and build its policy (ConfigError: one line naming the option).

    ``workers``: the worker ids (MPI ranks), or a count n for ids 0..n-1. Options a mode does not use
    are not looked at; None takes the documented default. Call it before any communication.
    """
    if sync not in SYNC_MODES:
        raise ConfigError(f"--sync must be one of {', '.join(SYNC_MODES)}, got {sync!r}")
    if isinstance(workers, int):
        if workers < 1:
            raise ConfigError(f"--mode ps needs at least 2 ranks (1 server + 1 worker), got {workers}+1 "
                              f"(run it under mpirun -n 2 or more)")
        workers = range(workers)
    if sync == "bsp":
        return BSPPolicy(workers)
    if sync == "asp":
        return ASPPolicy(workers)
    if sync == "ssp":
        s = DEFAULT_STALENESS if staleness is None else _check_int("--staleness", staleness, 0)
        return SSPPolicy(workers, s)
    if sync == "dssp":
        return DSSPPolicy(workers, *parse_staleness_range(staleness_range))
    if sync == "elastic":
        r = DEFAULT_LOOKAHEAD if lookahead is None else _check_int("--lookahead", lookahead, 1)
        if r > MAX_LOOKAHEAD:
            raise ConfigError(f"--lookahead {r}: at most {MAX_LOOKAHEAD} predicted pushes per worker "
                              f"(ZipLine holds workers x R times)")
        return ElasticPolicy(workers, r)
    if sync == "backup":
        b = DEFAULT_BACKUP_WORKERS if backup_workers is None else _check_int("--backup-workers",
                                                                             backup_workers, 0)
        return BackupPolicy(workers, b)
    eps = float(esync_epsilon or 0.0)
    if not math.isfinite(eps):
        raise ConfigError(f"--esync-epsilon must be a finite number of seconds, got {esync_epsilon!r}")
    return ESyncPolicy(workers, epsilon=eps)
