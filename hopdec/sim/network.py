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

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Final, Optional

if TYPE_CHECKING:
    from hopdec.sim.events import EventQueue

Flow = list
"""A transfer: a list of fields, by the indices below."""
Route = tuple[int, tuple[int, ...], float, bool, int, float]
"""(dst, resources, latency, takes no time, pair key, least capacity after the sender's NIC): :meth:`Network._route`."""
Fan = tuple[Any, list[Route], tuple[int, ...], bool, float, float, float]
"""(dsts, routes, resources touched, may be rated alone, the sender NIC's share per transfer, the rate of
every transfer and their latency when they are all alike, else 0.0): :meth:`Network._fan`."""
Solo = list
"""A send rated alone and kept off the NICs' books (:meth:`Network._solo_send`): fields by the _S_ indices."""
Arrival = tuple[float, Callable[[int], Any], int]
"""(latency, deliver, dst) of a message whose last byte has left."""

INF: Final = math.inf


@dataclass(frozen=True)
class LinkModel:
    """The network's parameters: ``bandwidth`` in bytes/s per NIC and direction (``inf``: transfers take
    no time), ``latency`` in seconds; ``node_bandwidth = {node: bytes/s}`` overrides a node's NIC;
    ``links = {(src, dst): (bytes/s or None, latency or None)}`` gives a link its own capacity (shared by
    the transfers on it, on top of the NICs) or latency; ``duplex``: "full" or "half"; ``hosts = {node:
    machine}``: nodes of one machine share its NIC (as fast as the slowest of theirs) for what leaves or
    enters the machine, and exchange through shared memory (the latency only: a link's own capacity
    applies between machines)."""

    bandwidth: float = INF
    latency: float = 0.0
    node_bandwidth: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    duplex: str = "full"
    hosts: dict = field(default_factory=dict)

    def machines(self) -> dict:
        """machine -> its nodes, in order, for the machines of more than one node (a machine of one is that
        node's own NIC)."""
        by: dict = {}
        for v in sorted(self.hosts):
            by.setdefault(self.hosts[v], []).append(v)
        return {m: vs for m, vs in by.items() if len(vs) > 1}

    def shared_nic(self, nodes: Any) -> float:
        """Bytes/s of the NIC that ``nodes`` share (one machine's workers; one node: its own): as fast as
        the slowest NIC they are given. :class:`Network` and :func:`hopdec.topology.traffic.traffic` both
        take a machine's NIC from here."""
        return min(float(self.node_bandwidth.get(v, self.bandwidth)) for v in nodes)

    def describe(self) -> str:
        bw = "infinite bandwidth" if self.bandwidth == INF else f"{self.bandwidth * 8 / 1e9:g} Gb/s"
        parts = [f"NICs {bw} per direction ({self.duplex} duplex, shared equally by concurrent transfers)",
                 f"latency {self.latency:g} s"]
        if self.node_bandwidth:
            parts.append(f"{len(self.node_bandwidth)} node(s) with their own NIC bandwidth")
        if self.links:
            parts.append(f"{len(self.links)} link(s) with their own bandwidth or latency")
        machines = self.machines()
        if machines:
            parts.append(f"{len(machines)} machine(s) of {'/'.join(str(len(v)) for v in machines.values())} "
                         f"workers, each sharing one NIC, shared memory inside")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        return dict(bandwidth_gbps=None if self.bandwidth == INF else self.bandwidth * 8 / 1e9,
                    latency_s=self.latency, duplex=self.duplex,
                    node_bandwidth_gbps={str(k): v * 8 / 1e9 for k, v in sorted(self.node_bandwidth.items())},
                    links={f"{s}->{d}": dict(bandwidth_gbps=None if bw is None else bw * 8 / 1e9, latency_s=lat)
                           for (s, d), (bw, lat) in sorted(self.links.items())},
                    machines={str(m): vs for m, vs in self.machines().items()})


# A transfer is a small list (faster than an object here): its fields by index. _END: when its last byte
# leaves (set when rated); _ALONE: the transfers of its send when they were rated alone on their NICs and
# end with one event at _END + latency (see Network._rate), False once taken off the NICs, else None.
# _HUB: the hub resource whose shared clock moves it (see Network's hubs), else None. _DELIVER(_DST) delivers
# it; _PAIR: src * nodes + dst, the key of its pair's queue.
_ID: Final = 0
_LEFT: Final = 1
_RATE: Final = 2
_T: Final = 3
_TOKEN: Final = 4
_RES: Final = 5
_DELIVER: Final = 6
_LAT: Final = 7
_PAIR: Final = 8
_END: Final = 9
_ALONE: Final = 10
_HUB: Final = 11
_DST: Final = 12


# A send rated alone (Network._solo_send), by index: the id before its transfers' ids, their size, the send
# NIC's share per transfer, when it started, when its last bytes leave, its routes, deliver, the resources it
# touches (its NIC first), and its transfers once put on the books (Network._materialize), else None.
_S_FID: Final = 0
_S_SIZE: Final = 1
_S_OUT: Final = 2
_S_NOW: Final = 3
_S_END: Final = 4
_S_ROUTES: Final = 5
_S_DELIVER: Final = 6
_S_TOUCHED: Final = 7
_S_FLOWS: Final = 8


class _Hub:
    """A hub NIC in hub mode: all its transfers move at its equal share cap / k, so one clock ``v`` (bytes
    each has received since the mode began, at time ``t``) and one heap of finish tags (v at start + size)
    replace per-transfer rates: a transfer joining or leaving costs O(log k), not O(k)."""

    __slots__ = ("on", "v", "t", "tags", "token")

    def __init__(self) -> None:
        self.on: bool = False
        self.v: float = 0.0
        self.t: float = 0.0
        self.tags: list[tuple[float, int, Flow]] = []
        self.token: int = 0


class Network:
    """Transfers between ``nodes`` (0..nodes-1) on an :class:`~hopdec.sim.events.EventQueue`."""

    def __init__(self, queue: EventQueue, nodes: int, model: Optional[LinkModel] = None, hubs: Any = ()) -> None:
        """``hubs``: nodes whose NIC many transfers share at once (a parameter server): while every
        transfer there is alone on its other NIC, and that NIC is no slower, they all move at the hub's
        equal share, and the hub keeps one clock for them (same times as the general rule, O(log k))."""
        self.q = queue
        self.model: LinkModel = model or LinkModel()
        m = self.model
        if m.duplex not in ("full", "half"):
            raise ValueError(f"duplex must be full or half, got {m.duplex!r}")
        self.nodes = nodes
        caps = [float(m.node_bandwidth.get(i, m.bandwidth)) for i in range(nodes)]
        for c in caps:
            if not c > 0:
                raise ValueError(f"bandwidth must be > 0, got {c}")
        # resources: send side of node i is i; receive side nodes + i (full duplex) or i (half duplex)
        self._down: int = nodes if m.duplex == "full" else 0
        self.cap: list[float] = caps + (caps if m.duplex == "full" else [])
        self._link: dict[tuple[int, int], tuple[Optional[int], float]] = {}  # (src, dst) -> (resource or None, latency)
        for (s, d), (bw, lat) in m.links.items():
            own: Optional[int] = None          # the link's own resource
            if bw is not None:
                if not bw > 0:
                    raise ValueError(f"link {s}->{d}: bandwidth must be > 0, got {bw}")
                own = len(self.cap)
                self.cap.append(float(bw))
            self._link[(s, d)] = (own, m.latency if lat is None else float(lat))
        # machines of several nodes: one NIC resource per direction (one in half duplex) that every transfer
        # leaving or entering the machine also crosses; None: a node that is its own host
        self._host: Optional[list[Optional[tuple[int, int, int]]]] = None
        machines = m.machines()
        if machines:
            self._host = [None] * nodes
            for k, vs in enumerate(machines.values()):
                c = m.shared_nic(vs)
                out = len(self.cap)
                self.cap.append(c)
                inn = out
                if m.duplex == "full":
                    inn = len(self.cap)
                    self.cap.append(c)
                for v in vs:
                    self._host[v] = (k, out, inn)
        self.active: list[dict[int, Flow]] = [dict() for _ in self.cap]  # resource -> {flow id: flow}, in start
                                                                          # order
        self._hub: dict[int, _Hub] = {}
        for node in hubs:
            for r in {node, self._down + node}:
                self._hub[r] = _Hub()
        self._fans: dict[int, Fan] = {}    # src -> its last send's fan (see _fan): a worker sends to the
                                           # same out-neighbours every time
        self._solo: list[Optional[Solo]] = [None] * len(self.cap)  # resource -> the send rated alone there
                                             # and not yet put on the NICs (see _materialize), else None
        self._pairs: dict[int, list[Flow]] = {}  # src * nodes + dst -> its messages: [in transit, waiting...]
        self._dirty: dict[int, bool] = {}
        self._flush_pending: bool = False
        self._ids: int = 0
        self.transfers: int = 0            # data messages sent
        self.bytes: float = 0.0
        self.superseded: int = 0           # completion events made stale by a re-rate
        self.controls: int = 0

    # ---- data messages ----
    def send(self, src: int, dsts: Any, nbytes: float, deliver: Callable[[int], Any]) -> None:
        """Send ``nbytes`` from ``src`` to each of ``dsts``; ``deliver(dst)`` runs when it has arrived."""
        now = self.q.now
        k = len(dsts)
        self.transfers += k
        self.bytes += nbytes * k
        fan = self._fans.get(src)
        if fan is None or (fan[0] is not dsts and fan[0] != dsts):
            fan = self._fans[src] = self._fan(src, dsts)
        _, routes, touched, may_solo, share, rate, lat = fan
        solo, active = self._solo, self.active
        alone = may_solo and nbytes > 0 and not self._flush_pending
        for r in touched:
            other = solo[r]
            if other is not None:
                self._materialize(other)        # (it is on r now: this send is not alone)
                alone = False
            elif alone and active[r]:
                alone = False
        if alone:                               # alone on every NIC and link it uses: rate it now
            if rate:                            # (the usual case: one rate and latency, one arrival)
                size = float(nbytes)
                fid = self._ids
                self._ids = fid + k
                end = now + size / rate
                rec: Solo = [fid, size, share, now, end, routes, deliver, touched, None]
                for r in touched:
                    solo[r] = rec
                self.q.at(end + lat, partial(self._arrive_solo, rec))
                return
            if self._solo_send(src, k, routes, touched, now, float(nbytes), deliver):
                return
        pairs, hubs = self._pairs, self._hub
        free: Optional[list[Arrival]] = None
        started = []
        out = active[src]
        if out and not (hubs and src in hubs and hubs[src].on):    # (a hub's: all on its clock, see _start)
            self._expire(out, now)
        size = float(nbytes)
        fid = self._ids
        for dst, res, lat, no_time, pair, _ in routes:
            if no_time or nbytes <= 0:
                if free is None:
                    free = []
                free.append((lat, deliver, dst))
                continue
            fid += 1
            f: Flow = [fid, size, 0.0, now, 0, res, deliver, lat, pair, 0.0, None, None, dst]
            queue = pairs.get(pair)
            if queue is not None:
                head = queue[0]
                if head[_ALONE] and head[_END] <= now:
                    self._take_off(head)        # its bytes have left; only its arrival is pending
                    queue = None
                elif head[_ALONE]:
                    self._open(head[_ALONE])    # its end must now start this one: a real event
            if queue is not None:               # the pair's previous message is still on its way
                queue.append(f)
                continue
            pairs[pair] = [f]
            if hubs:
                self._ids = fid
                if self._start(f, now):
                    started.append(f)
                continue
            for r in res:                       # _start without hubs, inline
                on = active[r]
                if on and r != src:
                    self._expire(on, now)
                on[fid] = f
            started.append(f)
        self._ids = fid
        if free is not None:
            self._deliver_later(free)
        if not started:
            return
        if not self._flush_pending and self._alone(src, started):
            self._rate(src, started)            # nothing else on these NICs: rate them now
            return
        dirty = self._dirty
        for f in started:
            for r in f[_RES]:
                dirty[r] = True
        if not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)

    def _fan(self, src: int, dsts: Any) -> Fan:
        """What a send from ``src`` to ``dsts`` needs, computed once: ``(dsts, routes, touched, may_solo)``
        -- the route of each destination (:meth:`_route`), every resource the send uses (its NIC first),
        and whether it can be rated alone without entering the NICs' books (no hub, distinct destinations,
        every transfer with a latency and taking time)."""
        routes = [self._route(src, d) for d in dsts]
        touched = [src]
        shared = False                      # a resource besides src that two of its transfers cross (a
        for route in routes:                # machine's NIC): rated by the general rule, which shares it
            shared = shared or any(r in touched for r in route[1][1:])
            touched += [r for r in route[1] if r not in touched]
        may_solo = (not self._hub and len(set(dsts)) == len(dsts) and not shared
                    and all(lat > 0 and not no_time for _, _, lat, no_time, _, _ in routes))
        out = self.cap[src] / len(dsts) if dsts else 0.0
        rates = {restcap if restcap < out else out for _, _, _, _, _, restcap in routes}
        lats = {lat for _, _, lat, _, _, _ in routes}
        rate, lat = (rates.pop(), lats.pop()) if len(rates) == len(lats) == 1 else (0.0, 0.0)
        return dsts, routes, tuple(touched), may_solo, out, rate, lat

    def _solo_send(self, src: int, k: int, routes: list[Route], touched: tuple[int, ...], now: float,
                   size: float, deliver: Callable[[int], Any]) -> bool:
        """A send alone on every resource it uses (the usual case when transfers are short), rated as
        :meth:`_rate` would. When all its transfers arrive at once -- one arrival event -- it stays off the
        NICs' books: nothing else can use them before that event without first putting it on them
        (:meth:`_materialize`, called by whatever touches one of its resources), so the books and events
        are those of the general rule, without the work while nothing else comes near; until then it is
        one small record (:data:`Solo`), not a transfer per destination. Returns False (nothing done) when
        its transfers would arrive at different times."""
        out = self.cap[src] / k
        lat0 = routes[0][2]
        end0: Any = None
        for _, _, lat, _, _, restcap in routes:
            end = now + size / (restcap if restcap < out else out)
            if end0 is None:
                end0 = end
            elif end != end0 or lat != lat0:
                return False
        fid = self._ids
        self._ids = fid + k
        rec: Solo = [fid, size, out, now, end0, routes, deliver, touched, None]
        solo = self._solo
        for r in touched:
            solo[r] = rec
        self.q.at(end0 + lat0, partial(self._arrive_solo, rec))
        return True

    def _materialize(self, rec: Solo) -> None:
        """Put a send rated alone (:meth:`_solo_send`) on its NICs' and pairs' books, as the general rule
        keeps them, before anything else looks at those: its transfers, each rated as :meth:`_rate` would."""
        fid, size, out, now, end, routes, deliver, _, _ = rec
        flows: list[Flow] = []
        for dst, res, lat, _, pair, restcap in routes:
            fid += 1
            flows.append([fid, size, restcap if restcap < out else out, now, 1, res, deliver, lat, pair, end,
                          flows, None, dst])
        rec[_S_FLOWS] = flows
        active, pairs, solo = self.active, self._pairs, self._solo
        for f in flows:
            pairs[f[_PAIR]] = [f]
            fid = f[_ID]
            for r in f[_RES]:
                active[r][fid] = f
                solo[r] = None

    def _start(self, f: Flow, now: float) -> bool:
        """Put a transfer on its NICs: on a hub's clock when it can, else under the general rule (returns
        True: the caller rates it)."""
        active, hubs, solo = self.active, self._hub, self._solo
        res = f[_RES]
        for r in res:
            if solo[r] is not None:
                self._materialize(solo[r])
        for r in res:
            on = active[r]
            if on:
                if hubs and r in hubs and hubs[r].on:
                    continue            # all on its clock: none rated alone, none of another hub (O(1),
                                        # not a look at a PS server's thousand transfers per join)
                self._expire(on, now)
                for g in on.values():   # (with hubs only: without, no transfer has a _HUB)
                    if g[_HUB] is not None and g[_HUB] != r:
                        self._hub_off(g[_HUB])  # r is a hub transfer's own NIC: share it, no more hub
                        break
        if hubs:
            if len(res) == 2:
                a, b = res
                h = a if a in hubs else b if b in hubs else None
                if h is not None:
                    other = b if h == a else a
                    hub = hubs[h]
                    if not active[other] and self.cap[other] >= self.cap[h] and (hub.on or not active[h]):
                        self._hub_join(f, h, other, now)
                        return False
            for r in res:                       # it shares a hub NIC under the general rule
                if r in hubs and hubs[r].on:
                    self._hub_off(r)
        fid = f[_ID]
        for r in res:
            active[r][fid] = f
        return True

    # ---- hubs: one clock for all the transfers of a hub NIC ----
    def _hub_join(self, f: Flow, h: int, other: int, now: float) -> None:
        hub, active = self._hub[h], self.active
        if hub.on:
            hub.v += self.cap[h] / len(active[h]) * (now - hub.t)
        else:
            hub.on, hub.v, hub.tags = True, 0.0, []
        hub.t = now
        f[_HUB] = h
        f[_T] = now
        active[h][f[_ID]] = f
        active[other][f[_ID]] = f
        heapq.heappush(hub.tags, (hub.v + f[_LEFT], f[_ID], f))
        self._hub_next(h, now)

    def _hub_next(self, h: int, now: float) -> None:
        hub = self._hub[h]
        hub.token += 1
        share = self.cap[h] / len(self.active[h])
        left = hub.tags[0][0] - hub.v
        self.q.at(now + (left if left > 0.0 else 0.0) / share, partial(self._hub_done, h, hub.token))

    def _hub_done(self, h: int, token: int) -> None:
        hub = self._hub[h]
        if token != hub.token:
            return
        now, active = self.q.now, self.active
        hub.v += self.cap[h] / len(active[h]) * (now - hub.t)
        hub.t = now
        arrived, nexts = [], []
        share = self.cap[h] / len(active[h])
        # done: bytes left within the tolerance, or so few that their time is below now's float resolution
        # (now + dt == now: rescheduled at the same time forever otherwise)
        while hub.tags and ((left := hub.tags[0][0] - hub.v) <= 1e-9 * max(1.0, hub.tags[0][0])
                            or now + left / share <= now):
            f = heapq.heappop(hub.tags)[2]
            for r in f[_RES]:
                del active[r][f[_ID]]
            f[_HUB] = None
            arrived.append((f[_LAT], f[_DELIVER], f[_DST]))
            queue = self._pairs[f[_PAIR]]
            queue.pop(0)
            if queue:
                nexts.append(queue[0])
            else:
                del self._pairs[f[_PAIR]]
        if hub.tags:
            self._hub_next(h, now)
        else:
            hub.on = False
        for nxt in nexts:                       # the pairs' next messages start now
            nxt[_T] = now
            if self._start(nxt, now):
                for r in nxt[_RES]:
                    self._dirty[r] = True
        if self._dirty and not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)
        if arrived:
            self._deliver_later(arrived, may_call_now=True)

    def _hub_off(self, h: int) -> None:
        """Back to the general rule: each hub transfer gets its bytes left and is rated by the flush."""
        hub = self._hub[h]
        if not hub.on:
            return
        now, active, dirty = self.q.now, self.active, self._dirty
        hub.v += self.cap[h] / len(active[h]) * (now - hub.t)
        for tag, _, f in hub.tags:
            left = tag - hub.v
            f[_LEFT] = left if left > 0.0 else 0.0
            f[_T], f[_RATE], f[_HUB] = now, 0.0, None
            f[_TOKEN] += 1
            for r in f[_RES]:
                dirty[r] = True
        hub.on, hub.tags = False, []
        hub.token += 1
        if not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)

    def _expire(self, on: dict[int, Flow], now: float) -> None:
        """Take transfers rated alone whose last byte has left off a NIC another transfer is joining."""
        if on:
            gone = [g for g in on.values() if g[_ALONE] and g[_END] <= now]
            for g in gone:
                self._take_off(g)

    def _route(self, src: int, dst: int) -> Route:
        """(dst, resources, latency, takes no time, pair key, the least capacity after the sender's NIC) of a
        transfer src -> dst."""
        res: tuple[int, ...] = (src, self._down + dst)
        lat = self.model.latency
        link = self._link.get((src, dst))
        if link is not None:
            r, lat = link
            if r is not None:
                res = res + (r,)
        host = self._host
        if host is not None:
            a, b = host[src], host[dst]
            if a is not None and b is not None and a[0] == b[0]:
                res = ()                    # one machine: shared memory, latency only
            else:                           # the machines' NICs, on top of the nodes'
                res = res + ((a[1],) if a is not None else ()) + ((b[2],) if b is not None else ())
        return (dst, res, lat, all(self.cap[r] == INF for r in res), src * self.nodes + dst,
                min((self.cap[r] for r in res[1:]), default=INF))

    def _alone(self, src: int, started: list[Flow]) -> bool:
        """True when the transfers of one send from ``src`` are the only ones on every NIC (and link) they
        use (the usual case when transfers are short)."""
        active = self.active
        if len(active[src]) != len(started):
            return False
        for f in started:
            for r in f[_RES][1:]:
                if len(active[r]) != 1:
                    return False
        return True

    def _rate(self, src: int, flows: list[Flow]) -> None:
        """Rate the transfers of one send that are alone on their NICs. Until another transfer comes near
        them, nothing changes before they end: those with a latency end with ONE event at their arrival
        (leaving the NICs then, or earlier when a transfer that arrives after their last byte needs the
        NICs, see _take_off); anything that would share with them first opens them (_open: a real end
        event, as every other transfer has)."""
        now, cap = self.q.now, self.cap
        out = cap[src] / len(flows)
        ending: dict[Any, list[tuple[Flow, int]]] = {}
        for f in flows:
            rate = out
            for r in f[_RES][1:]:
                if cap[r] < rate:
                    rate = cap[r]
            f[_RATE] = rate
            f[_TOKEN] += 1
            end = f[_END] = now + f[_LEFT] / rate
            key = (end, f[_LAT])
            got = ending.get(key)
            if got is None:
                ending[key] = [(f, f[_TOKEN])]
            else:
                got.append((f, f[_TOKEN]))
            if f[_LAT] > 0:
                f[_ALONE] = flows
        at = self.q.at
        for (end, lat), fl in ending.items():
            if lat > 0:
                at(end + lat, partial(self._arrive, fl))
            else:
                at(end, partial(self._done, fl))

    def _open(self, flows: list[Flow]) -> None:
        """Transfers rated alone now share a NIC, or a message waits behind one: give each a real end
        event at its _END (those already past it just leave the NICs)."""
        now = self.q.now
        for f in flows:
            if f[_ALONE] is not flows:
                continue
            if f[_END] <= now:
                self._take_off(f)
                continue
            f[_ALONE] = None
            f[_TOKEN] += 1
            self.q.at(f[_END], partial(self._done, [(f, f[_TOKEN])]))

    def _take_off(self, f: Flow) -> None:
        """A transfer rated alone whose last byte has left: off its NICs and its pair now; its arrival event
        (at _END + latency) still delivers it."""
        active = self.active
        for r in f[_RES]:
            on = active[r]
            del on[f[_ID]]
            if on:
                self._dirty[r] = True
        del self._pairs[f[_PAIR]]          # nothing waits behind it: queueing would have opened it
        f[_ALONE] = False
        if self._dirty and not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)

    def _arrive_solo(self, rec: Solo) -> None:
        """The arrival event of a send rated alone by :meth:`_solo_send` (its transfers' token is 1)."""
        solo = self._solo
        touched = rec[_S_TOUCHED]
        if solo[touched[0]] is not rec:
            self._arrive([(f, 1) for f in rec[_S_FLOWS]])  # put on the books since: as any transfer rated alone
            return
        for r in touched:                           # never on the books: all arrive now
            solo[r] = None
        deliver = rec[_S_DELIVER]
        for route in rec[_S_ROUTES]:
            deliver(route[0])

    def _arrive(self, flows: list[tuple[Flow, int]]) -> None:
        """The one event of transfers rated alone: their arrival (and their leaving the NICs, if nothing
        has taken them off yet)."""
        calls = []
        for f, token in flows:
            if token != f[_TOKEN]:
                continue                    # opened or re-rated since: its own end event delivers it
            if f[_ALONE]:
                active = self.active
                for r in f[_RES]:
                    del active[r][f[_ID]]
                del self._pairs[f[_PAIR]]
                f[_ALONE] = None
            calls.append(f)
        for f in calls:
            f[_DELIVER](f[_DST])

    def _flush(self) -> None:
        """Re-rate every transfer on a NIC (or link) where a transfer started or ended this instant; the
        transfers that will end at the same time end in one event."""
        self._flush_pending = False
        now, cap, active = self.q.now, self.cap, self.active
        for r in list(self._dirty):                 # transfers rated alone are alone no more
            hub = self._hub.get(r)
            if hub is not None and hub.on:
                del self._dirty[r]                  # its clock moves them
                continue
            for g in list(active[r].values()):
                if g[_ALONE]:
                    if g[_END] <= now:
                        self._take_off(g)
                    else:
                        self._open(g[_ALONE])
        self._flush_pending = False
        seen = set()
        ending: dict[Any, list[tuple[Flow, int]]] = {}
        for r in self._dirty:
            for fid, f in active[r].items():
                if fid in seen or f[_HUB] is not None:
                    continue
                seen.add(fid)
                res = f[_RES]
                if len(res) == 2:
                    a, b = res
                    rate = cap[a] / len(active[a])
                    rb = cap[b] / len(active[b])
                    if rb < rate:
                        rate = rb
                else:
                    rate = min(cap[x] / len(active[x]) for x in res)
                old = f[_RATE]
                if rate == old:
                    continue
                if old:
                    left = f[_LEFT] - old * (now - f[_T])
                    f[_LEFT] = left if left > 0.0 else 0.0
                    self.superseded += 1
                f[_T] = now
                f[_RATE] = rate
                f[_TOKEN] += 1
                t = f[_END] = now + f[_LEFT] / rate
                got = ending.get(t)
                if got is None:
                    ending[t] = [(f, f[_TOKEN])]
                else:
                    got.append((f, f[_TOKEN]))
        self._dirty = {}
        at, done = self.q.at, self._done
        for t, flows in ending.items():
            at(t, partial(done, flows))

    def _done(self, flows: list[tuple[Flow, int]]) -> None:
        active, dirty, pairs = self.active, self._dirty, self._pairs
        arrived = []
        left = []
        for f, token in flows:
            if token != f[_TOKEN]:
                continue                    # re-rated since: a later event finishes it
            fid = f[_ID]
            for r in f[_RES]:
                del active[r][fid]
            left.append(f[_RES])
            arrived.append((f[_LAT], f[_DELIVER], f[_DST]))
            queue = pairs[f[_PAIR]]
            queue.pop(0)
            if queue:                       # the pair's next message starts now
                nxt = queue[0]
                nxt[_T] = self.q.now
                if self._start(nxt, self.q.now):
                    for r in nxt[_RES]:
                        dirty[r] = True
            else:
                del pairs[f[_PAIR]]
        for res in left:
            for r in res:
                if active[r]:               # the transfers left there may now go faster
                    dirty[r] = True
        if dirty and not self._flush_pending:
            self._flush_pending = True
            self.q.at_instant_end(self._flush)
        if arrived:
            self._deliver_later(arrived, may_call_now=True)

    def _deliver_later(self, arrived: list[Arrival], may_call_now: bool = False) -> None:
        """``arrived = [(latency, deliver, dst)]``: ``deliver(dst)`` after the latency, one event per distinct
        latency; with ``may_call_now`` (inside an event, never inside a send) the ones of latency 0 are
        delivered at once, in order."""
        lat = arrived[0][0]
        for x in arrived:
            if x[0] != lat:
                break
        else:                               # one latency (the usual case)
            if lat == 0 and may_call_now:
                for _, d, dst in arrived:
                    d(dst)
            else:
                self.q.at(self.q.now + lat, partial(_call_all, arrived))
            return
        by: dict[float, list[Arrival]] = {}
        for x in arrived:
            by.setdefault(x[0], []).append(x)
        for lat, calls in by.items():
            if lat == 0 and may_call_now:
                for _, d, dst in calls:
                    d(dst)
            else:
                self.q.at(self.q.now + lat, partial(_call_all, calls))

    # ---- control messages ----
    def control(self, src: int, dsts: Any, deliver: Callable[[int], Any]) -> None:
        """A few bytes from ``src`` to each of ``dsts``: ``deliver(dst)`` after the latency (one event for
        all destinations with the same latency)."""
        self.controls += len(dsts)
        q, link = self.q, self._link
        if not link:
            q.at(q.now + self.model.latency, partial(_each, deliver, tuple(dsts)))
            return
        by_lat: dict[float, list[int]] = {}
        for d in dsts:
            lat = link[(src, d)][1] if (src, d) in link else self.model.latency
            by_lat.setdefault(lat, []).append(d)
        for lat, ds in by_lat.items():
            q.at(q.now + lat, partial(_each, deliver, tuple(ds)))


def _each(deliver: Callable[[int], Any], dsts: Any) -> None:
    for d in dsts:
        deliver(d)


def _call_all(calls: list[Arrival]) -> None:
    for _, deliver, dst in calls:
        deliver(dst)
