"""How Hop workers bound their iteration gap: one :class:`Protocol` per ``--protocol``, registered here.

======================= ====================================================== ==================
``--protocol``           gap control                                            Hop
======================= ====================================================== ==================
tokens                   token queues of ``max_ig`` tokens (Theorem 2)          sec. 4.2
queue-only               update queues only (Theorem 1's path bound)            sec. 4.1
notify-ack               one outstanding update per sender, ACKed after Reduce  sec. 3.3
======================= ====================================================== ==================

A protocol declares its ``--protocol`` words (:attr:`Protocol.usage`), whether it has token queues (the
mechanisms that need them -- backup workers, staleness, skipping, healing -- are refused without,
:func:`hopdec.hop.config.check_config`), the Table 1 row it forces (notify-ack) and how a worker's gap
control is built (:meth:`Protocol.ledgers`: the token ledger, the ACK ledger, the update-queue slots). A
new protocol that bounds the gap with these ledgers is one module with a :class:`Protocol` plus one
:func:`register` line; one with new gap-control events also adds them to the worker core.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Protocol:
    """One way of bounding the gap. ``control``: ``tokens``, ``acks`` or ``queues`` (what
    :meth:`ledgers` builds); ``row``: the Table 1 row it forces (None: the mechanisms decide)."""

    name: str
    usage: str
    control: str
    row: str = None

    @property
    def token_queues(self):
        return self.control == "tokens"

    @property
    def path_bounded(self):
        """Whether the update queues are sized by Theorem 1's path bound (``NodeView.ahead_bound``, which
        :func:`hopdec.hop.worker.node_views` then computes: all-pairs searches, 14 s on a 10,000-node
        exponential graph)."""
        return self.control == "queues"

    def ledgers(self, view, cfg):
        """``(token ledger, ACK ledger, max_ig, update-queue slots per sender)`` of worker ``view``."""
        from hopdec.hop.token_queue import AckLedger, TokenLedger
        if self.control == "tokens":
            return TokenLedger(view.in_neighbors, view.out_neighbors, cfg.max_ig), None, cfg.max_ig, cfg.max_ig + 1
        if self.control == "acks":
            return None, AckLedger(view.in_neighbors, view.out_neighbors), None, 1   # one outstanding update
        if self.control == "queues":
            return None, None, None, view.ahead_bound + 1
        raise ValueError(f"--protocol {self.name}: unknown gap control {self.control!r}")

    def table1(self, cfg, setting):
        """The Table 1 row and max_ig that bound a run of ``cfg`` whose mechanisms name ``setting``."""
        if self.row is not None:
            return self.row, None
        return setting, (cfg.max_ig if self.token_queues else None)


PROTOCOLS = {}
"""``--protocol`` name -> :class:`Protocol`, in registration order (``--protocol``'s choices)."""


def register(protocol):
    """Make ``protocol`` a ``--protocol`` choice."""
    if PROTOCOLS.get(protocol.name, protocol) != protocol:
        raise ValueError(f"--protocol {protocol.name} is registered already")
    PROTOCOLS[protocol.name] = protocol
    return protocol


register(Protocol("tokens", "token queues (Hop sec. 4.2, with --max-ig)", "tokens"))
register(Protocol("queue-only", "update queues only (sec. 4.1)", "queues"))
register(Protocol("notify-ack", "notify-ack (sec. 3.3)", "acks", row="notify-ack"))


def protocol_usage():
    """``--protocol``'s help: each protocol's words, "a, b, or c"."""
    words = [p.usage for p in PROTOCOLS.values()]
    return ", ".join(words[:-1]) + (", or " if len(words) > 2 else " or ") + words[-1] if len(words) > 1 else words[0]
