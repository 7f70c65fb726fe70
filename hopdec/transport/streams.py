"""Per-edge compressed streams with error feedback (Choco-SGD's public copies, for Hop's edges).

Every directed edge i -> j carries a *stream*: the receiver j keeps a reconstruction x_hat of i's
parameters, the sender keeps the same copy (its *mirror*), and each message is ``q = C(x_i - x_hat)`` (a
codec, :mod:`hopdec.transport.codec`), which both ends then add to their copy in the same order. What C
left out stays in ``x_i - x_hat`` and goes with the next message: error feedback without a separate residual.
The first message of a stream is a *key*, the full float32 parameters, so the copies start exact.

Why per edge and not Choco's one public copy per sender: a shared copy needs every out-neighbour to apply
every q in order, and Hop does not send every update to every out-neighbour -- a time-varying schedule
sends to one peer per step, the late-update rule (Hop sec. 6.2) leaves out receivers known to be past an
iteration, a jump skips iterations. A per-edge stream only needs *its own* messages in order (MPI keeps
order per source and tag; :class:`ReceiverStreams` also restores it), so any of those may skip any send:
the next message to that receiver simply carries the larger difference. Out-neighbours that have been
sent exactly the same messages share one mirror (:class:`SenderStreams` groups them; a static graph without
skipped sends keeps one group, i.e. Choco's single copy and one encoding per iteration).

Receivers fold every message into their copy whether or not the protocol later uses that update in a
Reduce (a late or superseded one still moves the stream on), lazily: a message is folded when the core
uses or frees it, so the copy a Reduce(k) reads is exactly the sender's state of iteration k even if
newer messages already arrived (Hop's iteration semantics, as with uncompressed updates).
"""

import numpy as np

from hopdec.transport import codec as C


class _Group:
    """Out-neighbours that have received exactly the same messages: one mirror, one sequence number."""

    __slots__ = ("members", "mirror", "seq")

    def __init__(self, members, mirror, seq):
        self.members, self.mirror, self.seq = set(members), mirror, seq


class SenderStreams:
    """The sending end of one worker's streams. ``dry``: sizes only, no arrays (the timing-only simulator)."""

    def __init__(self, codec, numel, dry=False):
        self.codec = codec
        self.numel = int(numel)
        self.dry = dry
        self.group_of = {}
        self._delta = None if dry else np.empty(self.numel, dtype=np.float32)
        self.keys_sent = 0                  # key messages (one per out-neighbour per stream)
        self.coded_sent = 0                 # coded messages (one per group and send)

    def encode(self, x, dests, new_buffer=None):
        """The messages of one Send to ``dests``: ``[(dests_of_message, buffer or None, nbytes)]``.

        ``x``: the parameters (float32 or float64 array; None when ``dry``); ``new_buffer(nbytes)``: a uint8
        array to write one message into (default: a new one). The header's SEQ and KIND are written here,
        ITERATION and GRANT by the transport. New out-neighbours get a key; the others a coded difference,
        one per group of out-neighbours with the same mirror (a group only some of whose members are sent
        to splits, copy-on-write)."""
        new_buffer = new_buffer or (lambda nbytes: np.empty(nbytes, dtype=np.uint8))
        out = []
        fresh = [d for d in dests if d not in self.group_of]
        if fresh:
            nbytes = C.key_bytes(self.numel)
            buf = None
            if not self.dry:
                buf = new_buffer(nbytes)
                h = C.header(buf)
                h[C.SEQ], h[C.KIND] = 0, C.KEY
                C.payload(buf).view(np.float32)[:] = x
            g = _Group(fresh, None if self.dry else np.array(x, dtype=np.float32), 1)
            for d in fresh:
                self.group_of[d] = g
            self.keys_sent += len(fresh)
            out.append((tuple(fresh), buf, nbytes))
        parts = {}
        keyed = set(fresh)
        for d in dests:
            if d not in keyed:
                g = self.group_of[d]
                parts.setdefault(id(g), (g, []))[1].append(d)
        nbytes = self.codec.message_bytes()
        for g, ds in parts.values():
            if len(ds) < len(g.members):
                g = self._split(g, ds)
            buf = None
            if not self.dry:
                buf = new_buffer(nbytes)
                h = C.header(buf)
                h[C.SEQ], h[C.KIND] = g.seq, self.codec.kind
                code = C.payload(buf)
                np.subtract(x, g.mirror, out=self._delta, casting="same_kind")
                self.codec.encode(self._delta, code)
                self.codec.decode_add(code, g.mirror)      # the copy every member now holds
            g.seq += 1
            self.coded_sent += 1
            out.append((tuple(ds), buf, nbytes))
        return out

    def _split(self, g, ds):
        """Members ``ds`` of group ``g`` get a message the others do not: they become a group of their own."""
        new = _Group(ds, None if self.dry else g.mirror.copy(), g.seq)
        g.members.difference_update(ds)
        for d in ds:
            self.group_of[d] = new
        return new

    @property
    def mirrors(self):
        """Distinct mirrors held (memory: this many float32 copies of the parameters)."""
        return len({id(g) for g in self.group_of.values()})

    def mirror_of(self, dest):
        return self.group_of[dest].mirror


class StreamOrderError(RuntimeError):
    """A stream's messages were used out of order (a bug: the copies would silently diverge)."""


class ReceiverStreams:
    """The receiving end: one reconstruction per sender, messages delivered and folded in stream order.

    ``adopt_keys``: a key message's buffer becomes the reconstruction itself (the MPI transport gives each
    sender a dedicated key buffer); otherwise the key is copied (in-process drivers share message arrays).
    """

    def __init__(self, codec, numel, adopt_keys=False):
        self.codec = codec
        self.numel = int(numel)
        self.adopt = adopt_keys
        self.copy = {}                      # sender -> reconstruction (float32 numel)
        self._expect = {}                   # sender -> next sequence number to deliver
        self._early = {}                    # sender -> {seq: (kind, code, item)} arrived ahead of order
        self._unfolded = {}                 # sender -> {seq: (kind, code)} delivered, not yet folded
        self.folded = {}                    # sender -> last sequence number folded (-1: none)

    def arrive(self, sender, seq, kind, code, item):
        """A message arrived; returns the ``item``s now deliverable to the core, in stream order (an early
        one waits for its predecessors)."""
        seq = int(seq)
        nxt = self._expect.get(sender, 0)
        if seq == nxt and not self._early.get(sender):   # the usual case: in order
            self._unfolded.setdefault(sender, {})[seq] = (kind, code)
            self._expect[sender] = seq + 1
            return [item]
        if seq < nxt:
            raise StreamOrderError(f"message {seq} from {sender} arrived twice (expected {nxt})")
        early = self._early.setdefault(sender, {})
        early[seq] = (kind, code, item)
        out = []
        while nxt in early:
            kind_, code_, item_ = early.pop(nxt)
            self._unfolded.setdefault(sender, {})[nxt] = (kind_, code_)
            out.append(item_)
            nxt += 1
        self._expect[sender] = nxt
        return out

    def _fold_through(self, sender, seq):
        done = self.folded.get(sender, -1)
        pending = self._unfolded.get(sender)
        while done < seq:
            done += 1
            try:
                kind, code = pending.pop(done)
            except (KeyError, AttributeError):
                raise StreamOrderError(f"message {done} from {sender} is needed before {seq} but was "
                                       f"never delivered") from None
            if kind == C.KEY:
                keyed = code.view(np.float32)
                self.copy[sender] = keyed if self.adopt else keyed.copy()
            else:
                self.codec.decode_add(code, self.copy[sender])
        self.folded[sender] = done

    def value(self, sender, seq):
        """The parameters message ``seq`` of ``sender`` stands for (its reconstruction after folding it)."""
        seq = int(seq)
        if seq < self.folded.get(sender, -1):
            raise StreamOrderError(f"update {seq} from {sender} was used after a newer one ({self.folded[sender]})")
        self._fold_through(sender, seq)
        return self.copy[sender]

    def done(self, sender, seq):
        """The core freed message ``seq``: fold it (and what precedes it) so its buffer may be reused."""
        seq = int(seq)
        if seq > self.folded.get(sender, -1):
            self._fold_through(sender, seq)
