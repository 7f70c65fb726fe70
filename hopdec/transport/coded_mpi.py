"""Compressed exchanges over MPI (``--compress``): the MPI transport with coded per-edge streams.

The protocol's view is unchanged (updates, grants, handles; :class:`hopdec.transport.mpi.MPITransport`);
what travels is smaller. A Send codes the parameters once per group of receivers that hold the same copy
(:class:`hopdec.transport.streams.SenderStreams`) into a message of the codec's size
(:mod:`hopdec.transport.codec`: four int64 header fields, then the code), Isent from a ring of small
buffers; the first message to each receiver is a key (the full float32 parameters, on a tag of its own,
from a buffer kept until its sends complete). The parameters' storage is only read, so the trainer's
stores need no wait before Reduce overwrites them (:meth:`sends_done` is always true, :meth:`wait_sent`
returns at once: the pool stays at two stores).

Receive side, per in-neighbour: ``slots`` small buffers with receives posted (as many as the
uncompressed transport posts full ones) and one full-size key buffer that becomes the neighbour's
reconstruction (:class:`hopdec.transport.streams.ReceiverStreams`): memory is one model copy per
in-neighbour instead of ``slots``. Updates reach the core in stream order (a message that completes before
its predecessor, e.g. a coded one overtaking its key on the other tag, waits), and a received update's
payload is the reconstruction after folding it in -- lazily, when the core uses or frees it.
"""

import numpy as np

from hopdec.transport import codec as C
from hopdec.transport.message import NO_GRANT, split_grants
from hopdec.transport.mpi import MPI, MPITransport
from hopdec.transport.streams import ReceiverStreams, SenderStreams

TAG_CODED = 103
TAG_KEY = 104


class CodedMPITransport(MPITransport):
    """:class:`~hopdec.transport.mpi.MPITransport` whose updates are coded (``spec``: a ``--compress`` spec).
    Host buffers only (no CUDA-aware device buffers); no fault tolerance (a heal would lose stream messages)."""

    def __init__(self, comm, view, numel, slots, spec, send_ring=None, peer_timeout=120.0, host_pinned=False):
        self.spec = C.parse_compress(spec)
        self.codec = C.make_codec(self.spec, numel)
        self.coded_bytes = self.codec.message_bytes()
        self.tx = SenderStreams(self.codec, numel)
        self.rx = ReceiverStreams(self.codec, numel, adopt_keys=True)
        self.keybufs = {}
        self._seq = {}                          # request slot -> sequence number of the message it holds
        self._keys_out = {}                     # id(key buffer) -> the buffer, kept until its sends complete
        self._stage = None
        self.key_messages = 0
        self.key_bytes = 0
        super().__init__(comm, view, numel, slots, send_ring=send_ring, peer_timeout=peer_timeout,
                         host_pinned=host_pinned)

    lazy_ring = False                           # (small buffers, sized by the out-neighbours)

    def _make_ring(self, depth, view):
        groups = max(1, len(view.out_neighbors))    # at most one coded message per group and send
        ring = [[np.empty(self.coded_bytes, dtype=np.uint8), []] for _ in range(depth * groups)]
        self._slot_of = {id(slot[0]): slot for slot in ring}
        return ring

    # ---- receive side ----
    def _add_sender(self, j):
        for s in range(self.slots):
            self.bufs[(j, s)] = np.empty(self.coded_bytes, dtype=np.uint8)
            self._post(("u", j, s))
        self.keybufs[j] = np.empty(C.key_bytes(self.numel), dtype=np.uint8)
        self._post(("k", j, 0))

    def _post(self, meta, index=None):
        kind, j, s = meta
        if kind == "g":
            return super()._post(meta, index)
        buf = self.bufs[(j, s)] if kind == "u" else self.keybufs[j]
        req = MPI.REQUEST_NULL
        if not self.failed:
            try:
                req = self.comm.Irecv(buf, source=self.peers[j], tag=TAG_CODED if kind == "u" else TAG_KEY)
            except MPI.Exception as err:
                self._failure(err)
        if index is None:
            self.reqs.append(req)
            self.meta.append(meta)
            self._slot_views.append((C.payload(buf), C.header(buf)))
        else:
            self.reqs[index] = req
        return req

    def poll(self, core=None):
        """Deliver what arrived: grants at once, updates in each stream's order (see the module doc)."""
        done = self._arrived()
        if not done:
            return 0
        meta, views = self.meta, self._slot_views
        for idx in done:
            kind, j, _ = meta[idx]
            if kind == "g":
                if core is not None:
                    core.on_grant(j, int(self.grant_bufs[j][0]))
                self._post(meta[idx], idx)
                continue
            if core is None:                        # draining at shutdown: nobody needs it any more
                if kind == "u":
                    self._post(meta[idx], idx)
                continue
            code, hdr = views[idx]
            _, grant, seq, mkind = hdr.tolist()
            if grant != NO_GRANT:
                core.on_grant(j, grant)
            self._seq[idx] = seq
            for h in self.rx.arrive(j, seq, mkind, code, idx):
                core.on_update(j, int(views[h][1][C.ITERATION]), h)
        return len(done)

    def payload(self, handle):
        """The sender's parameters as of this update: its reconstruction with the update folded in."""
        return self.rx.value(self.meta[handle][1], self._seq[handle])

    def release(self, handles):
        meta, gone = self.meta, self.gone
        for idx in handles:
            kind, j, _ = meta[idx]
            self.rx.done(j, self._seq.pop(idx))     # a freed update still moves its stream on
            if kind == "u" and (not gone or j not in gone):
                self._post(meta[idx], idx)          # (a key buffer is the reconstruction: never reposted)

    # ---- send side ----
    def send_update(self, iteration, dests, fill, grants=None):
        if self._stage is None:
            self._stage = np.empty(self.numel, dtype=np.float32)
        self._send(iteration, dests, fill(self._stage), grants)

    def send_from(self, iteration, dests, buf, grants=None):
        """Code the parameters in ``buf`` (a trainer's message-sized storage, read only)."""
        self._send(iteration, dests, buf[:self.numel], grants)

    def sends_done(self, buf):
        """Nothing is ever sent from the caller's storage: always done (its pool never grows)."""
        return True

    def wait_sent(self, buf):
        """Nothing is ever sent from the caller's storage: return at once."""

    def _next_buffer(self, nbytes):
        if nbytes != self.coded_bytes:              # a key: its own buffer until its sends complete
            buf = np.empty(nbytes, dtype=np.uint8)
            self._keys_out[id(buf)] = buf
            return buf
        slot = self.ring[self._ring_pos]
        self._ring_pos = (self._ring_pos + 1) % len(self.ring)
        if slot[1]:                                 # normally long done
            self._complete(slot[1], "an update sent to its out-neighbours was not received")
            if self.failed:
                self._bury(slot[1])
            slot[1] = []
        return slot[0]

    def _send(self, iteration, dests, x, grants):
        self._forget_sent_keys()
        pieces = self.tx.encode(x, dests, self._next_buffer)
        carried_to = set()
        want = dict(grants or ())
        for ds, buf, nbytes in pieces:
            carried, _ = split_grants(ds, grants, self.grantees)
            if carried != NO_GRANT:
                carried_to.update(d for d in ds if want.get(d) == carried)
            hdr = C.header(buf)
            hdr[C.ITERATION], hdr[C.GRANT] = iteration, carried
            key = hdr[C.KIND] == C.KEY
            reqs = [self._isend(buf, d, TAG_KEY if key else TAG_CODED) for d in ds]
            if key:
                self._sent_from[id(buf)] = reqs
                self.key_messages += len(ds)
                self.key_bytes += nbytes * len(ds)
            else:
                self._slot_of[id(buf)][1] = reqs
            self.bytes_sent += nbytes * len(ds)
            self.updates_sent += len(ds)
        if grants:
            self.grants_carried += len(carried_to)
            rest = [(i, c) for i, c in grants if i not in carried_to]
            if rest:
                self.send_grants(rest)

    def _forget_sent_keys(self):
        for k in [k for k, reqs in self._sent_from.items() if k in self._keys_out
                  and self._mpi(lambda r=reqs: MPI.Request.Testall(r), False)]:
            del self._sent_from[k]
            del self._keys_out[k]

    def counters(self):
        out = super().counters()
        out.update(compress=str(self.spec), key_messages=self.key_messages, key_bytes=self.key_bytes,
                   mirrors=self.tx.mirrors)
        return out

    def reconfigure(self, comm, view, held, peers):
        raise RuntimeError("--compress cannot heal: a heal loses messages of the coded streams")
