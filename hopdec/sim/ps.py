"""The parameter-server cores in virtual time, in one process: one server core and n worker cores.

The same cores (:mod:`hopdec.ps.server`, :mod:`hopdec.ps.worker`) and loops
(:mod:`hopdec.runtime.ps_loop`) as under MPI; this driver only carries messages and charges each
mini-batch ``step_time(worker, i)`` virtual seconds. Messages go through
:class:`hopdec.sim.network.Network`: weights (server -> worker) and pushed gradients or model
differences (worker -> server) are data messages of ``message_bytes`` that share the server's NIC (what
makes BSP slow at scale), ESync's queries and answers and the STOP are control messages (latency only).
The server node is 0, worker ``w`` is node 1 + its position in ``policy.workers`` (its MPI rank when the
workers are ranks 1..n). Applying an update and answering take no virtual time.

Timing only by default (no tensors: it runs the protocols, not the optimisation). With
``backend_factory`` (each worker's backend, e.g. :class:`hopdec.runtime.backend.WorkerBackend` over a real
trainer) and ``server_model`` (e.g. :class:`hopdec.runtime.backend.ServerModel`) every message carries real
arrays and the server really applies them.
"""

from functools import partial

import numpy as np

from hopdec.core import ComputeGradient, Wait
from hopdec.ps.server import Server
from hopdec.runtime.ps_loop import server_loop, worker_loop
from hopdec.sim.backends import compute_record, step_of
from hopdec.sim.events import EventQueue
from hopdec.sim.network import LinkModel, Network

SERVER_NODE = 0


class _NullModel:
    """The server's model when only the protocol is simulated."""

    def apply_gradients(self, pairs):
        pass

    def add_deltas(self, pairs):
        pass


class _NullBackend:
    """A worker's compute when only the protocol is simulated: ``compute_s`` is the virtual step time."""

    def __init__(self, sim, w):
        self.sim, self.w = sim, w
        self.duration = 0.0

    def compute(self, iteration):
        self.duration, factor = step_of(self.sim.step_time, self.w, iteration)
        return compute_record(self.duration, factor)

    def apply(self, iteration):
        pass

    def load_params(self, buf):
        pass

    def keep_params(self):
        pass

    def gradient(self):
        return None

    def delta(self):
        return None


class _ServerIO:
    def __init__(self, sim):
        self.sim = sim
        self.buffers = {}

    def pushed(self, w):
        return self.buffers.get(w)

    def send_weights(self, w, version, gap, staleness, model, now):
        self.sim.released[w] = self.sim.released.get(w, ())[-1:] + (now,)
        self.sim._sends[w] = self.sim._sends.get(w, 0) + 1
        data = None
        if self.sim.math:
            data = np.empty(self.sim.numel, dtype=np.float32)
            model.write_params(data)
        self.sim.to_worker(w, lambda core: core.on_weights(version, gap, staleness, sent_at=now),
                           weights=True, data=data)

    def answer(self, w, ready):
        self.sim.to_worker(w, lambda core: core.on_answer(ready))

    def stop(self, w, staleness):
        self.sim.to_worker(w, lambda core: core.on_stop(staleness))


class _WorkerIO:
    def __init__(self, sim, w):
        self.sim, self.w = sim, w
        self.received = None

    def weights(self):
        return self.received

    def _copy(self, buf):
        return None if buf is None or not self.sim.math else np.array(buf, dtype=np.float32, copy=True)

    def push_gradient(self, step, iteration, grad):
        self.sim.to_server(self.w, lambda core, t: core.on_push(self.w, step, t), push=True,
                           data=self._copy(grad))

    def push_delta(self, rnd, local_steps, iteration, delta):
        self.sim.to_server(self.w, lambda core, t: core.on_push(self.w, rnd, t, local_steps=local_steps),
                           push=True, data=self._copy(delta))

    def query(self, rnd, k, c, iteration):
        self.sim.to_server(self.w, lambda core, t: core.on_query(self.w, k, c, t))


class PSSim:
    """Run ``policy``'s server and one worker core per ``policy.workers`` in virtual time.

    ``step_time(worker, i)``: seconds of the worker's i-th mini-batch (ESync: local step). ``budget``:
    the server's work budget (default: unlimited, stop with ``run(until=...)``). ``latency``: of every
    message when no ``network`` (a :class:`~hopdec.sim.network.LinkModel`) is given; ``message_bytes``:
    size of a data message. ``check(sim)`` runs after every event. ``events`` collects the server's log
    events ``(name, data)`` (``on_event(name, **data)`` gets them too); ``records[w]`` each worker's
    per-mini-batch records (the same fields as a real run's logs, times virtual; ``on_record(w, rec)``
    gets them too). ``backend_factory(w)`` and ``server_model`` (with ``numel``): the ``--math``
    fidelity (see the module docstring).
    """

    def __init__(self, policy, step_time, budget=None, latency=0.0, check=None, network=None,
                 message_bytes=0, backend_factory=None, server_model=None, numel=None, on_record=None,
                 on_event=None):
        self.policy = policy
        self.step_time = step_time
        self.check = check
        self.q = EventQueue()
        self.node = {w: 1 + i for i, w in enumerate(policy.workers)}
        self.net = Network(self.q, 1 + policy.n, network or LinkModel(latency=float(latency)),
                           hubs=(SERVER_NODE,))
        self.message_bytes = float(message_bytes)
        self.math = backend_factory is not None
        self.numel = numel
        self.server = Server(policy, budget or 2 ** 62)
        self.events = []
        self.cores = {w: policy.worker_core(w) for w in policy.workers}
        self.records = {w: [] for w in policy.workers}
        self._sio = _ServerIO(self)
        self._wio = {w: _WorkerIO(self, w) for w in policy.workers}
        self.backends = {w: backend_factory(w) if self.math else _NullBackend(self, w) for w in policy.workers}

        def log_event(name, **d):
            if name == "note" and d.get("what") == "failure" and d.get("worker") in self._notes:
                d.update(self._notes[d["worker"]])      # when it died, how long finding it took
            self.events.append((name, d))
            if on_event:
                on_event(name, **d)

        def record(w, rec):
            self.records[w].append(rec)
            if on_record:
                on_record(w, rec)

        clock = self._clock
        self._server = server_loop(self.server, self._sio, server_model if self.math else _NullModel(),
                                   clock=clock, on_event=log_event)
        self._loops = {w: worker_loop(c, self._wio[w], self.backends[w], step=True, clock=clock,
                                      on_record=partial(record, w)) for w, c in self.cores.items()}
        self._resume = {w: partial(self._advance, w) for w in policy.workers}
        self.blocked = dict.fromkeys(policy.workers, False)
        self.done = dict.fromkeys(policy.workers, False)
        self.end_time = None
        self.dead = set()                   # workers that died (the server may not know yet)
        self.died, self.spared = [], []
        self.released = {}                  # worker -> the times the server last sent it weights (two)
        self._sends = {}                    # worker -> how many weights the server sent it
        self._notes = {}                    # dead worker -> fields its failure note gets
        self._server_done = False
        self._started = False

    def _clock(self):
        return self.q.now

    # ---- message delivery ----
    def to_worker(self, w, feed, weights=False, data=None):
        """A message from the server to worker ``w``: ``weights`` (``data``: their snapshot, None in timing
        mode) are a data message, anything else a control message."""
        def deliver(_node):
            if w in self.dead:
                return                              # lost with the worker
            if data is not None:
                self._wio[w].received = data
            feed(self.cores[w])
            if self.blocked[w]:
                self.blocked[w] = False
                self._advance(w)
        if weights:
            self.net.send(SERVER_NODE, (self.node[w],), self.message_bytes, deliver)
        else:
            self.net.control(SERVER_NODE, (self.node[w],), deliver)

    def to_server(self, w, feed, push=False, data=None):
        """A message from worker ``w`` to the server: pushes are data messages, queries control ones."""
        def deliver(_node):
            if w in self.dead:
                return                              # the server learnt of the death first: dropped
            if data is not None:
                self._sio.buffers[w] = data
            feed(self.server, self.q.now)
            self._drain_server()
        if push:
            self.net.send(self.node[w], (SERVER_NODE,), self.message_bytes, deliver)
        else:
            self.net.control(self.node[w], (SERVER_NODE,), deliver)

    # ---- running the loops ----
    def _drain_server(self):
        got = next(self._server, None)
        if got is None:
            self._server_done = True
        elif not isinstance(got, Wait):  # pragma: no cover - loops yield only Waits here
            raise RuntimeError(f"server loop yielded {got!r}")

    def fail(self, w, at, detect_s=0.0, note=None):
        """Worker ``w`` dies at virtual time ``at`` (``--fault-tolerance``): it stops where it is and what is
        in flight to or from it is lost (a crashed TCP stream). The server learns of it ``detect_s`` later,
        when ULFM fails its receive from ``w`` (:meth:`hopdec.transport.ps.ServerIO.wait`), and only then
        does its core drop the worker (:meth:`hopdec.ps.server.Server.on_worker_failed`): until then the
        sync policy still counts it, so a barrier (BSP, SSP's bound, ...) waits for it while an ASP
        server goes on. No stall follows: a real PS run neither revokes nor shrinks until its end.
        ``note``: fields added to the server's ``failure`` note (the executor's labels). A worker that
        finished first is spared (``spared``); ``died``: ``[(time, worker, its iteration)]``."""
        def die():
            now = self.q.now
            if self.done[w]:
                self.spared.append((now, w))
                return
            self.dead.add(w)
            self.done[w] = True
            self.died.append((now, w, self.cores[w].iteration))
            self._notes[w] = dict(died_at=now, detect_s=float(detect_s), **(note or {}))
            self.q.at(now + float(detect_s), found)     # the server's end waits for it, as a real one's
            self._maybe_end()

        def found():
            self.server.on_worker_failed(w, self.q.now)
            self._drain_server()
            self._maybe_end()
        self.q.at(at, die)

    def _maybe_end(self):
        """The run ends when every worker is done and the server's loop finished (it waits for every
        death to be found, as a real server's does)."""
        if self.end_time is None and self._server_done and all(self.done.values()):
            self.end_time = self.q.now

    def _advance(self, w):
        """Run worker ``w``'s loop until it waits for the server or computes (which takes virtual time)."""
        if w in self.dead:
            return
        loop = self._loops[w]
        for got in loop:
            if type(got) is Wait:
                self.blocked[w] = True
                return
            if type(got) is ComputeGradient:
                self.q.at(self.q.now + self.backends[w].duration, self._resume[w])
                return
        self.done[w] = True
        self._maybe_end()

    def running(self, w):
        """True while worker ``w`` computes (neither waiting for the server nor done)."""
        return not self.blocked[w] and not self.done[w]

    def run(self, until=None):
        """Start (once) and run events up to virtual time ``until`` (to the end when None)."""
        if not self._started:
            self._started = True
            self.server.start(0.0)
            for w in self.cores:
                self._advance(w)
            self._drain_server()
        self.q.run(until, on_event=(lambda: self.check(self)) if self.check else None)
        return self

    # ---- what tests and reports read ----
    def entered(self, w):
        """``[(time, iteration)]`` of the last two mini-batches the server released SGD worker ``w`` into
        (its n-th weights: iteration n - 1; none for ESync): a dead worker's log closes neither the one it
        computed nor the one whose weights were still on the way."""
        if w not in self.released or self.cores[w].pushes_differences:
            return []
        times = self.released[w]
        n = self._sends[w]
        return [(t, n - len(times) + i) for i, t in enumerate(times)]

    @property
    def now(self):
        return self.q.now

    def logged(self, name):
        return [d for n, d in self.events if n == name]

    def notes(self, what):
        return [d for d in self.logged("note") if d["what"] == what]
