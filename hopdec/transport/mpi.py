"""MPI transport: parameters travel as one flat float32 buffer per message, on nonblocking point-to-point.

Receive side: for every in-neighbour, ``slots`` buffers with a receive posted on each (uppercase mpi4py
``Irecv`` on numpy buffers: no pickling, one message per update). A buffer holds the parameters followed
by an int64 header with the iteration, so tags stay constant (MPI only promises tags up to 32767) and
iteration numbers are unbounded. A buffer handed to the core as a handle is re-posted once the core frees
it (Reduce or Release). Token grants are cumulative counts (:mod:`hopdec.hop.token_queue`): the second
header field of an update carries the sender's grant to its receiver when the worker grants and sends at
once (entering an iteration on the parallel graph; ``-1``: none), and a grant that rides on no update is
a tiny int64 message of its own.

Send side, zero-copy (:meth:`MPITransport.send_from`): a backend that keeps its parameters in a
pool of message-sized arrays (see ``LocalTrainer.use_send_storage``) has the current one sent as it is,
and overwrites only one whose sends completed (:meth:`MPITransport.sends_done` tests, without waiting;
:meth:`MPITransport.wait_sent` waits). Otherwise a ring of send buffers: Send copies
the parameters into the next one (Reduce/Apply change them while the message may still be in flight)
and posts an ``Isend`` per destination.

Buffers are numpy arrays in host memory (a CUDA model is staged through them), or, with
``device_buffers``, torch tensors on the model's device handed to a CUDA-aware MPI directly (no
staging; mpi4py takes them through DLPack). The header trick is the same for both.

Waiting polls ``Testsome`` through :func:`hopdec.transport.waiting.poll_until` (sleeps between polls,
a :class:`~hopdec.transport.waiting.PeerTimeout` naming the ranks it waited for after ``peer_timeout``).
"""

import time

import numpy as np
from mpi4py import MPI

from hopdec.transport.message import NO_GRANT, header, message_floats, split_grants
from hopdec.transport.waiting import SPIN_S, PeerFailed, PeerTimeout, WaitClock, poll_until  # noqa: F401  (re-exported)

Testsome, Testall = MPI.Request.Testsome, MPI.Request.Testall

TAG_UPDATE = 101
TAG_GRANT = 102
HEADER_FIELDS = 2
"""int64 fields after the parameters of an update: its iteration, the carried grant (NO_GRANT: none)."""


def cuda_aware_mpi():
    """True when the loaded MPI says it can take CUDA device buffers (Open MPI's
    ``MPIX_Query_cuda_support``), False when it says it cannot, None when it does not say (another MPI)."""
    import ctypes
    for lib in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
        try:
            return bool(getattr(ctypes.CDLL(lib), "MPIX_Query_cuda_support")())
        except (OSError, AttributeError):
            continue
    return None


FAILURE_CLASSES = (18, 75, 76, 77)
"""MPI error classes that mean a peer failed (ULFM): ERR_IN_STATUS (a completion among several failed),
ERR_PROC_FAILED, ERR_PROC_FAILED_PENDING, ERR_REVOKED (another survivor began the recovery)."""


def is_peer_failure(err, comm=None):
    """True when ``err`` means a peer failed (ULFM). Open MPI 5.0 reports a failure inside a nonblocking
    collective as MPI_ERR_OTHER ("NBC_Progress: an error 75 was found during schedule", 77 when another
    survivor revoked the communicator); then ``comm`` says whether it was one: revoked (a recovery began:
    hopdec revokes only to heal), or a failed process in its group (polled for up to
    ``FAILED_GROUP_WAIT_S``: the schedule may have been aborted by a peer's error before this rank's
    detector knows who died -- a revoke by a survivor that saw a death this rank never talked to, say)."""
    if isinstance(err, PeerFailed):
        return True
    get = getattr(err, "Get_error_class", None)
    if get is None:
        return False
    cls = get()
    if cls in FAILURE_CLASSES:
        return True
    if cls == MPI.ERR_OTHER and comm is not None:
        deadline = time.monotonic() + FAILED_GROUP_WAIT_S
        while True:
            try:
                if comm.Is_revoked() or comm.Get_failed().Get_size() > 0:
                    return True
            except Exception:
                return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    return False


FAILED_GROUP_WAIT_S = 2.0



class _Sends(list):
    """The Isend requests of one update, with the ranks they go to (``dests``: named on a timeout)."""
    __slots__ = ("dests",)

class MPITransport:
    """One worker's end of the Hop messages. Workers are named by their ids (the ranks of the run's first
    communicator); ``peers`` maps them to ranks of the current one, which differs after a heal.

    With ``fault_tolerant`` (the communicator returns errors, ULFM), an MPI error that means a peer failed
    never escapes from inside the worker loop: it is recorded, and the next :meth:`wait` (or
    :meth:`close`) raises :class:`~hopdec.transport.waiting.PeerFailed`, so the driver can heal and
    :meth:`reconfigure` the transport onto the shrunk communicator.
    """

    silence = "a peer may have died or hung"
    """What a training wait that timed out says may have happened (a user's loop adds its own cause)."""

    def __init__(self, comm, view, numel, slots, send_ring=None, peer_timeout=120.0, device_buffers=None,
                 host_pinned=False, fault_tolerant=False):
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
        self.rank = view.rank                       # this worker's id
        self.peers = {r: r for r in range(comm.Get_size())}
        self.numel = numel
        self.length = message_floats(numel, HEADER_FIELDS)   # parameters, padding, int64 header
        self.peer_timeout = peer_timeout
        self.spin_s = SPIN_S                    # a wait polls (yielding) this long before it naps
        self.waiting = WaitClock()              # the current wait, over repeated Waits (see wait)
        self.fault_tolerant = fault_tolerant
        self.failed = False                         # a peer failure was seen; the next wait raises
        self.slots = slots
        self.reqs, self.meta = [], []
        self._slot_views = []                       # per request slot: (parameters, header) of an update
        self.bufs = {}
        self._headers = {}                          # id(buffer) -> (buffer, its header view)
        self.gone = set()                           # senders that failed: their slots are never reposted
        self.grantees = set(view.in_neighbors)      # workers this one grants tokens to
        for j in view.in_neighbors:
            self._add_sender(j)
        self.grant_bufs = {}
        for j in view.out_neighbors:
            self.grant_bufs[j] = np.zeros(1, dtype=np.int64)
            self._post(("g", j, 0))
        self._ring_depth = send_ring or max(2, slots)
        # the copying path's send buffers; the zero-copy path (send_from) never needs them: made at the
        # first send_update (a transport that needs them from the start makes them here)
        self.ring = [] if self.lazy_ring else self._make_ring(self._ring_depth, view)
        self._ring_pos = 0
        self._grant_out = []                        # (buffer, request) kept alive until complete
        self._sent_from = {}                        # id(caller's buffer) -> its pending Isends
        self._graveyard = []                        # requests of communicators left behind by heals
        self.bytes_sent = 0
        self.updates_sent = 0                       # update messages (one per destination)
        self.grant_messages = 0                     # grants sent as messages of their own
        self.grants_carried = 0                     # grants that rode in an update's header

    lazy_ring = True
    """The send ring is made at the first :meth:`send_update` (zero-copy workers never make it)."""

    def _make_ring(self, depth, view):
        """The send buffers: ``[buffer, its pending Isends]`` each (a coded transport's are smaller)."""
        return [[self._alloc(self.length), []] for _ in range(depth)]

    # ---- failures (ULFM) ----
    def _mpi(self, fn, default=None):
        """Run an MPI call; a peer failure is recorded (when fault tolerant) instead of raised.

        Once a failure is recorded no MPI call touches the old communicator again until
        :meth:`reconfigure`: when ``Testsome`` raises, the request handles MPI already released are not
        copied back to the Python objects, which then dangle."""
        if self.failed:
            return default
        try:
            return fn()
        except MPI.Exception as err:
            self._failure(err)
            return default

    def _failure(self, err):
        """Record a peer failure (fault tolerant), or raise any other MPI error."""
        if not self.fault_tolerant or err.Get_error_class() not in FAILURE_CLASSES:
            raise err
        self.failed = True

    def _bury(self, reqs):
        """Keep requests that may still be active referenced (see :meth:`reconfigure`)."""
        if reqs:
            self._graveyard.append(reqs)

    def _raise_if_failed(self):
        if self.failed:
            raise PeerFailed(f"rank {self.rank}: a peer failed")

    # ---- receive side ----
    def _add_sender(self, j):
        for s in range(self.slots):
            self.bufs[(j, s)] = self._alloc(self.length)
            self._post(("u", j, s))

    def _post(self, meta, index=None):
        kind, j, s = meta
        req = MPI.REQUEST_NULL
        if not self.failed:
            try:
                if kind == "u":
                    req = self.comm.Irecv(self.bufs[(j, s)], source=self.peers[j], tag=TAG_UPDATE)
                else:
                    req = self.comm.Irecv(self.grant_bufs[j], source=self.peers[j], tag=TAG_GRANT)
            except MPI.Exception as err:
                self._failure(err)
        if index is None:
            self.reqs.append(req)
            self.meta.append(meta)
            buf = self.bufs[(j, s)] if kind == "u" else None
            self._slot_views.append(None if buf is None else (buf[:self.numel], header(buf, self.numel)))
        else:
            self.reqs[index] = req
        return req

    def poll(self, core=None):
        """Deliver every message that has arrived to ``core`` (or drop it when None); returns how many.
        An update's carried grant is delivered before the update."""
        done = self._arrived()
        if not done:
            return 0
        meta = self.meta
        for idx in done:
            kind, j, _ = meta[idx]
            if kind == "u":
                if core is not None:
                    iteration, grant = self._slot_views[idx][1].tolist()
                    if grant != NO_GRANT:
                        core.on_grant(j, grant)
                    core.on_update(j, iteration, idx)   # the handle is the request slot
                else:
                    self._post(meta[idx], idx)
            else:
                if core is not None:
                    core.on_grant(j, int(self.grant_bufs[j][0]))
                self._post(self.meta[idx], idx)
        return len(done)

    def _arrived(self):
        """Indices of the receives that completed (none after a recorded peer failure)."""
        if self.failed:
            return None
        try:                                        # (the hot path: no closure, as _mpi would need)
            return Testsome(self.reqs)
        except MPI.Exception as err:
            self._failure(err)
            return None

    def wait(self, core, wait_action):
        """Block until at least one message arrived for ``core``; PeerTimeout after ``peer_timeout`` s,
        PeerFailed at once when a peer failure was seen (fault tolerant)."""
        def arrived():
            got = self.poll(core)
            self._raise_if_failed()
            return got
        left = self.waiting.left(self.peer_timeout)     # timed from the first Wait of this wait
        poll_until(arrived, left, lambda: (
            f"rank {self.rank}: no {wait_action.what} from rank(s) "
            f"{', '.join(map(str, wait_action.on)) or '?'} for {self.peer_timeout:.0f} s; "
            f"{self.silence}"), on=wait_action.on, started=self.waiting.began, spin=self.spin_s)

    def wait_over(self):
        """The worker acted after waiting (``worker_loop`` calls this): its next wait is timed afresh."""
        self.waiting.over()

    def payload(self, handle):
        """The parameters in a received buffer (a view, valid until the handle is released)."""
        return self._slot_views[handle][0]

    def release(self, handles):
        meta, gone = self.meta, self.gone
        for idx in handles:
            m = meta[idx]
            if not gone or m[1] not in gone:
                self._post(m, idx)

    # ---- send side ----
    def _isend(self, buf, dest, tag):
        if self.failed:
            return MPI.REQUEST_NULL
        try:
            return self.comm.Isend(buf, dest=self.peers[dest], tag=tag)
        except MPI.Exception as err:
            self._failure(err)
            return MPI.REQUEST_NULL

    def _header(self, buf):
        """The header view of a message buffer (cached: buffers live as long as the transport)."""
        h = self._headers.get(id(buf))
        if h is None or h[0] is not buf:
            if len(self._headers) > 4 * len(self.bufs) + 16:    # callers' buffers that came and went
                self._headers.clear()
            h = self._headers[id(buf)] = (buf, header(buf, self.numel))
        return h[1]

    def _complete(self, reqs, what):
        """Wait for ``reqs`` with the peer timeout; a failure (fault tolerant) abandons them."""
        if self.failed:
            return
        try:                                        # normally long done: one test, no closures
            if Testall(reqs):
                return
        except MPI.Exception as err:
            self._failure(err)
            return

        def done():
            got = self._mpi(lambda: MPI.Request.Testall(reqs), True)
            return got or self.failed
        dests = list(getattr(reqs, "dests", ()))
        waiting_on = list(dests)                    # filled with the receivers still missing, on timeout

        def message():
            try:
                waiting_on[:] = [d for r, d in zip(reqs, dests) if not r.Test()]
            except Exception:
                pass
            to = f" (to rank(s) {', '.join(map(str, waiting_on))})" if waiting_on else ""
            return f"rank {self.rank}: {what}{to} for {self.peer_timeout:.0f} s; {self.silence}"
        # ``on``: the failure election prefers a notice that names a silent (hung) rank over one that waits
        # for ranks which themselves reported (tests/test_train_mpi.py: a hung rank's in-neighbour blocked
        # here, not in a receive, was out-voted by a rank further away)
        poll_until(done, self.peer_timeout, message, on=waiting_on)

    carries_grants = True
    """Grants that come with a send ride in the update's header (see :func:`hopdec.runtime.hop_loop.worker_loop`)."""

    def _carry(self, dests, grants):
        """(count the header carries, grants left to send as messages): :func:`split_grants`."""
        carried, rest = split_grants(dests, grants, self.grantees)
        if carried != NO_GRANT:
            self.grants_carried += len(grants) - len(rest)
        return carried, rest

    def _stamp(self, buf, iteration, dests, grants):
        """Write the header (iteration, carried grant); send the grants it cannot carry as messages."""
        carried, rest = self._carry(dests, grants)
        hdr = self._header(buf)
        hdr[0] = iteration
        hdr[1] = carried
        if rest:
            self.send_grants(rest)

    def send_update(self, iteration, dests, fill, grants=None):
        """Copy the parameters (``fill(out)``) into the next send buffer and Isend it to ``dests``;
        ``grants`` as for :meth:`send_from`."""
        if not self.ring:
            self.ring = self._make_ring(self._ring_depth, None)
        slot = self.ring[self._ring_pos]
        self._ring_pos = (self._ring_pos + 1) % len(self.ring)
        buf, pending = slot
        if pending:                                 # normally long done: the ring is max_ig + 1 deep
            self._complete(pending, "an update sent to its out-neighbours was not received")
            if self.failed:
                self._bury(pending)
        fill(buf[:self.numel])
        self._stamp(buf, iteration, dests, grants)
        self._sync()                                # the device copy must land before MPI reads it
        slot[1] = _Sends(self._isend(buf, d, TAG_UPDATE) for d in dests)
        slot[1].dests = tuple(dests)
        self.bytes_sent += 4 * self.length * len(dests)
        self.updates_sent += len(dests)

    def message_floats(self):
        """Length of a message buffer in float32s: the parameters, padding, the int64 header."""
        return self.length

    def send_from(self, iteration, dests, buf, grants=None):
        """Isend ``buf`` (a caller's array of :meth:`message_floats` floats, parameters first) as it is:
        no copy. The caller must not change it before :meth:`wait_sent` returns. ``grants``: token grants
        ``[(worker, cumulative)]`` due now, carried in the header where possible (:meth:`_carry`)."""
        self.wait_sent(buf)
        self._stamp(buf, iteration, dests, grants)
        self._sync()                                # device buffers: the step and Reduce that wrote them
        sends = self._sent_from[id(buf)] = _Sends(self._isend(buf, d, TAG_UPDATE) for d in dests)
        sends.dests = tuple(dests)
        self.bytes_sent += 4 * self.length * len(dests)
        self.updates_sent += len(dests)

    def sends_done(self, buf):
        """Whether every send from ``buf`` completed (one ``Testall``, never a wait): a worker's Reduce
        picks a store of its pool this says is free (:func:`hopdec.runtime.hop_loop.writable_store`). After
        a recorded peer failure the sends are abandoned (kept referenced) and the store is free."""
        reqs = self._sent_from.get(id(buf))
        if not reqs:
            return True
        if not self.failed:
            try:
                if not Testall(reqs):
                    return False
            except MPI.Exception as err:
                self._failure(err)
        del self._sent_from[id(buf)]
        if self.failed:
            self._bury(reqs)
        return True

    def wait_sent(self, buf):
        """Return once every send from ``buf`` completed (normally long ago: an iteration has passed)."""
        reqs = self._sent_from.pop(id(buf), None)
        if reqs:
            self._complete(reqs, "an update sent to its out-neighbours was not received")
            if self.failed:
                self._bury(reqs)

    def send_grants(self, grants):
        if self.failed:
            self._bury(self._grant_out)
            self._grant_out = []
        self._grant_out = [(b, r) for b, r in self._grant_out if not self._mpi(r.Test, False)]
        for dest, count in grants:
            b = np.array([count], dtype=np.int64)
            self._grant_out.append((b, self._isend(b, dest, TAG_GRANT)))
        self.grant_messages += len(grants)

    def counters(self):
        """Messages sent so far: ``updates``, ``grant_messages``, ``grants_carried``, ``bytes``."""
        return dict(updates=self.updates_sent, grant_messages=self.grant_messages,
                    grants_carried=self.grants_carried, bytes=self.bytes_sent)

    # ---- after a heal ----
    def reconfigure(self, comm, view, held, peers):
        """Go on over ``comm`` (the survivors' shrunk communicator) with the healed ``view``. ``held``:
        handles the core still holds (their buffers stay untouched until released); ``peers``: worker id
        -> rank in ``comm``. Every other receive is posted anew; sends in flight on the old communicator
        are forgotten (they are lost; the core sends its update again)."""
        # The old communicator's requests stay referenced: freeing an active one that ULFM later
        # completes with an error is fatal; they are never tested again.
        self._graveyard.append((self.comm, list(self.reqs), [p for _, p in self.ring], self._grant_out,
                                self._sent_from))
        self.comm, self.peers, self.failed = comm, dict(peers), False
        senders = set(view.in_neighbors)
        self.grantees = set(senders)
        held = set(held)
        known = {j for (j, _) in self.bufs}
        self.gone |= known - senders
        for idx, (kind, j, s) in enumerate(self.meta):
            self.reqs[idx] = MPI.REQUEST_NULL
            if kind == "u" and j in senders and idx not in held:
                self._post(self.meta[idx], idx)
        for j in sorted(senders - known):
            self.gone.discard(j)
            self._add_sender(j)
        for j in view.out_neighbors:
            if j not in self.grant_bufs:
                self.grant_bufs[j] = np.zeros(1, dtype=np.int64)
                self._post(("g", j, 0))
            else:
                idx = self.meta.index(("g", j, 0))
                self._post(self.meta[idx], idx)
        for slot in self.ring:
            slot[1] = []
        self._grant_out, self._sent_from = [], {}

    # ---- shutdown ----
    def close(self):
        """Finish without losing or stranding a message; every phase is bounded by the peer timeout.

        1. Drain (keep receiving and discarding) until every rank has stopped starting sends (Ibarrier).
        2. Drain until our own sends completed; peers are still draining, so they can match them.
        3. Drain until every rank got there (second Ibarrier); then cancel the receives left posted.
        A peer failure (fault tolerant) raises PeerFailed: heal, then close again.
        """
        pending = ([r for _, reqs in self.ring for r in reqs] + [r for _, r in self._grant_out]
                   + [r for reqs in self._sent_from.values() for r in reqs])
        barriers = [self._mpi(self.comm.Ibarrier)]
        self._bury(barriers)                        # referenced until the end, whatever happens
        self._drain(lambda: self._mpi(barriers[0].Test), "every rank to finish training")
        self._drain(lambda: self._mpi(lambda: MPI.Request.Testall(pending)), "its last messages to be received")
        barriers.append(self._mpi(self.comm.Ibarrier))
        self._drain(lambda: self._mpi(barriers[1].Test), "every rank to finish its messages")
        for r in self.reqs:
            if r != MPI.REQUEST_NULL:
                self._mpi(r.Cancel)
        self._mpi(lambda: MPI.Request.Waitall(self.reqs))

    def _drain(self, done, what):
        def step():
            self.poll(None)
            self._raise_if_failed()
            return done()
        poll_until(step, self.peer_timeout, f"rank {self.rank}: waited {self.peer_timeout:.0f} s for "
                                            f"{what} at shutdown; a peer may have died or hung")
