"""When a worker's data moves and its send completes: the simulator's model of the transport.

A real worker keeps its parameters in one of a pool of message-sized stores
(``FlatSGD.use_send_storage``): ``SendParams`` sends from the current store with no copy, ``Reduce``
writes another store and makes it current. It must not overwrite a store a send is still reading, so
:func:`hopdec.runtime.hop_loop.worker_loop` picks the store: the oldest spare whose sends all *completed*
(``MPITransport.sends_done``, a test), else a new store (two to begin with; the pool grows only where a
receiver is slow), up to :func:`hopdec.runtime.hop_loop.store_cap` -- the receive slots a receiver
posts per sender plus one, ``max_ig + 2`` with token queues (Hop sec. 4.2) -- and only at the cap does it
wait for the oldest store's sends (``MPITransport.wait_sent``). That is the default path (CPU models,
and GPU models with a CUDA-aware MPI); a GPU model without a CUDA-aware MPI copies each update into a
ring of send buffers instead and never waits (the *copying* path). The simulator runs the same loop, so
its pool (:class:`hopdec.sim.hop.ZeroCopyTimingBackend`: stores as indices, sends not yet completed
counted per store) grows and waits exactly where the runtime's does, given the same completions.

When does the data move, and when does a send complete? MPI decides by message size:

* up to the transport's **eager limit** the message is buffered (shared memory: copied into the
  receiver's queue; TCP: written into the socket): it travels at once and the send completes at once;
* above it (the **rendezvous** protocol) the receiver must take part: it matches the message inside an
  MPI call. A worker enters MPI between actions and while it waits, never while it computes, so a
  message to a computing worker is taken only when that compute ends. Then, by transport:

  - ``take`` (shared memory): the data travels as the network model says; the receiver takes the
    message -- copies it in, and the send completes -- once it has arrived and the receiver is in MPI;
  - ``push`` (TCP): the request travels first; the receiver acknowledges when it is in MPI, and the
    data moves when the *sender* next enters MPI after the acknowledgement -- a sender that went on to
    compute pushes it only when that compute ends, so the transfer does not overlap the sender's compute
    either; the send completes, and the message is delivered, when the data has arrived.

On the zero-copy path with two stores, a Reduce waited until the sends from the store it overwrote
completed, so a fast worker whose out-neighbour was slow waited in every other Reduce -- the "zero-copy
completion effect" -- even where the protocol (backup workers, staleness, skipping: Hop secs. 5-6) would
let it go on (~33 ms per iteration on a 2x4 torus with a 4x straggler and max_ig 3). With the pool it
waits only when every store up to the cap is still being sent from, which the token bound makes rare: a
worker is at most max_ig iterations ahead of an out-neighbour. On the copying path the data moves the
same way but nothing waits for it.

A receiver-driven transfer over a network (RDMA read: the data moves only after the take) is not
modelled; ``take`` lets it overlap the receiver's compute. Open MPI's eager limits: 4 KiB over shared
memory (``btl_sm_eager_limit``: one host), 64 KiB over TCP (``btl_tcp_eager_limit``). """

import math
from dataclasses import dataclass

PATHS = ("zero-copy", "copy")
DEFAULT_EAGER_BYTES = 65536
"""Open MPI's TCP eager limit (``btl_tcp_eager_limit``), the transport between hosts."""
SHARED_MEMORY_EAGER_BYTES = 4096
"""Open MPI's shared-memory eager limit (``btl_sm_eager_limit``): every rank on one host."""


RENDEZVOUS = ("take", "push")


@dataclass(frozen=True)
class SendPath:
    """``path``: "zero-copy" (the default, as a real CPU run) or "copy"; ``eager_bytes``: the transport's
    eager limit (messages up to it travel and complete at once); ``rendezvous``: how larger messages
    move: "take" (delivered when arrived and the receiver is in MPI) or "push" (the sender writes them
    once the receiver acknowledged, both in MPI)."""

    path: str = "zero-copy"
    eager_bytes: float = DEFAULT_EAGER_BYTES
    rendezvous: str = "take"

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f"send path must be one of {PATHS}, got {self.path!r}")
        if self.rendezvous not in RENDEZVOUS:
            raise ValueError(f"rendezvous must be one of {RENDEZVOUS}, got {self.rendezvous!r}")
        if not (self.eager_bytes >= 0):
            raise ValueError(f"eager limit must be >= 0 bytes, got {self.eager_bytes!r}")

    def protocol(self, nbytes):
        """None (eager) or the rendezvous protocol of a message of ``nbytes``."""
        return None if nbytes <= self.eager_bytes else self.rendezvous

    def waits(self, nbytes):
        """True when a Reduce can wait for this message's receiver (zero-copy and above the eager limit)."""
        return self.path == "zero-copy" and self.protocol(nbytes) is not None

    def describe(self, nbytes=None):
        lim = "no eager limit" if math.isinf(self.eager_bytes) else f"eager limit {self.eager_bytes:g} B"
        out = ("zero-copy sends" if self.path == "zero-copy" else "copying sends") + f" ({lim}, rendezvous " \
            f"{self.rendezvous}"
        if nbytes is not None:
            if self.protocol(nbytes) is None:
                out += ": messages are eager"
            elif self.path == "zero-copy":
                out += ": stores of slow receivers' sends pooled, Reduce waits at the pool's cap"
        return out + ")"

    def as_dict(self):
        return {"path": self.path, "eager_bytes": None if math.isinf(self.eager_bytes) else self.eager_bytes,
                "rendezvous": self.rendezvous}
