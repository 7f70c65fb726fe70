"""The parameter-server mode's messages over MPI: the wire format and each side's end of it.

One message per push and one per weights send. A data message is a float32 buffer of the P flat values
followed by an int64 header (:mod:`hopdec.transport.message`), so tags stay constant (MPI only promises
tags up to 32767) and step numbers are unbounded. Control messages (ESync queries, READY / NOT-READY,
STOP) are small int64 arrays. No pickling, no per-parameter messages. Every wait -- receives and sends --
polls with the peer timeout (:func:`hopdec.transport.waiting.poll_until`), so a dead or hung peer ends the
job with one line naming it.

:class:`ServerIO` (rank 0) and :class:`WorkerIO` (ranks 1..n) are the transports the PS loops
(:mod:`hopdec.runtime.ps_loop`) carry the cores' actions out with; each hands what arrives to its core.
"""

import time

import numpy as np

from hopdec.errors import RunError
from hopdec.transport.message import header, message_floats
from hopdec.transport.waiting import poll_until, wait_any

TAG_PUSH = 201     # worker -> server: data buffer (gradient or model difference) + header
TAG_QUERY = 202    # worker -> server: ESync state query (int64 header)
TAG_WEIGHTS = 203  # server -> worker: weights + header
TAG_CTRL = 204     # server -> worker: READY / NOT_READY / STOP (int64 header)

NF = 8             # int64 header fields
# worker -> server header: [kind, step, local_steps, c_ns, iteration, signal, 0, 0]
K_PUSH, K_QUERY, K_STOP = 1, 2, 3  # K_STOP (on the query tag): this worker was asked to stop (Ctrl-C)
# server -> worker header: [kind, version, gap, staleness, send_time_ns, cut, keep_from, pin]
R_WEIGHTS, R_STOP, R_READY, R_NOT_READY = 1, 2, 3, 4
STALE_NONE = -2    # staleness on the wire when none is known yet (-1: dropped, as in hopdec.ps.server)


def _data_buffer(numel):
    """float32 buffer: P values then an int64 header of NF fields (the MPI transport's layout)."""
    return np.zeros(message_floats(numel, NF), dtype=np.float32)


def _stale_out(s):
    return STALE_NONE if s is None else int(s)


def _stale_in(v):
    return None if int(v) == STALE_NONE else int(v)


class ServerIO:
    """Rank 0's messages: a posted receive per worker for pushes and one for queries; sends with Isend."""

    def __init__(self, comm, workers, numel, timeout, fault_tolerant=False):
        from mpi4py import MPI
        self.MPI, self.comm, self.P, self.timeout = MPI, comm, numel, timeout
        self.workers = tuple(workers)
        self.fault_tolerant = fault_tolerant
        self.dead = set()                           # workers whose failure MPI reported (ULFM)
        self._graveyard = []                        # their requests: kept referenced, never touched again
        self._new_dead = []                         # found failed, not yet told to the core
        self.on_stop_notice = None                  # (worker, signal number) -> None: a worker's Ctrl-C
        self.on_worker_failed = None                # (worker, workers left) -> None: said when it happens
        self.push_bufs = {w: _data_buffer(numel) for w in self.workers}
        self.query_bufs = {w: np.zeros(NF, dtype=np.int64) for w in self.workers}
        self.send_bufs = {w: _data_buffer(numel) for w in self.workers}
        self.ctrl_bufs = {w: np.zeros(NF, dtype=np.int64) for w in self.workers}
        self.send_reqs = {w: [] for w in self.workers}
        self.reqs, self.meta = [], []               # receives: (kind, worker) per request slot
        for w in self.workers:
            for kind in ("push", "query"):
                self.meta.append((kind, w))
                self.reqs.append(MPI.REQUEST_NULL)
                self._post(len(self.reqs) - 1)

    def _post(self, idx):
        kind, w = self.meta[idx]
        if kind == "push":
            self.reqs[idx] = self.comm.Irecv(self.push_bufs[w], source=w, tag=TAG_PUSH)
        else:
            self.reqs[idx] = self.comm.Irecv(self.query_bufs[w], source=w, tag=TAG_QUERY)

    def _slot(self, kind, w):
        return self.meta.index((kind, w))

    # ---- failures (ULFM, --fault-tolerance) ----
    def _test(self, idx):
        """Test one receive (fault tolerant): True when it completed; a failure buries its worker."""
        w = self.meta[idx][1]
        if w in self.dead:
            return False
        try:
            return self.reqs[idx].Test()            # one request: mpi4py updates its handle in place
        except self.MPI.Exception as err:
            self._failed(w, err)
            return False

    def _failed(self, w, err):
        from hopdec.transport.mpi import FAILURE_CLASSES
        if not self.fault_tolerant or err.Get_error_class() not in FAILURE_CLASSES:
            raise err
        self.dead.add(w)
        self._new_dead.append(w)
        self._graveyard.append([(r, self.meta[i]) for i, r in enumerate(self.reqs) if self.meta[i][1] == w])
        self._graveyard.append(self.send_reqs[w])
        self.send_reqs[w] = []
        for i, m in enumerate(self.meta):
            if m[1] == w:
                self.reqs[i] = self.MPI.REQUEST_NULL

    def _report_failures(self, core):
        while self._new_dead:
            w = self._new_dead.pop(0)
            core.on_worker_failed(w, time.time())
            if self.on_worker_failed:
                self.on_worker_failed(w, len(self.workers) - len(self.dead))

    def _wait_any(self, wait_action):
        what = lambda: (f"rank 0: the server got no message from any worker for {self.timeout:.0f} s (waiting for "
                        f"rank(s) {', '.join(map(str, wait_action.on))}); a peer may have died or hung")
        if not self.fault_tolerant:
            return wait_any(self.reqs, self.timeout, what, on=wait_action.on)

        def done():
            for i in range(len(self.reqs)):
                if self.reqs[i] != self.MPI.REQUEST_NULL and self._test(i):
                    return (i,)
            return (None,) if self._new_dead else None
        return poll_until(done, self.timeout, what, on=wait_action.on)[0]

    def wait(self, core, wait_action, on_message=None):
        """Block until a push or query arrives, or (fault tolerant) a worker is found dead; tell ``core``."""
        idx = self._wait_any(wait_action)
        if idx is None:
            self._report_failures(core)
            return
        kind, w = self.meta[idx]
        now = time.time()
        if kind == "query":
            q = self.query_bufs[w].copy()
            self._post(idx)
            if int(q[0]) == K_STOP:
                if self.on_stop_notice:
                    self.on_stop_notice(w, int(q[5]))
                return
            k, c_ns = int(q[2]), int(q[3])
            core.on_query(w, k, None if c_ns < 0 else c_ns / 1e9, now)
        else:
            self.reqs[idx] = self.MPI.REQUEST_NULL  # reposted when the worker is sent weights again
            hdr = header(self.push_bufs[w], self.P)
            step, local_steps = int(hdr[1]), max(1, int(hdr[2]))
            if on_message:
                on_message(w, local_steps)
            core.on_push(w, step, now, local_steps=local_steps)

    def pushed(self, w):
        return self.push_bufs[w][:self.P]

    def restore_pushed(self, w, data):
        """A resumed server's gradient from ``w`` not applied yet: back into its buffer, whose receive is
        posted again when ``w`` is next sent weights (as after a push)."""
        idx = self._slot("push", w)
        self.reqs[idx].Cancel()
        self.reqs[idx].Wait()
        self.reqs[idx] = self.MPI.REQUEST_NULL
        self.push_bufs[w][:self.P] = data

    def _complete_sends(self, w):
        """Wait for the sends to ``w`` (bounded); True when ``w`` is alive (fault tolerant: a failure
        buries it and the core hears of it at the next :meth:`wait`)."""
        if w in self.dead:
            return False
        reqs = self.send_reqs[w]
        if reqs:
            def done():
                try:
                    return all([r.Test() for r in reqs]) or w in self.dead
                except self.MPI.Exception as err:
                    self._failed(w, err)
                    return True
            poll_until(done, self.timeout,
                       f"rank 0: the server's message to rank {w} was not received for {self.timeout:.0f} s; "
                       f"a peer may have died or hung")
            if w in self.dead:
                return False
            self.send_reqs[w] = []
        return True

    def send_weights(self, w, version, gap, staleness, model, now, cut=0, keep_from=0, pin=0):
        if not self._complete_sends(w):
            return
        idx = self._slot("push", w)
        if self.reqs[idx] == self.MPI.REQUEST_NULL:
            self._post(idx)                         # its buffer is free again: applied or dropped
        buf = self.send_bufs[w]
        model.write_params(buf[:self.P])
        header(buf, self.P)[:] = [R_WEIGHTS, version, gap, _stale_out(staleness), int(now * 1e9), cut,
                                  keep_from, pin]
        self.send_reqs[w] = [self.comm.Isend(buf, dest=w, tag=TAG_WEIGHTS)]

    def _ctrl(self, w, kind, staleness=None, cut=0, keep_from=0, pin=0):
        if not self._complete_sends(w):
            return
        self.ctrl_bufs[w][:] = [kind, 0, 0, _stale_out(staleness), int(time.time() * 1e9), cut, keep_from, pin]
        self.send_reqs[w] = [self.comm.Isend(self.ctrl_bufs[w], dest=w, tag=TAG_CTRL)]

    def answer(self, w, ready):
        self._ctrl(w, R_READY if ready else R_NOT_READY)

    def stop(self, w, staleness, cut=0, keep_from=0, pin=0):
        self._ctrl(w, R_STOP, staleness, cut, keep_from, pin)

    def close(self):
        """Finish the sends and cancel the open receives. Fault tolerant, a worker that dies now is only
        buried (the run is over; the summary notes it): the requests involving it are left alone."""
        for w in self.workers:
            self._complete_sends(w)
        for i, r in enumerate(self.reqs):           # nothing more will come: cancel the open receives
            if r != self.MPI.REQUEST_NULL and self.meta[i][1] not in self.dead:
                try:
                    r.Cancel()
                    r.Wait()
                except self.MPI.Exception as err:
                    self._failed(self.meta[i][1], err)
                    continue
                self.reqs[i] = self.MPI.REQUEST_NULL


class WorkerIO:
    """A worker's messages: receives posted for weights and control replies; pushes and queries sent
    with Isend and waited for with the peer timeout (a hung server never hangs a worker)."""

    def __init__(self, comm, numel, timeout, fault_tolerant=False, rank=None):
        from mpi4py import MPI
        self.MPI, self.comm, self.P, self.timeout = MPI, comm, numel, timeout
        self.fault_tolerant = fault_tolerant
        self.rank = comm.Get_rank() if rank is None else rank
        self.recv_buf = _data_buffer(numel)
        self.ctrl_buf = np.zeros(NF, dtype=np.int64)
        self.push_buf = _data_buffer(numel)
        self.query_buf = np.zeros(NF, dtype=np.int64)
        self.reqs = [comm.Irecv(self.recv_buf, source=0, tag=TAG_WEIGHTS),
                     comm.Irecv(self.ctrl_buf, source=0, tag=TAG_CTRL)]
        self.how_failed = None                      # rank -> what became of it ("died", "was declared dead: ...")

    def _server_died(self, err):
        """Fault tolerant: the server's failure ends the run (it holds the only model), in one line that
        says what became of it (:attr:`how_failed`, the runner's: a stopped server did not 'die')."""
        from hopdec.transport.mpi import FAILURE_CLASSES
        if self.fault_tolerant and err.Get_error_class() in FAILURE_CLASSES:
            how = self.how_failed(0) if self.how_failed else "died"
            return RunError(f"rank {self.rank}: the parameter server (rank 0) {how}; the parameter-server "
                            f"mode cannot go on without it (it holds the only model)")
        return err

    def wait(self, core, wait_action):
        try:
            idx = wait_any(self.reqs, self.timeout,
                           f"rank {self.rank}: no reply from the server (rank 0) for {self.timeout:.0f} s; "
                           f"a peer may have died or hung", on=(0,))
        except self.MPI.Exception as err:
            raise self._server_died(err) from None
        if idx == 0:
            hdr = header(self.recv_buf, self.P).copy()
            self._weights = self.recv_buf[:self.P].copy()
            self.reqs[0] = self.comm.Irecv(self.recv_buf, source=0, tag=TAG_WEIGHTS)
            core.on_weights(int(hdr[1]), gap=int(hdr[2]), staleness=_stale_in(hdr[3]), sent_at=hdr[4] / 1e9,
                            cut=int(hdr[5]), keep_from=int(hdr[6]), pin=int(hdr[7]))
        else:
            hdr = self.ctrl_buf.copy()
            self.reqs[1] = self.comm.Irecv(self.ctrl_buf, source=0, tag=TAG_CTRL)
            kind = int(hdr[0])
            if kind == R_STOP:
                core.on_stop(_stale_in(hdr[3]), cut=int(hdr[5]), keep_from=int(hdr[6]), pin=int(hdr[7]))
            else:
                core.on_answer(kind == R_READY)

    def weights(self):
        return self._weights

    def _send(self, buf, tag):
        try:
            req = self.comm.Isend(buf, dest=0, tag=tag)
            poll_until(lambda: req.Test(), self.timeout,
                       f"rank {self.rank}: the server (rank 0) did not take a message for {self.timeout:.0f} s; "
                       f"a peer may have died or hung")
        except self.MPI.Exception as err:
            raise self._server_died(err) from None

    def _push(self, step, local_steps, iteration, source):
        np.copyto(self.push_buf[:self.P], source)
        header(self.push_buf, self.P)[:] = [K_PUSH, step, local_steps, -1, iteration, 0, 0, 0]
        self._send(self.push_buf, TAG_PUSH)

    def push_gradient(self, step, iteration, grad):
        self._push(step, 1, iteration, grad)

    def push_delta(self, rnd, local_steps, iteration, delta):
        self._push(rnd, local_steps, iteration, delta)

    def query(self, rnd, k, c, iteration):
        self.query_buf[:] = [K_QUERY, rnd, k, -1 if c is None else int(c * 1e9), iteration, 0, 0, 0]
        self._send(self.query_buf, TAG_QUERY)

    def notify_stop(self, signum):
        """Tell the server this worker was asked to stop (Ctrl-C); the server decides where. Sent without
        waiting for it: the server may have stopped this worker already and never read it."""
        self._stop_buf = np.array([K_STOP, 0, 0, -1, 0, signum, 0, 0], dtype=np.int64)
        self._stop_req = self.comm.Isend(self._stop_buf, dest=0, tag=TAG_QUERY)

    def close(self):
        for r in self.reqs:                           # the server sends nothing after STOP
            r.Cancel()
            r.Wait()
        req = getattr(self, "_stop_req", None)
        if req is not None:                           # a small eager message: complete, read or not
            req.Test()
