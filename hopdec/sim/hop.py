"""The decentralized (Hop) workers in virtual time: the real cores and loop, a network and compute costs.

One :class:`~hopdec.hop.worker.Worker` core per node, each run by the same
:func:`hopdec.runtime.hop_loop.worker_loop` as under MPI (``step=True``). This driver only

* advances a worker's loop until it waits (:class:`~hopdec.core.Wait`) or computes (the loop yields
  :class:`~hopdec.core.ComputeGradient` after the backend computed; the worker resumes when the
  virtual compute time has passed);
* carries its messages: parameters as data messages through :class:`hopdec.sim.network.Network`,
  token grants as control messages, each handed to the receiving core on arrival, which wakes the
  receiver if it was waiting.

Sends, Reduce and Apply take no virtual time on the worker (a send only starts a transfer). A message
above the eager limit moves only when its receiver takes it, which a computing receiver does when its
compute ends (and with ``push``, once the sender too is back in MPI); on the zero-copy send path a
Reduce waits until the sends from the store it overwrites completed (``send_path``,
:mod:`hopdec.sim.sends`). No protocol decision is taken here. Deterministic: ties between events at the
same virtual time go in the order they were scheduled, and no draw depends on the order of events.

Two fidelities (the backend): timing only (:class:`TimingBackend`: no tensors) or ``math`` (a backend
with real parameters, e.g. :class:`hopdec.sim.backends.MathBackend`: sends carry a snapshot of the
sender's parameters, Reduce averages real arrays).
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter
from typing import Any, Callable, Iterator, Optional

from hopdec.core import ComputeGradient, Deadlock, Wait
from hopdec.hop.actions import Enter
from hopdec.hop.worker import Worker
from hopdec.ml.stores import StoreOrder
from hopdec.runtime.hop_loop import worker_loop
from hopdec.sim.events import EventQueue, collector_paused
from hopdec.sim.gap import GapMeter
from hopdec.sim.network import Network
from hopdec.sim.sends import SendPath
from hopdec.transport.message import NO_GRANT, split_grants

STEPS = frozenset({ComputeGradient, Enter})
"""The actions a worker's loop yields to this driver besides its waits (``worker_loop(step=...)``):
compute takes virtual time, and entering an iteration moves the iteration gap; nothing else concerns it.
Where no worker can wait between Enter(k) and ComputeGradient(k) -- only notify-ack's Send(k) waits for
ACKs there (Hop sec. 3.3) -- a worker enters k at the instant it starts computing k, and the driver takes
the gap's entry from the compute (:data:`COMPUTE`): one resumption of the loop fewer per worker-iteration."""

COMPUTE = frozenset({ComputeGradient})

Update = tuple[int, int, Any, Optional[int], int]
"""An update on its way, as the driver carries it: ``(src, iteration, data, store, grant)`` (see :meth:`HopSim._take`)."""


class TimingBackend:
    """No tensors: compute only says how long it takes (``duration`` is read by the driver)."""

    __slots__ = ("rank", "compute_time", "duration")

    def __init__(self, rank: int, compute_time: Callable[[int, int], Any]) -> None:
        self.rank, self.compute_time, self.duration = rank, compute_time, 0.0

    def write_params(self, out: Any = None) -> Any:
        return None

    def compute(self, iteration: int) -> dict:
        got = self.compute_time(self.rank, iteration)     # (step_of and compute_record, inline: once per
        if type(got) is not tuple:                        # worker-iteration)
            self.duration = got
            return {"loss": None, "compute_s": got}
        self.duration = seconds = got[0]
        if got[1] is None:
            return {"loss": None, "compute_s": seconds}
        return {"loss": None, "compute_s": seconds, "slowdown": got[1]}

    def reduce(self, pairs: Any) -> None:
        pass

    def apply(self, iteration: int) -> None:
        pass


class SendsPending:
    """What a worker's loop yields when its Reduce must wait for the sends from ``store`` to complete
    (``_IO.wait_sent``); the driver resumes it when the last one has."""

    __slots__ = ("store",)

    def __init__(self, store: int) -> None:
        self.store = store


class _StorePool:
    """Zero-copy sends: the parameters live in one of a pool of stores (indices 0, 1, ...), as
    ``FlatModel``'s with send storage: SendParams sends from the current one, Reduce writes the store the
    worker loop picks (:func:`hopdec.runtime.hop_loop.writable_store`: the oldest spare whose sends all
    completed, else a new one up to :func:`~hopdec.runtime.hop_loop.store_cap`, else the oldest once it
    is free) and makes it current -- in ``FlatModel``'s order (:class:`~hopdec.ml.stores.StoreOrder`).
    ``unsent``: the driver's row of sends not yet completed, per store."""

    order: StoreOrder
    unsent: list[int]

    def send_storage(self) -> int:
        return self.order.cur

    def spare_stores(self) -> list[int]:
        return self.order.spares

    def add_store(self) -> int:
        self.unsent.append(0)
        return self.order.add()

    @property
    def stores(self) -> int:
        return len(self.unsent)


class ZeroCopyTimingBackend(_StorePool, TimingBackend):
    """:class:`TimingBackend` with the store pool of the zero-copy send path."""

    __slots__ = ("order", "unsent")

    def __init__(self, rank: int, compute_time: Callable[[int, int], Any], unsent: list[int]) -> None:
        TimingBackend.__init__(self, rank, compute_time)
        self.order, self.unsent = StoreOrder(), unsent

    def reduce(self, pairs: Any, into: Optional[int] = None) -> None:
        self.order.switch(into)


class ZeroCopyBackend(_StorePool):
    """A math backend (see :mod:`hopdec.sim.backends`) with the store pool of the zero-copy send path."""

    def __init__(self, backend: Any, unsent: list[int]) -> None:
        self.b, self.order, self.unsent = backend, StoreOrder(), unsent

    @property
    def duration(self) -> float:
        return self.b.duration

    def write_params(self, out: Any = None) -> Any:
        return self.b.write_params(out)

    def compute(self, iteration: int) -> dict:
        return self.b.compute(iteration)

    def reduce(self, pairs: Any, into: Optional[int] = None) -> None:
        self.b.reduce(pairs)
        self.order.switch(into)

    def apply(self, iteration: int) -> None:
        self.b.apply(iteration)


class _IO:
    """One worker's end of the simulated network (the transport interface of hop_loop). Like the MPI
    transport it carries token grants in the header of the update they come with (``carries_grants``,
    :func:`hopdec.transport.message.split_grants`): such a grant arrives with the update, not on its own."""

    __slots__ = ("sim", "rank", "held", "_next", "grantees", "bytes_sent", "carries_data")
    carries_grants = True

    def __init__(self, sim: HopSim, rank: int, grantees: Any = ()) -> None:
        self.sim, self.rank = sim, rank
        self.held: Optional[dict[int, Any]] = {} if sim.math else None
        self.carries_data: bool = sim.math      # timing only: updates carry no parameters (worker_loop)
        self._next = 0
        self.grantees = set(grantees)
        self.bytes_sent: float = 0

    def _carry(self, dests: tuple, grants: Any) -> int:
        if not grants:
            return NO_GRANT
        carried, rest = split_grants(dests, grants, self.grantees)
        if rest:
            self.sim._send_grants(self.rank, rest)
        return carried

    def send_update(self, iteration: int, dests: tuple, fill: Any, grants: Any = None) -> None:
        grant = self._carry(dests, grants)
        self.bytes_sent += self.sim.message_bytes * len(dests)
        self.sim._send_update(self.rank, iteration, dests, fill(None) if self.held is not None else None,
                              None, grant)

    def send_from(self, iteration: int, dests: tuple, store: int, grants: Any = None) -> None:
        """A zero-copy send from ``store`` (a snapshot travels with --math: the store stays the sender's)."""
        grant = self._carry(dests, grants)
        data = self.sim.backends[self.rank].write_params(None) if self.held is not None else None
        self.bytes_sent += self.sim.message_bytes * len(dests)
        self.sim._send_update(self.rank, iteration, dests, data, store, grant)

    def sends_done(self, store: int) -> bool:
        """Whether every send from ``store`` completed (as ``MPITransport.sends_done``; while the
        communicator is revoked by a death every send is abandoned: done, as after a recorded failure)."""
        return not self.sim.unsent[self.rank][store] or self.sim.sends_abandoned

    def wait_sent(self, store: int) -> Optional[SendsPending]:
        """None when every send from ``store`` completed, else what the loop waits on."""
        return SendsPending(store) if self.sim.unsent[self.rank][store] else None

    def send_grants(self, grants: Any) -> None:
        self.sim._send_grants(self.rank, grants)

    def hold(self, data: Any) -> int:
        if self.held is None:
            return 0
        self._next += 1
        self.held[self._next] = data
        return self._next

    def payload(self, handle: Any) -> Any:
        return None if self.held is None else self.held[handle]

    def release(self, handles: Any) -> None:
        if self.held is not None:
            for h in handles:
                if self.held.pop(h, None) is None:
                    raise AssertionError(f"worker {self.rank} freed update {h} twice or never held it")


class HopSim:
    """Run one worker core per view in virtual time.

    ``compute_time(rank, iteration)``: virtual seconds of a mini-batch, or (seconds, slowdown factor)
    (:meth:`hopdec.sim.costs.ComputeModel.step`; the factor goes into the log); ``network``: a :class:`~hopdec.sim.network.LinkModel`; ``message_bytes``: size of one
    parameter message; ``backend_factory(rank)``: a math backend (None: timing only) whose ``compute`` sets
    ``.duration``; ``check(sim)``: runs after every event (e.g. ``lambda s: invariants.check(s.cores,
    s.in_flight, s.sent_to)`` with :class:`hopdec.hop.invariants.Invariants`; ``in_flight`` and ``sent_to``
    are kept only when there is a check);
    ``on_record(rank, rec)``: each iteration's log record (``detail``: with the fields only a log file
    reads, ``worker_loop(detail=...)``), or ``records(rank)``: rank's own ``f(rec)``; ``send_path``: a
    :class:`~hopdec.sim.sends.SendPath` (default: zero-copy, TCP's eager limit); ``compress``: a
    ``--compress`` spec for models of ``numel`` parameters (each message then costs its coded size,
    :mod:`hopdec.sim.compressed`; coded messages go from buffers of their own, so nothing waits for a
    send to complete: the copying path, whatever ``send_path`` says).
    """

    def __init__(self, views: Any, cfg: Any, compute_time: Any, network: Any = None, message_bytes: float = 0,
                 backend_factory: Any = None, check: Any = None, on_record: Any = None, send_path: Any = None,
                 compress: Any = None, numel: Any = None, coded_scale: float = 1.0, detail: bool = True,
                 records: Any = None) -> None:
        self.views, self.cfg = views, cfg
        self.n: int = len(views)
        self.q: EventQueue = EventQueue()
        self.net: Any = Network(self.q, self.n, network)  # (Any: a failure model may wrap it, sim.churn)
        self.message_bytes: float = float(message_bytes)
        self.math: bool = backend_factory is not None
        self.cores: list[Worker] = [Worker(v, cfg) for v in views]
        self.send_path = send_path or SendPath()
        coded = compress is not None and str(compress) != "none"
        if coded:                                   # per-edge coded streams: each message its own size
            from hopdec.sim.compressed import CodedSimIO
            self.ios: list[Any] = [CodedSimIO(self, v.rank, compress, numel, v.in_neighbors, coded_scale) for v in views]
        else:
            self.ios = [_IO(self, v.rank, v.in_neighbors) for v in views]
        # zero-copy sends that wait for their receivers (else every send completes at once, and the
        # loop takes the copying path: nothing to track)
        self.rndv: Optional[str] = self.send_path.protocol(self.message_bytes)
        self.waits: bool = self.send_path.waits(self.message_bytes) and not coded
        # sends not yet completed, per worker and store (a pool)
        self.unsent: list[list[int]] = [[0, 0] for _ in views]
        self.backends: list[Any]
        if self.waits:
            self.backends = [ZeroCopyBackend(backend_factory(v.rank), u) if self.math
                             else ZeroCopyTimingBackend(v.rank, compute_time, u) for v, u in zip(views, self.unsent)]
        else:
            self.backends = [backend_factory(v.rank) if self.math else TimingBackend(v.rank, compute_time)
                             for v in views]
        self.parked: list[Optional[int]] = [None] * self.n  # the store a worker's Reduce waits on (SendsPending)
        self.sends_abandoned: bool = False        # a death revoked the communicator (hopdec.sim.churn)
        self.computing: list[bool] = [False] * self.n
        # what a computing worker does when it is back in MPI
        self.untaken: list[list[Any]] = [[] for _ in views]   # callables, or updates (see _take)
        # the loops' clock: the queue's virtual time, read without a Python frame (it is read millions of times)
        clock: Callable[[], float] = partial(attrgetter("now"), self.q)
        self._clock = clock
        self.detail = detail
        # the gap's entries from Enter, or (no worker waits between it and its compute) from the compute
        self.enters: bool = any(c.acks is not None for c in self.cores)
        self.steps: frozenset = STEPS if self.enters else COMPUTE
        self.loops: list[Iterator[Any]] = [worker_loop(c, io, b, clock=clock, step=self.steps, detail=detail,
                                  on_record=(records(c.rank) if records is not None else
                                             None if on_record is None else partial(on_record, c.rank)),
                                  instant=True)
                      for c, io, b in zip(self.cores, self.ios, self.backends)]
        self._resume: list[Callable[[], Any]] = [partial(self._advance if self.rndv is None else self._computed, r)
                                                 for r in range(self.n)]
        self.blocked: list[bool] = [False] * self.n
        self.done: list[bool] = [False] * self.n
        self.finished: int = 0
        self.check: Any = check
        self.in_flight: list[int] = [0] * self.n  # updates on their way to each worker (with a check)
        self.sent_to: list[int] = [0] * self.n    # updates ever sent to each worker (with a check)
        # the largest Iter(i) - Iter(j) seen, evaluated once per instant (like the logs' replay)
        self.gap: GapMeter = GapMeter(self.n, self.q)
        self._entered: Callable[[int, int], None] = self.gap.entered
        self._running: bool = False

    # ---- running ----
    def run(self) -> HopSim:
        """Run to the end; raises :class:`Deadlock` if the events run out before every worker finished."""
        if not self._running:
            self._running = True
            with collector_paused():            # every worker's first steps: objects, no cycles
                for r in range(self.n):
                    self._advance(r)
        self.q.run(on_event=(lambda: self.check(self)) if self.check else None)
        if self.finished < self.n:
            raise Deadlock("no event left but not every worker finished: " + self.describe())
        return self

    def _advance(self, r: int) -> None:
        """Run worker ``r``'s loop until it waits or computes (compute takes virtual time)."""
        loop = self.loops[r]
        for a in loop:
            t = type(a)
            if t is Wait:
                self.blocked[r] = True
                return
            if t is ComputeGradient:
                if not self.enters:
                    self._entered(r, a.iteration)
                self.q.at(self.q.now + self.backends[r].duration, self._resume[r])
                self.computing[r] = True
                return
            if t is Enter:
                self._entered(r, a.iteration)
            elif t is SendsPending:
                self.parked[r] = a.store
                return
        self.done[r] = True
        self.finished += 1

    # ---- rendezvous messages and zero-copy completion (hopdec.sim.sends) ----
    def _computed(self, r: int) -> None:
        """Worker ``r``'s compute ended: it enters MPI again, takes the messages that reached it meanwhile
        (and pushes those acknowledged), then goes on."""
        self.computing[r] = False
        held = self.untaken[r]
        if held:
            self.untaken[r] = []
            self._take(r, held)
        self._advance(r)

    def _when_in_mpi(self, r: int, fn: Callable[[], Any]) -> None:
        """``fn()`` now if worker ``r`` is in MPI (not computing), else when its compute ends."""
        if self.computing[r]:
            self.untaken[r].append(fn)
        else:
            fn()

    def _rts(self, src: int, done: Any, nbytes: float, dst: int) -> None:
        """A ``push`` rendezvous request reached ``dst``: when it is in MPI it acknowledges, and the sender
        pushes the data when it is in MPI (:meth:`_acked`)."""
        self._when_in_mpi(dst, partial(self.net.control, dst, (src,), partial(self._acked, dst, done, nbytes)))

    def _acked(self, dst: int, done: Any, nbytes: float, src: int) -> None:
        self._when_in_mpi(src, partial(self.net.send, src, (dst,), nbytes, done))

    def _arrived(self, m: Update, dst: int) -> None:
        """An update ``m`` reached ``dst`` and was taken now (:meth:`_take`)."""
        self._take(dst, (m,))

    def _take(self, dst: int, held: Any) -> None:
        """Worker ``dst`` takes ``held``, in order: updates ``(src, iteration, data, store, grant)`` that
        reached it -- a send from a store (zero-copy, a rendezvous message) completes, and the last one
        from its store resumes a Reduce parked on it; then the core gets the grant the update's header
        carries and the update -- or callables (what it does when back in MPI, :meth:`_when_in_mpi`). It
        goes on if it was waiting. (One function for every update, three per worker-iteration: what is
        looked up once per receiver is looked up once.)"""
        unsent, parked, check = self.unsent, self.parked, self.check
        core = self.cores[dst]
        on_grant, on_update = core.on_grant, core.on_update
        for m in held:
            if type(m) is not tuple:
                m()
                continue
            src, iteration, data, store, grant = m
            if store is not None:
                u = unsent[src]
                left = u[store] = u[store] - 1
                if not left and parked[src] == store:
                    parked[src] = None
                    self._advance(src)
            if check is not None:
                self.in_flight[dst] -= 1
            if grant != NO_GRANT:               # carried in the update's header: delivered first
                on_grant(src, grant)
            on_update(src, iteration, 0 if data is None else self.ios[dst].hold(data))
        if self.blocked[dst]:
            self.blocked[dst] = False
            self._advance(dst)

    # ---- messages ----
    def _send_update(self, src: int, iteration: int, dests: tuple, data: Any, store: Optional[int] = None,
                     grant: int = NO_GRANT, nbytes: Optional[float] = None) -> None:
        """Send an update of ``nbytes`` (default: the message size) from ``store`` (zero-copy) or from a
        buffer of its own (``store`` None), with a grant carried in its header."""
        if self.check is not None:
            for d in dests:
                self.sent_to[d] += 1
                self.in_flight[d] += 1
        size = self.message_bytes if nbytes is None else nbytes
        rndv = self.rndv if nbytes is None else self.send_path.protocol(size)
        if rndv is None:                        # eager: it travels now and the send is complete
            self.net.send(src, dests, size, partial(self._arrived, (src, iteration, data, None, grant)))
            return
        if store is not None and self.waits:
            self.unsent[src][store] += len(dests)
        else:
            store = None
        m = (src, iteration, data, store, grant)    # (one for all its destinations: it is read only)
        if rndv == "push":                      # the request travels first; see _rts
            self.net.control(src, tuple(dests), partial(self._rts, src, partial(self._arrived, m), size))
        else:                                   # take: see _reached
            self.net.send(src, dests, size, partial(self._reached, m))

    def _reached(self, m: Update, dst: int) -> None:
        """A ``take`` rendezvous message ``m`` reached ``dst``: taken now, or when its compute ends
        (:meth:`_take` then, as :meth:`_when_in_mpi` would call it, without a partial per message)."""
        if self.computing[dst]:
            self.untaken[dst].append(m)
        else:
            self._take(dst, (m,))

    def _send_grants(self, src: int, grants: Any) -> None:
        counts = dict(grants)
        self.net.control(src, tuple(counts), partial(self._deliver_grant, src, counts))

    def _deliver_grant(self, src: int, counts: dict[int, int], dst: int) -> None:
        self.cores[dst].on_grant(src, counts[dst])
        if self.blocked[dst]:
            self.blocked[dst] = False
            self._advance(dst)

    # ---- checks and reports ----
    @property
    def max_gap(self) -> int:
        return self.gap.max_gap

    @property
    def now(self) -> float:
        return self.q.now

    def describe(self) -> str:
        return "; ".join(f"worker {c.rank} at {c.iteration}{' done' if self.done[c.rank] else ''}"
                         f"{' waiting' if self.blocked[c.rank] else ''}" for c in self.cores[:64]) + \
            (f"; ... ({self.n} workers)" if self.n > 64 else "")
