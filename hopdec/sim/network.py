"""The simulator's network: messages as transfers that share each node's NIC, in virtual time.

Cost model (the same for the decentralized and the parameter-server mode):

* A **data message** (parameters, a gradient, weights) of ``nbytes`` is a transfer from its sender's
  NIC to its receiver's NIC. Every NIC has a capacity (``--bandwidth``, Gb/s) per direction (full
  duplex: sending and receiving do not compete; ``duplex="half"`` makes them share one capacity).
  Concurrent transfers share a NIC equally: while k transfers leave a node, each gets 1/k of its
  send capacity (two concurrent sends take twice as long as one), and likewise for arrivals. A
  transfer moves at the smallest share among the NICs it crosses (and its link's own capacity, where
  the topology gives the edge a ``bandwidth``); rates are recomputed whenever a transfer starts or
  ends on one of those NICs (once per instant). Capacity a transfer cannot use because it is limited
  elsewhere is not handed to the others (a simple bottleneck share, not max-min fairness: it errs
  on the slow side when transfers on one NIC are limited at different places). The message arrives
  ``latency`` seconds after its last byte left.
* A **control message** (token grants, ESync queries and answers, STOP) is a few bytes: it takes
  ``latency`` seconds and no bandwidth.

Messages between the same two nodes go one after the other (one connection per pair, as TCP or an MPI
channel): a message waits until the pair's previous one has left, so they arrive in the order they were
sent, as MPI guarantees.

>>> from hopdec.sim.events import EventQueue
>>> q = EventQueue(); net = Network(q, 3, LinkModel(bandwidth=1e6))   # 1 MB/s NICs
>>> got = []
>>> net.send(0, (1, 2), 1e6, lambda dst: got.append((dst, q.now)))  # two concurrent sends from node 0
>>> _ = q.run(); got
[(1, 2.0), (2, 2.0)]
"""

import math
from collections import deque
from dataclasses import dataclass, field
from functools import partial

INF = math.inf


@dataclass(frozen=True)
class LinkModel:
    """The network's parameters: ``bandwidth`` in bytes/s per NIC and direction (``inf``: transfers take
    no time), ``latency`` in seconds; ``node_bandwidth = {node: bytes/s}`` overrides a node's NIC;
    ``links = {(src, dst): (bytes/s or None, latency or None)}`` gives a link its own capacity (shared by
    the transfers on it, on top of the NICs) or latency; ``duplex``: "full" or "half"."""

    bandwidth: float = INF
    latency: float = 0.0
    node_bandwidth: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    duplex: str = "full"

    def describe(self):
        bw = "infinite bandwidth" if self.bandwidth == INF else f"{self.bandwidth * 8 / 1e9:g} Gb/s"
        parts = [f"NICs {bw} per direction ({self.duplex} duplex, shared equally by concurrent transfers)",
                 f"latency {self.latency:g} s"]
        if self.node_bandwidth:
            parts.append(f"{len(self.node_bandwidth)} node(s) with their own NIC bandwidth")
        if self.links:
            parts.append(f"{len(self.links)} link(s) with their own bandwidth or latency")
        return ", ".join(parts)

    def as_dict(self):
        return dict(bandwidth_gbps=None if self.bandwidth == INF else self.bandwidth * 8 / 1e9,
                    latency_s=self.latency, duplex=self.duplex,
                    node_bandwidth_gbps={str(k): v * 8 / 1e9 for k, v in sorted(self.node_bandwidth.items())},
                    links={f"{s}->{d}": dict(bandwidth_gbps=None if bw is None else bw * 8 / 1e9, latency_s=lat)
                           for (s, d), (bw, lat) in sorted(self.links.items())})


class _Flow:
    __slots__ = ("id", "remaining", "rate", "t_last", "token", "res", "deliver", "latency", "pair")


class Network:
    """Transfers between ``nodes`` (0..nodes-1) on an :class:`~hopdec.sim.events.EventQueue`."""

    def __init__(self, queue, nodes, model=None):
        self.q = queue
        self.model = model or LinkModel()
        m = self.model
        if m.duplex not in ("full", "half"):
            raise ValueError(f"duplex must be full or half, got {m.duplex!r}")
        self.nodes = nodes
        caps = [float(m.node_bandwidth.get(i, m.bandwidth)) for i in range(nodes)]
        for c in caps:
            if not c > 0:
                raise ValueError(f"bandwidth must be > 0, got {c}")
        # resources: send side of node i is i; receive side nodes + i (full duplex) or i (half duplex)
        self._down = nodes if m.duplex == "full" else 0
        self.cap = caps + (caps if m.duplex == "full" else [])
        self._link = {}                    # (src, dst) -> (resource or None, latency)
        for (s, d), (bw, lat) in m.links.items():
            r = None
            if bw is not None:
                if not bw > 0:
                    raise ValueError(f"link {s}->{d}: bandwidth must be > 0, got {bw}")
                r = len(self.cap)
                self.cap.append(float(bw))
            self._link[(s, d)] = (r, m.latency if lat is None else float(lat))
        self.active = [dict() for _ in self.cap]   # resource -> {flow id: flow}, in start order
        self._routes = {}
        self._pairs = {}                   # (src, dst) -> messages waiting behind the one in transit
        self._dirty = {}
        self._flush_pending = False
        self._ids = 0
        self.transfers = 0                 # data messages sent
        self.bytes = 0.0
        self.superseded = 0                # completion events made stale by a re-rate
        self.controls = 0

    # ---- data messages ----
    def send(self, src, dsts, nbytes, deliver):
        """Send ``nbytes`` from ``src`` to each of ``dsts``; ``deliver(dst)`` runs when it has arrived."""
        q, active, dirty, routes, pairs = self.q, self.active, self._dirty, self._routes, self._pairs
        free = []
        for dst in dsts:
            self.transfers += 1
            self.bytes += nbytes
            route = routes.get((src, dst))
            if route is None:
                route = routes[(src, dst)] = self._route(src, dst)
            res, lat, no_time = route
            if nbytes <= 0 or no_time:
                free.append((lat, partial(deliver, dst)))
                continue
            f = _Flow()
            self._ids += 1
            f.id, f.remaining, f.rate, f.t_last, f.token = self._ids, float(nbytes), 0.0, q.now, 0
            f.res, f.deliver, f.latency, f.pair = res, partial(deliver, dst), lat, (src, dst)
            waiting = pairs.get(f.pair)
            if waiting is not None:             # the pair's previous message is still on its way
                waiting.append(f)
                continue
            pairs[f.pair] = deque()
            for r in res:
                active[r][f.id] = f
                dirty[r] = True
        if free:
            self._deliver_later(free)
        if dirty and not self._flush_pending:
            self._flush_pending = True
            q.at_instant_end(self._flush)

    def _route(self, src, dst):
        """(resources, latency, takes no time) of a transfer src -> dst."""
        res = (src, self._down + dst)
        lat = self.model.latency
        link = self._link.get((src, dst))
        if link is not None:
            r, lat = link
            if r is not None:
                res = res + (r,)
        return res, lat, all(self.cap[r] == INF for r in res)

    def _flush(self):
        """Re-rate every transfer on a NIC (or link) where a transfer started or ended this instant; the
        transfers that will end at the same time end in one event."""
        self._flush_pending = False
        now, cap, active = self.q.now, self.cap, self.active
        seen = set()
        ending = {}
        for r in self._dirty:
            for fid, f in active[r].items():
                if fid in seen:
                    continue
                seen.add(fid)
                res = f.res
                if len(res) == 2:
                    a, b = res
                    ra, rb = cap[a] / len(active[a]), cap[b] / len(active[b])
                    rate = ra if ra < rb else rb
                else:
                    rate = min(cap[x] / len(active[x]) for x in res)
                if rate == f.rate:
                    continue
                if f.rate:
                    f.remaining -= f.rate * (now - f.t_last)
                    if f.remaining < 0.0:
                        f.remaining = 0.0
                    self.superseded += 1
                f.t_last, f.rate = now, rate
                f.token += 1
                t = now + f.remaining / rate
                got = ending.get(t)
                if got is None:
                    ending[t] = [(f, f.token)]
                else:
                    got.append((f, f.token))
        self._dirty = {}
        for t, flows in ending.items():
            self.q.at(t, partial(self._done, flows))

    def _done(self, flows):
        active, dirty = self.active, self._dirty
        arrived = []
        for f, token in flows:
            if token != f.token:
                continue                    # re-rated since: a later event finishes it
            for r in f.res:
                on = active[r]
                del on[f.id]
                if on:                      # the transfers left there may now go faster
                    dirty[r] = True
            arrived.append((f.latency, f.deliver))
            waiting = self._pairs[f.pair]
            if waiting:                     # the pair's next message starts now
                nxt = waiting.popleft()
                nxt.t_last = self.q.now
                for r in nxt.res:
                    active[r][nxt.id] = nxt
                    dirty[r] = True
            else:
                del self._pairs[f.pair]
        if dirty and not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)
        if arrived:
            self._deliver_later(arrived, may_call_now=True)

    def _deliver_later(self, arrived, may_call_now=False):
        """``arrived = [(latency, deliver)]``: one event per distinct latency; with ``may_call_now`` (inside
        an event, never inside a send) the ones of latency 0 are delivered at once, in order."""
        by = {}
        for lat, d in arrived:
            got = by.get(lat)
            if got is None:
                by[lat] = [d]
            else:
                got.append(d)
        for lat, calls in by.items():
            if lat == 0 and may_call_now:
                for c in calls:
                    c()
            else:
                self.q.at(self.q.now + lat, partial(_call_all, calls))

    # ---- control messages ----
    def control(self, src, dsts, deliver):
        """A few bytes from ``src`` to each of ``dsts``: ``deliver(dst)`` after the latency (one event for
        all destinations with the same latency)."""
        self.controls += len(dsts)
        q, link = self.q, self._link
        if not link:
            q.at(q.now + self.model.latency, partial(_each, deliver, tuple(dsts)))
            return
        by_lat = {}
        for d in dsts:
            lat = link[(src, d)][1] if (src, d) in link else self.model.latency
            by_lat.setdefault(lat, []).append(d)
        for lat, ds in by_lat.items():
            q.at(q.now + lat, partial(_each, deliver, tuple(ds)))


def _each(deliver, dsts):
    for d in dsts:
        deliver(d)


def _call_all(calls):
    for c in calls:
        c()
