"""Sizes a user controls are checked against this host's memory before anything is allocated.

A 110-byte LIBSVM file or ``--max-ig 1000000`` can ask for tens of GiB; asking first turns an
out-of-memory kill (or a machine swapping for minutes) into one line naming what asked for how much.
"""

import os

from hopdec.errors import ConfigError


def host_memory_bytes():
    """Physical memory of this host, or the cgroup (container) limit when that is smaller."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        total = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                limit = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit > 0 and (total is None or limit < total):
            total = limit
    return total


def gib(nbytes):
    """``nbytes`` as a short human figure in GiB (``0.5 GiB``, ``75 GiB``, ``1.2e+06 GiB``)."""
    g = nbytes / 2 ** 30
    return f"{g:.2g} GiB" if g < 10 else f"{g:.0f} GiB" if g < 1e5 else f"{g:.2g} GiB"


def check_alloc(nbytes, what):
    """Raise ConfigError ``"{what} would need N GiB, more than this host's M GiB"`` if it cannot fit."""
    limit = host_memory_bytes()
    if limit is not None and nbytes > limit:
        raise ConfigError(f"{what} would need {gib(nbytes)} of memory, more than this host's "
                          f"{gib(limit)}")


MAX_WORKERS = 100_000
"""The most workers a topology, ``hopdec topo generate`` or ``hopdec sim -n`` may have: the simulator and
``topo analyze`` are built for thousands (10,000 workers simulate in minutes), an MPI job for far fewer;
``ring -n 10000000`` used to run for hours."""


def check_workers(n, what):
    """ConfigError unless 1 <= ``n`` <= :data:`MAX_WORKERS` (``what`` names the option or kind)."""
    if n > MAX_WORKERS:
        raise ConfigError(f"{what}: {n} workers, more than hopdec handles ({MAX_WORKERS}: the simulator and "
                          f"topo analyze are built for thousands)")
