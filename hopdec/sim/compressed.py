"""Compressed exchanges in the in-process drivers: the property tests' scheduler and the simulator.

The same per-edge streams as over MPI (:mod:`hopdec.transport.streams`): a send becomes one key or coded
message per group of receivers, a received update is a reference into its sender's stream, folded into the
receiver's copy when the core uses or frees it. A message is a small tuple ``(sender, seq, kind, code)``
(``code``: the uint8 payload, or None in the timing-only simulator, where only its size matters).
"""

from hopdec.transport import codec as C
from hopdec.transport.message import NO_GRANT, split_grants
from hopdec.transport.streams import ReceiverStreams, SenderStreams


class CodedEnds:
    """One worker's sending and receiving streams (``dry``: sizes only). ``scale``: each message is
    charged ``scale`` times its size (the simulator's ``--math`` with ``--message-mb``: the real model is
    coded, a model of the given message size is charged)."""

    def __init__(self, spec, numel, dry=False, scale=1.0):
        self.scale = float(scale)
        self.codec = C.make_codec(spec, numel)
        self.tx = SenderStreams(self.codec, numel, dry=dry)
        self.rx = None if dry else ReceiverStreams(self.codec, numel)
        self.bytes_sent = 0

    def encode(self, rank, x, dests):
        """``[(dests, message, nbytes)]`` for one Send of parameters ``x`` to ``dests``."""
        out = []
        for ds, buf, nbytes in self.tx.encode(x, dests):
            code = None if buf is None else C.payload(buf)
            h = None if buf is None else C.header(buf)
            seq, kind = (None, None) if h is None else (int(h[C.SEQ]), int(h[C.KIND]))
            if self.scale != 1.0:
                nbytes = nbytes * self.scale
            out.append((ds, (rank, seq, kind, code), nbytes))
            self.bytes_sent += nbytes * len(ds)
        return out


class CodedInProcIO:
    """:class:`hopdec.sim.inproc.InProcIO` with compressed streams (the network delivers each pair's updates
    in order, as MPI does, when it runs with a codec)."""

    def __init__(self, net, rank, carries_grants=False, spec=None, numel=4):
        from hopdec.sim.inproc import InProcIO
        self.plain = InProcIO(net, rank, carries_grants)
        self.net, self.rank, self.carries_grants = net, rank, carries_grants
        self.ends = CodedEnds(spec, numel)

    @property
    def bytes_sent(self):
        return self.ends.bytes_sent

    def send_update(self, iteration, dests, fill, grants=None):
        x = fill(None)
        first = True
        for ds, msg, _ in self.ends.encode(self.rank, x, dests):
            self.plain.send_update(iteration, ds, lambda out, m=msg: m, grants=grants if first else None)
            first = False
        if first and grants:                        # nothing was sent (no dests): the grants still go
            self.plain.send_grants(grants)

    def send_grants(self, grants):
        self.plain.send_grants(grants)

    def deliver_update(self, sender, iteration, data):
        _, seq, kind, code = data
        code = code.copy()                          # this receiver's buffer (spoiled when freed, below)
        h = self.plain.deliver_update(sender, iteration, (sender, seq, code))
        if self.ends.rx.arrive(sender, seq, kind, code, h) != [h]:
            raise AssertionError(f"worker {self.rank}: message {seq} from {sender} arrived out of order")
        return h

    def payload(self, handle):
        sender, seq, _ = self.plain.payload(handle)
        return self.ends.rx.value(sender, seq)

    def release(self, handles):
        for h in handles:
            sender, seq, code = self.plain.payload(h)
            self.ends.rx.done(sender, seq)
            code[:] = 0xFF                          # as MPI reuses a freed buffer: a message not folded
        self.plain.release(handles)                 # by now would corrupt its stream (NaNs), visibly


class CodedSimIO:
    """The simulator's worker end (:class:`hopdec.sim.hop._IO`) with compressed streams: each message is
    charged its real size (a key, or the codec's), in timing-only runs too."""

    carries_grants = True           # as the MPI transport's coded messages (their header has a grant field)

    def __init__(self, sim, rank, spec, numel, grantees=(), scale=1.0):
        self.sim, self.rank = sim, rank
        self.ends = CodedEnds(spec, numel, dry=not sim.math, scale=scale)
        self.grantees = set(grantees)
        self.held = {}
        self._next = 0

    @property
    def bytes_sent(self):
        return self.ends.bytes_sent

    def send_update(self, iteration, dests, fill, grants=None):
        """Each group of destinations that gets the same coded message carries the grant every one of
        them is due (:func:`hopdec.transport.message.split_grants`), as
        :class:`hopdec.transport.coded_mpi.CodedMPITransport` does; the rest go as grant messages."""
        x = fill(None) if self.sim.math else None
        want, carried_to = dict(grants or ()), set()
        for ds, msg, nbytes in self.ends.encode(self.rank, x, dests):
            carried, _ = split_grants(ds, grants, self.grantees)
            if carried != NO_GRANT:
                carried_to.update(d for d in ds if want.get(d) == carried)
            self.sim._send_update(self.rank, iteration, ds, msg, grant=carried, nbytes=nbytes)
        rest = [(i, c) for i, c in grants or () if i not in carried_to]
        if rest:
            self.sim._send_grants(self.rank, rest)

    def send_grants(self, grants):
        self.sim._send_grants(self.rank, grants)

    def hold(self, data):
        if self.ends.rx is None:
            return 0
        sender, seq, kind, code = data
        self._next += 1
        self.held[self._next] = (sender, seq)
        if self.ends.rx.arrive(sender, seq, kind, code, self._next) != [self._next]:
            raise AssertionError(f"worker {self.rank}: message {seq} from {sender} arrived out of order")
        return self._next

    def payload(self, handle):
        if self.ends.rx is None:
            return None
        return self.ends.rx.value(*self.held[handle])

    def release(self, handles):
        if self.ends.rx is None:
            return
        for h in handles:
            self.ends.rx.done(*self.held.pop(h))
