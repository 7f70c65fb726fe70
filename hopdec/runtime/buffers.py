"""Before a real decentralized run allocates its receive buffers: do they fit this host's memory?

``--max-ig 1000000`` asks for tens of GiB per rank; checking first turns an out-of-memory kill into one
line naming the option (:func:`hopdec.limits.check_alloc`).
"""

from hopdec.hop.protocols import PROTOCOLS
from hopdec.limits import check_alloc


def receive_buffer_bytes(max_ig, in_neighbors, numel):
    """Host bytes one rank allocates at most for ``--max-ig`` token queues (Hop sec. 4.2).

    ``max_ig + 1`` receive slots per in-neighbour, and for sending at most ``max_ig + 2`` messages: the
    zero-copy path's pool of stores at its cap (:func:`hopdec.runtime.hop_loop.store_cap`; the copying
    path's ring has ``max_ig + 1``), each one message of ``numel`` float32 parameters
    (``hopdec.transport.mpi``).
    """
    from hopdec.transport.message import message_floats
    return ((max_ig + 1) * in_neighbors + max_ig + 2) * message_floats(numel) * 4


def check_buffers(cfg, views, numel, ranks_here=1):
    """ConfigError when the update-queue buffers ``--max-ig`` asks for exceed this host's memory.

    ``ranks_here``: ranks sharing this host, each allocating its own buffers.
    """
    if not PROTOCOLS[cfg.protocol].token_queues:
        return
    widest = max((len(v.in_neighbors) for v in views), default=0)
    ranks = max(ranks_here, 1)
    check_alloc(receive_buffer_bytes(cfg.max_ig, widest, numel) * ranks,
                f"--max-ig {cfg.max_ig}: the update-queue buffers (max_ig + 1 messages of {numel} "
                f"parameters for each of {widest} in-neighbours, max_ig + 2 for sending"
                + (f", on each of {ranks} ranks on this host)" if ranks > 1 else ")"))
