"""The parameter-server cores in virtual time, in one process: one server core and n worker cores.

The same cores (:mod:`hopdec.ps.server`, :mod:`hopdec.ps.worker`) and loops
(:mod:`hopdec.runtime.ps_loop`) as under MPI; this driver only carries messages through an
:class:`~hopdec.sim.events.EventQueue` and charges each mini-batch ``step_time(worker, i)`` virtual
seconds. Messages take ``latency`` seconds. No tensors: it runs the protocols, not the optimisation.
"""

from hopdec.core import ComputeGradient, Wait
from hopdec.ps.server import Server
from hopdec.ps.worker import PSWorker
from hopdec.runtime.ps_loop import server_loop, worker_loop
from hopdec.sim.events import EventQueue


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

    def compute(self, iteration):
        return {"loss": None, "compute_s": self.sim.step_time(self.w, iteration)}

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

    def pushed(self, w):
        return None

    def send_weights(self, w, version, gap, staleness, model, now):
        t = now
        self.sim.to_worker(w, lambda core: core.on_weights(version, gap, staleness, sent_at=t))

    def answer(self, w, ready):
        self.sim.to_worker(w, lambda core: core.on_answer(ready))

    def stop(self, w, staleness):
        self.sim.to_worker(w, lambda core: core.on_stop(staleness))


class _WorkerIO:
    def __init__(self, sim, w):
        self.sim, self.w = sim, w

    def weights(self):
        return None

    def push_gradient(self, step, iteration, grad):
        self.sim.to_server(lambda core, t: core.on_push(self.w, step, t))

    def push_delta(self, rnd, local_steps, iteration, delta):
        self.sim.to_server(lambda core, t: core.on_push(self.w, rnd, t, local_steps=local_steps))

    def query(self, rnd, k, c, iteration):
        self.sim.to_server(lambda core, t: core.on_query(self.w, k, c, t))


class PSSim:
    """Run ``policy``'s server and one worker core per ``policy.workers`` in virtual time.

    ``step_time(worker, i)``: seconds of the worker's i-th mini-batch (ESync: local step). ``budget``:
    the server's work budget (default: unlimited, stop with ``run(until=...)``). ``check(sim)`` runs after
    every event. ``events`` collects the server's log events ``(name, data)``; ``records[w]`` each
    worker's per-mini-batch records (the same fields as a real run's logs, times virtual).
    """

    def __init__(self, policy, step_time, budget=None, latency=0.0, check=None):
        self.policy = policy
        self.step_time = step_time
        self.latency = float(latency)
        self.check = check
        self.q = EventQueue()
        self.server = Server(policy, budget or 2 ** 62)
        self.events = []
        self.cores = {w: PSWorker(w, esync=policy.sync == "esync") for w in policy.workers}
        self.records = {w: [] for w in policy.workers}
        clock = lambda: self.q.now  # noqa: E731
        self._server = server_loop(self.server, _ServerIO(self), _NullModel(), clock=clock,
                                   on_event=lambda name, **d: self.events.append((name, d)))
        self._loops = {w: worker_loop(c, _WorkerIO(self, w), _NullBackend(self, w), step=True, clock=clock,
                                      on_record=self.records[w].append) for w, c in self.cores.items()}
        self.blocked = dict.fromkeys(policy.workers, False)
        self.done = dict.fromkeys(policy.workers, False)

    # ---- message delivery ----
    def to_worker(self, w, feed):
        def deliver():
            feed(self.cores[w])
            if self.blocked[w]:
                self.blocked[w] = False
                self._advance(w)
        self.q.after(self.latency, deliver)

    def to_server(self, feed):
        def deliver():
            feed(self.server, self.q.now)
            self._drain_server()
        self.q.after(self.latency, deliver)

    # ---- running the loops ----
    def _drain_server(self):
        got = next(self._server, None)
        if got is not None and not isinstance(got, Wait):  # pragma: no cover - loops yield only Waits here
            raise RuntimeError(f"server loop yielded {got!r}")

    def _advance(self, w):
        """Run worker ``w``'s loop until it waits for the server or computes (which takes virtual time)."""
        loop = self._loops[w]
        while True:
            try:
                got = next(loop)
            except StopIteration:
                self.done[w] = True
                return
            if isinstance(got, Wait):
                self.blocked[w] = True
                return
            if isinstance(got, ComputeGradient):
                self.q.after(self.step_time(w, got.iteration), lambda: self._advance(w))
                return

    def running(self, w):
        """True while worker ``w`` computes (neither waiting for the server nor done)."""
        return not self.blocked[w] and not self.done[w]

    def run(self, until=None):
        """Start (once) and run events up to virtual time ``until`` (to the end when None)."""
        if not self.q.events and not len(self.q):
            self.server.start(0.0)
            for w in self.cores:
                self._advance(w)
            self._drain_server()
        self.q.run(until, on_event=(lambda: self.check(self)) if self.check else None)
        return self

    # ---- what tests and reports read ----
    def logged(self, name):
        return [d for n, d in self.events if n == name]

    def notes(self, what):
        return [d for d in self.logged("note") if d["what"] == what]
