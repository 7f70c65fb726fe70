"""MPI transport: parameters travel as one flat float32 buffer per message, on nonblocking point-to-point.

Receive side: for every in-neighbour, ``slots`` buffers with a receive posted on each (uppercase mpi4py
``Irecv`` on numpy buffers: no pickling, one message per update). A buffer holds the parameters followed
by an int64 header with the iteration, so tags stay constant (MPI only promises tags up to 32767) and
iteration numbers are unbounded. A buffer handed to the core as a handle is re-posted once the core frees
it (Reduce or Release). Tokens are tiny int64 messages carrying cumulative counts (see hopdec.tokens).

Send side, zero-copy (:meth:`MPITransport.send_from`): a backend that keeps its parameters in a
message-sized array (see ``LocalTrainer.use_send_storage``) has it sent as it is, and waits
(:meth:`MPITransport.wait_sent`) before overwriting it. Otherwise a ring of send buffers: Send copies
the parameters into the next one (Reduce/Apply change them while the message may still be in flight)
and posts an ``Isend`` per destination.

Buffers are numpy arrays in host memory (a CUDA model is staged through them), or, with
``device_buffers``, torch tensors on the model's device handed to a CUDA-aware MPI directly (no
staging; mpi4py takes them through DLPack). The header trick is the same for both.

Waiting polls ``Testsome`` through :func:`hopdec.transport.waiting.poll_until` (sleeps between polls,
a :class:`~hopdec.transport.waiting.PeerTimeout` naming the ranks it waited for after ``peer_timeout``).
"""

import numpy as np
from mpi4py import MPI

from hopdec.transport.message import header, message_floats
from hopdec.transport.waiting import PeerTimeout, poll_until  # noqa: F401  (PeerTimeout re-exported)

TAG_UPDATE = 101
TAG_GRANT = 102


def cuda_aware_mpi():
    """True when the loaded MPI says it can take CUDA device buffers (Open MPI's
    ``MPIX_Query_cuda_support``); False when it says no or cannot tell."""
    import ctypes
    for lib in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
        try:
            return bool(getattr(ctypes.CDLL(lib), "MPIX_Query_cuda_support")())
        except (OSError, AttributeError):
            continue
    return False


class MPITransport:
    def __init__(self, comm, view, numel, slots, send_ring=None, peer_timeout=120.0, device_buffers=None,
                 host_pinned=False):
        """``device_buffers``: a torch device whose tensors the MPI takes directly (CUDA-aware MPI), or
        None for host numpy buffers -- page-locked with ``host_pinned`` (a GPU model staged through
        them copies to and from the device asynchronously, without a bounce buffer)."""
        self.comm = comm
        self.device_buffers = device_buffers
        self._alloc = lambda n: np.empty(n, dtype=np.float32)
        if host_pinned:
            import torch
            if torch.cuda.is_available():
                self._alloc = lambda n: torch.empty(n, dtype=torch.float32).pin_memory().numpy()
        self._sync = lambda: None
        if device_buffers is not None:
            import torch
            self._alloc = lambda n: torch.empty(n, dtype=torch.float32, device=device_buffers)
            if torch.device(device_buffers).type == "cuda":
                self._sync = lambda: torch.cuda.synchronize(device_buffers)
        self.rank = comm.Get_rank()
        self.numel = numel
        self.length = message_floats(numel)         # parameters, padding, int64 iteration header
        self.peer_timeout = peer_timeout
        self.reqs, self.meta = [], []
        self.bufs = {}
        for j in view.in_neighbors:
            for s in range(slots):
                self.bufs[(j, s)] = self._alloc(self.length)
                self._post(("u", j, s))
        self.grant_bufs = {}
        for j in view.out_neighbors:
            self.grant_bufs[j] = np.zeros(1, dtype=np.int64)
            self._post(("g", j, 0))
        self.ring = [[self._alloc(self.length), []]
                     for _ in range(send_ring or max(2, slots))]
        self._ring_pos = 0
        self._grant_out = []                        # (buffer, request) kept alive until complete
        self._sent_from = {}                        # id(caller's buffer) -> its pending Isends
        self.bytes_sent = 0

    # ---- receive side ----
    def _post(self, meta, index=None):
        kind, j, s = meta
        if kind == "u":
            req = self.comm.Irecv(self.bufs[(j, s)], source=j, tag=TAG_UPDATE)
        else:
            req = self.comm.Irecv(self.grant_bufs[j], source=j, tag=TAG_GRANT)
        if index is None:
            self.reqs.append(req)
            self.meta.append(meta)
        else:
            self.reqs[index] = req
        return req

    def poll(self, core=None):
        """Deliver every message that has arrived to ``core`` (or drop it when None); returns how many."""
        done = MPI.Request.Testsome(self.reqs)
        if not done:
            return 0
        for idx in done:
            kind, j, s = self.meta[idx]
            if kind == "u":
                buf = self.bufs[(j, s)]
                iteration = int(header(buf, self.numel)[0])
                if core is not None:
                    core.on_update(j, iteration, idx)   # the handle is the request slot
                else:
                    self._post(self.meta[idx], idx)
            else:
                if core is not None:
                    core.on_grant(j, int(self.grant_bufs[j][0]))
                self._post(self.meta[idx], idx)
        return len(done)

    def wait(self, core, wait_action):
        """Block until at least one message arrived for ``core``; PeerTimeout after ``peer_timeout`` s."""
        poll_until(lambda: self.poll(core), self.peer_timeout, lambda: (
            f"rank {self.rank}: no {wait_action.what} from rank(s) "
            f"{', '.join(map(str, wait_action.on)) or '?'} for {self.peer_timeout:.0f} s; "
            f"a peer may have died or hung"), on=wait_action.on)

    def payload(self, handle):
        """The parameters in a received buffer (a view, valid until the handle is released)."""
        _, j, s = self.meta[handle]
        return self.bufs[(j, s)][:self.numel]

    def release(self, handles):
        for idx in handles:
            self._post(self.meta[idx], idx)

    # ---- send side ----
    def send_update(self, iteration, dests, fill):
        """Copy the parameters (``fill(out)``) into the next send buffer and Isend it to ``dests``."""
        slot = self.ring[self._ring_pos]
        self._ring_pos = (self._ring_pos + 1) % len(self.ring)
        buf, pending = slot
        if pending:
            MPI.Request.Waitall(pending)            # normally long done: the ring is max_ig + 1 deep
        fill(buf[:self.numel])
        header(buf, self.numel)[0] = iteration
        self._sync()                                # the device copy must land before MPI reads it
        slot[1] = [self.comm.Isend(buf, dest=d, tag=TAG_UPDATE) for d in dests]
        self.bytes_sent += 4 * self.length * len(dests)

    def message_floats(self):
        """Length of a message buffer in float32s: the parameters, padding, the int64 header."""
        return self.length

    def send_from(self, iteration, dests, buf):
        """Isend ``buf`` (a caller's array of :meth:`message_floats` floats, parameters first) as it is:
        no copy. The caller must not change it before :meth:`wait_sent` returns."""
        self.wait_sent(buf)
        header(buf, self.numel)[0] = iteration
        self._sent_from[id(buf)] = [self.comm.Isend(buf, dest=d, tag=TAG_UPDATE) for d in dests]
        self.bytes_sent += 4 * self.length * len(dests)

    def wait_sent(self, buf):
        """Return once every send from ``buf`` completed (normally long ago: an iteration has passed)."""
        reqs = self._sent_from.pop(id(buf), None)
        if not reqs:
            return
        poll_until(lambda: MPI.Request.Testall(reqs), self.peer_timeout,
                   f"rank {self.rank}: an update sent to its out-neighbours was not "
                   f"received for {self.peer_timeout:.0f} s; a peer may have died or hung")

    def send_grants(self, grants):
        self._grant_out = [(b, r) for b, r in self._grant_out if not r.Test()]
        for dest, count in grants:
            b = np.array([count], dtype=np.int64)
            self._grant_out.append((b, self.comm.Isend(b, dest=dest, tag=TAG_GRANT)))

    # ---- shutdown ----
    def close(self):
        """Finish without losing or stranding a message; every phase is bounded by the peer timeout.

        1. Drain (keep receiving and discarding) until every rank has stopped starting sends (Ibarrier).
        2. Drain until our own sends completed; peers are still draining, so they can match them.
        3. Drain until every rank got there (second Ibarrier); then cancel the receives left posted.
        """
        pending = ([r for _, reqs in self.ring for r in reqs] + [r for _, r in self._grant_out]
                   + [r for reqs in self._sent_from.values() for r in reqs])
        self._drain(lambda b=self.comm.Ibarrier(): b.Test(), "every rank to finish training")
        self._drain(lambda: MPI.Request.Testall(pending), "its last messages to be received")
        self._drain(lambda b=self.comm.Ibarrier(): b.Test(), "every rank to finish its messages")
        for r in self.reqs:
            if r != MPI.REQUEST_NULL:
                r.Cancel()
        MPI.Request.Waitall(self.reqs)

    def _drain(self, done, what):
        def step():
            self.poll(None)
            return done()
        poll_until(step, self.peer_timeout, f"rank {self.rank}: waited {self.peer_timeout:.0f} s for "
                                            f"{what} at shutdown; a peer may have died or hung")
