"""Range checks for the numbers ``hopdec train`` accepts, run before anything starts.

argparse only checks that a number parses: ``--lr nan`` trains to accuracy 0.1 and exits 0, a NaN
``--peer-timeout`` turns fault detection off. :func:`check_numbers` rejects every out-of-range value
with a :class:`~hopdec.errors.ConfigError` naming the option; :func:`check_buffers` rejects a
``--max-ig`` whose receive buffers could not fit in this host's memory.
"""

import math
import os

from hopdec.errors import ConfigError
from hopdec.limits import check_alloc

SEED_LIMIT = 2 ** 32
"""Seeds are 0..2**32-1: the emulator's random draws keep 32 bits of the seed, so larger seeds collide."""


def _finite(x):
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def _int(x):
    return not isinstance(x, bool) and isinstance(x, int)


# option, what it must be, test: one row per numeric option of ``hopdec train`` (PS options included)
NUMBERS = (
    ("--iterations", "an integer >= 1", lambda x: _int(x) and x >= 1),
    ("--epochs", "a finite number > 0", lambda x: _finite(x) and x > 0),
    ("--lr", "a finite number > 0", lambda x: _finite(x) and x > 0),
    ("--momentum", "a number in [0, 1)", lambda x: _finite(x) and 0 <= x < 1),
    ("--weight-decay", "a finite number >= 0", lambda x: _finite(x) and x >= 0),
    ("--batch-size", "an integer >= 1", lambda x: _int(x) and x >= 1),
    ("--seed", f"an integer in 0..{SEED_LIMIT - 1}", lambda x: _int(x) and 0 <= x < SEED_LIMIT),
    ("--threads", "an integer >= 1", lambda x: _int(x) and x >= 1),
    ("--max-ig", "an integer >= 1", lambda x: _int(x) and x >= 1),
    ("--backup-workers", "an integer >= 0", lambda x: _int(x) and x >= 0),
    ("--staleness", "an integer >= 0", lambda x: _int(x) and x >= 0),
    ("--compute-time", "a finite number of seconds > 0", lambda x: _finite(x) and x > 0),
    ("--peer-timeout", "a finite number of seconds > 0", lambda x: _finite(x) and x > 0),
    ("--lookahead", "an integer >= 1", lambda x: _int(x) and x >= 1),
    ("--esync-epsilon", "a finite number of seconds", _finite),
    ("--eval-interval", "a finite number of seconds >= 0", lambda x: _finite(x) and x >= 0),
    ("--checkpoint-every", "an integer >= 1", lambda x: _int(x) and x >= 1),
)


def check_numbers(args):
    """Raise ConfigError for the first numeric option outside its range (None: not given, fine)."""
    if getattr(args, "iterations", None) is not None and getattr(args, "epochs", None) is not None:
        raise ConfigError("--iterations and --epochs: give one, not both")
    for option, must_be, ok in NUMBERS:
        value = getattr(args, option[2:].replace("-", "_"), None)
        if value is not None and not ok(value):
            raise ConfigError(f"{option} {value}: must be {must_be}")
    cores = os.cpu_count() or 1
    if getattr(args, "threads", None) is not None and args.threads > cores:
        raise ConfigError(f"--threads {args.threads}: this host has {cores} cores; more torch threads "
                          f"per rank than cores only slows every rank down")


def receive_buffer_bytes(max_ig, in_neighbors, numel):
    """Host bytes one rank's transport allocates for ``--max-ig`` token queues (Hop sec. 4.2).

    ``max_ig + 1`` receive slots per in-neighbour plus as many send buffers, each one message of
    ``numel`` float32 parameters (``hopdec.transport.mpi``).
    """
    from hopdec.transport.message import message_floats
    return (max_ig + 1) * (in_neighbors + 1) * message_floats(numel) * 4


def check_buffers(cfg, views, numel, ranks_here=1):
    """ConfigError when the update-queue buffers ``--max-ig`` asks for exceed this host's memory.

    ``ranks_here``: ranks sharing this host, each allocating its own buffers.
    """
    if cfg.protocol != "tokens":
        return
    widest = max((len(v.in_neighbors) for v in views), default=0)
    ranks = max(ranks_here, 1)
    check_alloc(receive_buffer_bytes(cfg.max_ig, widest, numel) * ranks,
                f"--max-ig {cfg.max_ig}: the update-queue buffers (max_ig + 1 messages of {numel} "
                f"parameters for each of {widest} in-neighbours and for sending"
                + (f", on each of {ranks} ranks on this host)" if ranks > 1 else ")"))
