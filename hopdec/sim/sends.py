"""When a worker's send completes: the simulator's model of the transport's two send paths.

A real worker keeps its parameters in one of two message-sized stores (``FlatSGD.use_send_storage``):
``SendParams`` sends from the current store with no copy, ``Reduce`` writes the other store and makes it
current -- but first waits until every send made from that store *completed*
(``MPITransport.wait_sent``, called by :func:`hopdec.runtime.hop_loop.worker_loop`). That is the
default path (CPU models, and GPU models with a CUDA-aware MPI); a GPU model without a CUDA-aware MPI
copies each update into a ring of send buffers instead and never waits (the *copying* path).

When does a send complete? MPI decides by message size:

* up to the transport's **eager limit** the message is buffered (shared memory: copied into the
  receiver's queue; TCP: written into the socket) and the send completes at once;
* above it (the **rendezvous** protocol) the receiver must take part: it matches the message and pulls
  or acknowledges the data inside an MPI call. A worker enters MPI between actions and while it waits,
  not while it computes, so a send to a worker that is computing completes only when that compute
  ends. A fast worker whose out-neighbour is slow thus waits in its Reduce -- the "zero-copy completion
  effect" -- even where the protocol (backup workers, staleness) would let it go on.

The model: a data message above ``eager_bytes`` on the zero-copy path completes when it has arrived and
the receiver is not computing (at arrival, or at the end of the compute the receiver is in then); any
other send completes at once (the network still takes its time to deliver it). Open MPI's eager limits:
4 KiB over shared memory (``btl_sm_eager_limit``: one host), 64 KiB over TCP (``btl_tcp_eager_limit``).
"""

import math
from dataclasses import dataclass

PATHS = ("zero-copy", "copy")
DEFAULT_EAGER_BYTES = 65536
"""Open MPI's TCP eager limit (``btl_tcp_eager_limit``), the transport between hosts."""
SHARED_MEMORY_EAGER_BYTES = 4096
"""Open MPI's shared-memory eager limit (``btl_sm_eager_limit``): every rank on one host."""


@dataclass(frozen=True)
class SendPath:
    """``path``: "zero-copy" (the default, as a real CPU run) or "copy"; ``eager_bytes``: the transport's
    eager limit (messages up to it complete at once on either path)."""

    path: str = "zero-copy"
    eager_bytes: float = DEFAULT_EAGER_BYTES

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f"send path must be one of {PATHS}, got {self.path!r}")
        if not (self.eager_bytes >= 0):
            raise ValueError(f"eager limit must be >= 0 bytes, got {self.eager_bytes!r}")

    def waits(self, nbytes):
        """True when a Reduce can wait for this message's receiver (zero-copy and above the eager limit)."""
        return self.path == "zero-copy" and nbytes > self.eager_bytes

    def describe(self, nbytes=None):
        if self.path == "copy":
            return "copying sends (never wait)"
        lim = "no eager limit" if math.isinf(self.eager_bytes) else f"eager limit {self.eager_bytes:g} B"
        out = f"zero-copy sends ({lim}"
        if nbytes is not None:
            out += ": Reduce waits for slow receivers" if self.waits(nbytes) else ": messages are eager, never wait"
        return out + ")"

    def as_dict(self):
        return {"path": self.path, "eager_bytes": None if math.isinf(self.eager_bytes) else self.eager_bytes}
