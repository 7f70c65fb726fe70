"""The parameter-server mode over MPI: rank 0 runs the server core, ranks 1..n the worker cores.

A thin driver: it receives a message, feeds it to the core, and carries out the core's actions with
:func:`hopdec.runtime.ps_loop.server_loop` / :func:`~hopdec.runtime.ps_loop.worker_loop`. Every decision
(who waits, what is applied, when to stop) is the cores' (:mod:`hopdec.ps.server`, :mod:`hopdec.ps.worker`).

Wire format: one message per push and one per weights send. A data message is a float32 buffer of the P
flat values followed by an int64 header (:mod:`hopdec.transport.message`), so tags stay constant (MPI
only promises tags up to 32767) and step numbers are unbounded. Control messages (ESync queries,
READY / NOT-READY, STOP) are small int64 arrays. No pickling, no per-parameter messages. Every wait --
receives and sends -- polls with ``--peer-timeout`` (:func:`hopdec.transport.waiting.poll_until`), so a
dead or hung peer ends the job with one line naming it.

Logs (``--log-dir``): workers write ``rank{r}.jsonl`` with one record per mini-batch (``rank``, ``iter``,
``time``, ``loss``, ``compute_s``, ``wait_s``, the weights ``version`` it computed on, the ``staleness``
of its gradient when applied (-1: dropped), the ``gap`` it had when sent the weights, ...). ``time`` is
the server's send time of the weights the iteration computed on (one machine clock, ``time.time()``), so
the summary's observed gap is the one the server enforced. The server writes ``rank0.jsonl``: a header,
then events (``apply``, ``drop``, ``release``, ``stop``, ``note``, ``eval``) without an ``iter`` key.
"""

import json
import time

import numpy as np

from hopdec.ps.server import Server
from hopdec.runtime.metrics import log_path, open_jsonl
from hopdec.ps.worker import PSWorker
from hopdec.transport.message import header, message_floats
from hopdec.transport.waiting import poll_until, wait_any

TAG_PUSH = 201     # worker -> server: data buffer (gradient or model difference) + header
TAG_QUERY = 202    # worker -> server: ESync state query (int64 header)
TAG_WEIGHTS = 203  # server -> worker: weights + header
TAG_CTRL = 204     # server -> worker: READY / NOT_READY / STOP (int64 header)

NF = 8             # int64 header fields
# worker -> server header: [kind, step, local_steps, c_ns, iteration, signal, 0, 0]
K_PUSH, K_QUERY, K_STOP = 1, 2, 3  # K_STOP (on the query tag): this worker was asked to stop (Ctrl-C)
# server -> worker header: [kind, version, gap, staleness, send_time_ns, cut, keep_from, 0]
R_WEIGHTS, R_STOP, R_READY, R_NOT_READY = 1, 2, 3, 4
STALE_NONE = -2    # staleness on the wire when none is known yet (-1: dropped, as in hopdec.ps.server)


def _data_buffer(numel):
    """float32 buffer: P values then an int64 header of NF fields (the MPI transport's layout)."""
    return np.zeros(message_floats(numel, NF), dtype=np.float32)


def _stale_out(s):
    return STALE_NONE if s is None else int(s)


def _stale_in(v):
    return None if int(v) == STALE_NONE else int(v)


def combine(pairs, out, scratch):
    """out <- sum(weight * buffer) over ``pairs = [(buffer, weight)]``, in the order given (float32)."""
    (b0, a0), rest = pairs[0], pairs[1:]
    np.copyto(out, b0)
    if a0 != 1.0:
        out *= np.float32(a0)
    for b, a in rest:
        if a == 1.0:
            out += b
        else:
            np.multiply(b, np.float32(a), out=scratch)
            out += scratch
    return out


# ---- the server ---------------------------------------------------------------------------------
class ServerModel:
    """The server's weights and optimizer: a :class:`~hopdec.ml.trainer.LocalTrainer` (SGD with momentum
    and weight decay on one flat tensor) that applies combined gradients or adds model differences."""

    def __init__(self, trainer):
        import torch
        self.torch, self.t = torch, trainer
        self.P = trainer.numel
        self.cpu = trainer.device.type == "cpu"
        self.grad = trainer.flat.grad.numpy() if self.cpu else np.zeros(self.P, dtype=np.float32)
        self.scratch = np.zeros(self.P, dtype=np.float32)
        self.delta = np.zeros(self.P, dtype=np.float32)

    def apply_gradients(self, pairs):
        combine(pairs, self.grad, self.scratch)
        if not self.cpu:
            self.t.flat.grad.copy_(self.torch.from_numpy(self.grad).to(self.t.device))
        self.t.apply()

    def add_deltas(self, pairs):                  # ESync: w += sum(1/p * delta), global learning rate 1
        combine(pairs, self.delta, self.scratch)
        with self.torch.no_grad():
            self.t.flat.add_(self.torch.from_numpy(self.delta).to(self.t.device))

    def write_params(self, out):
        self.t.write_params(out)


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
        from hopdec.runtime.failures import announce_ps_failure
        while self._new_dead:
            w = self._new_dead.pop(0)
            core.on_worker_failed(w, time.time())
            announce_ps_failure(w, len(self.workers) - len(self.dead))    # when it happens, not only in the summary

    def _wait_any(self, wait_action):
        what = lambda: (f"rank 0 (server): no message from any worker for {self.timeout:.0f} s (still "
                        f"running: ranks {', '.join(map(str, wait_action.on))}); a peer may have died or hung")
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
                       f"rank 0 (server): rank {w} did not receive a message for {self.timeout:.0f} s; "
                       f"a peer may have died or hung")
            if w in self.dead:
                return False
            self.send_reqs[w] = []
        return True

    def send_weights(self, w, version, gap, staleness, model, now, cut=0, keep_from=0):
        if not self._complete_sends(w):
            return
        idx = self._slot("push", w)
        if self.reqs[idx] == self.MPI.REQUEST_NULL:
            self._post(idx)                         # its buffer is free again: applied or dropped
        buf = self.send_bufs[w]
        model.write_params(buf[:self.P])
        header(buf, self.P)[:] = [R_WEIGHTS, version, gap, _stale_out(staleness), int(now * 1e9), cut,
                                  keep_from, 0]
        self.send_reqs[w] = [self.comm.Isend(buf, dest=w, tag=TAG_WEIGHTS)]

    def _ctrl(self, w, kind, staleness=None, cut=0, keep_from=0):
        if not self._complete_sends(w):
            return
        self.ctrl_bufs[w][:] = [kind, 0, 0, _stale_out(staleness), int(time.time() * 1e9), cut, keep_from, 0]
        self.send_reqs[w] = [self.comm.Isend(self.ctrl_bufs[w], dest=w, tag=TAG_CTRL)]

    def answer(self, w, ready):
        self._ctrl(w, R_READY if ready else R_NOT_READY)

    def stop(self, w, staleness, cut=0, keep_from=0):
        self._ctrl(w, R_STOP, staleness, cut, keep_from)

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


# ---- a worker -----------------------------------------------------------------------------------
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

    def _server_died(self, err):
        """Fault tolerant: the server's failure ends the run (it holds the only model), in one line."""
        from hopdec.runtime.failures import RunError
        from hopdec.transport.mpi import FAILURE_CLASSES
        if self.fault_tolerant and err.Get_error_class() in FAILURE_CLASSES:
            return RunError(f"rank {self.rank}: the parameter server (rank 0) died; the parameter-server "
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
                            cut=int(hdr[5]), keep_from=int(hdr[6]))
        else:
            hdr = self.ctrl_buf.copy()
            self.reqs[1] = self.comm.Irecv(self.ctrl_buf, source=0, tag=TAG_CTRL)
            kind = int(hdr[0])
            if kind == R_STOP:
                core.on_stop(_stale_in(hdr[3]), cut=int(hdr[5]), keep_from=int(hdr[6]))
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


class WorkerBackend:
    """A PS worker's torch side: the shared :class:`~hopdec.runtime.backend.TorchBackend` (compute with
    emulation, SGD step) plus loading weights and forming ESync's model difference."""

    def __init__(self, backend):
        self.b, self.t = backend, backend.t
        self.cpu = self.t.device.type == "cpu"
        self.kept = np.zeros(self.t.numel, dtype=np.float32)
        self.diff = np.zeros(self.t.numel, dtype=np.float32)

    def compute(self, iteration):
        return self.b.compute(iteration)

    def apply(self, iteration):
        self.b.apply(iteration)

    def load_params(self, buf):
        self.t.load_params(buf)

    def keep_params(self):
        self.t.write_params(self.kept)

    def gradient(self):
        g = self.t.flat.grad
        return g.numpy() if self.cpu else g.detach().cpu().numpy()

    def delta(self):
        self.t.write_params(self.diff)
        self.diff -= self.kept
        return self.diff


class _EventLog:
    """rank0.jsonl: the run header, then server events (no ``iter`` key, so read_log skips them)."""

    def __init__(self, log_dir, header, append=False):
        self._f = open_jsonl(log_dir, 0, header, append=append) if log_dir else None
        self.path = log_path(log_dir, 0) if log_dir else None

    def tell(self):
        self._f.flush()
        return self._f.tell()

    def __call__(self, event, **data):
        if self._f:
            self._f.write(json.dumps(dict(event=event, **data)) + "\n")

    def close(self):
        if self._f:
            self._f.close()
            self._f = None


# ---- entry point --------------------------------------------------------------------------------
def run(ctx):
    """Run the PS mode on this rank (collective); rank 0 prints the summary and returns it."""
    from hopdec.ps.options import check_args
    from hopdec.runtime.backend import TorchBackend
    from hopdec.runtime.metrics import RankLogger
    from hopdec.runtime.ps_loop import server_loop, worker_loop
    from hopdec.observe import RunObserver
    from hopdec.runtime.report import report
    from hopdec.runtime.resume import PSRank, open_log
    from hopdec.transport.collectives import barrier
    from hopdec.transport.waiting import watching

    args, rank = ctx.args, ctx.rank
    ft = bool(getattr(args, "fault_tolerance", False))
    if ft:
        from mpi4py import MPI
        ctx.comm = ctx.comm.Dup()                   # errors return (ULFM)
        ctx.comm.Set_errhandler(MPI.ERRORS_RETURN)
    comm = ctx.comm
    ctx.extra["worker"] = rank                      # ids stay the first communicator's ranks
    policy = ctx.extra.get("ps_policy") or check_args(args, ctx.size)
    workers = policy.workers
    n = len(workers)
    budget = int(ctx.iterations) * n
    settings = policy.settings()
    title = f"parameter server {policy.describe()} (1 server + {n} workers)"
    timeout = ctx.timeout
    if rank == 0:
        trainer = ctx.make_trainer(0, n)
        keep = PSRank(ctx, trainer, n)                 # checkpoints, resume, Ctrl-C (hopdec.runtime.resume)
        emulator = None
        header = dict(mode="ps", sync=policy.sync, workers=n, worker_ranks=list(workers),
                      iterations=ctx.iterations, budget=budget, model=ctx.model_name, params=trainer.numel,
                      hparams=ctx.hparams, device=str(ctx.device), seed=args.seed, settings=settings,
                      gap_bound=policy.gap_bound(), **keep.header())
        events = _EventLog(ctx.log_dir, header, append=open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, 0)))
        logger = RankLogger(None, 0)
        model = ServerModel(trainer)
        io = ServerIO(comm, workers, trainer.numel, timeout, fault_tolerant=ft)
        core = Server(policy, budget, checkpoints=keep.checkpoints, checkpoint_every=keep.every)
        io.on_stop_notice = lambda w, signum: keep.on_stop_notice(core, signum)
        obs = RunObserver(ctx, events, "ps-server", workers, ctx.iterations, header, bound=policy.gap_bound(),
                          board_extra=lambda: f"server v{policy.version}, {core.dropped} dropped")

        def on_event(name, **data):
            events(name, **data)
            obs.event(name, **data)
        eval_interval = float(getattr(args, "eval_interval", 0.0) or 0.0)
        evals = []

        def evaluate(now):
            loss, acc = trainer.evaluate()
            rec = dict(time=now, elapsed=now - t0, version=policy.version, work=core.work,
                       test_loss=loss, test_acc=acc)
            evals.append(rec)
            events("eval", **rec)

        barrier(comm, timeout, "start")
        t0 = time.time()
        obs.begin(t0)
        if eval_interval > 0:
            evaluate(t0)
        last_eval = time.time()
        if not keep.resume_server(core, io):
            core.start(t0)
        with watching(keep.server_watch(core)):
            for wait in server_loop(core, io, model, on_event=on_event,
                                    on_checkpoint=lambda a: keep.save_server(core, io, a, events)):
                io.wait(core, wait)
                ctx.faults.at("train", core.work)
                if eval_interval > 0 and time.time() - last_eval >= eval_interval:
                    evaluate(time.time())
                    last_eval = time.time()
        ctx.faults.at("shutdown")
        io.close()
        elapsed = time.time() - t0
        obs.close()
        end = keep.outcome(core) if not ft else _on_survivors(ctx, lambda: keep.outcome(core))
        if end["stopped"]:
            events.close()
            return keep.report_stop(end)
        evaluate(time.time())
        final = evals[-1]
        events("summary", elapsed=elapsed, version=policy.version, applied=core.applied,
               dropped=core.dropped, work=core.work, test_loss=final["test_loss"], test_acc=final["test_acc"])
        events.close()
        if args.save_models and ctx.log_dir:
            np.save(f"{ctx.log_dir}/params_rank0.npy", trainer.write_params())
        extra = dict(server_updates=policy.version, dropped=core.dropped, elapsed_server=elapsed)
        notes = failure_notes(core, n)
    else:
        trainer = ctx.make_trainer(workers.index(rank), n)
        keep = PSRank(ctx, trainer, n)
        emulator = ctx.make_emulator(rank, workers)
        header = dict(mode="ps", sync=policy.sync, worker=rank, workers=n, iterations=ctx.iterations,
                      model=ctx.model_name, params=trainer.numel, hparams=ctx.hparams,
                      device=str(ctx.device), emulation=emulator.describe(), seed=args.seed,
                      settings=settings, gap_bound=policy.gap_bound(), **keep.header())
        logger = RankLogger(ctx.log_dir, rank, header=header,
                            append=open_log(ctx, ctx.log_dir and log_path(ctx.log_dir, rank)))
        backend = WorkerBackend(TorchBackend(trainer, emulator, faults=ctx.faults))
        io = WorkerIO(comm, trainer.numel, timeout, fault_tolerant=ft)
        core = PSWorker(rank, esync=policy.sync == "esync")
        keep.resume_worker(core)
        obs = RunObserver(ctx, logger.event, "ps-worker", workers, ctx.iterations, header,
                          bound=policy.gap_bound())

        def on_record(rec):
            logger.log(rec)
            obs.on_record(rec)
        barrier(comm, timeout, "start")
        obs.begin()
        with watching(keep.worker_watch(io)):
            for wait in worker_loop(core, io, backend, on_record=on_record,
                                    on_checkpoint=lambda a: keep.save_worker(core, a, logger)):
                io.wait(core, wait)
        obs.finished(logger.last_iter)
        ctx.faults.at("shutdown")
        io.close()
        obs.close()
        logger.close()
        end = keep.outcome() if not ft else _on_survivors(ctx, keep.outcome)
        if end["stopped"]:
            return keep.report_stop(end)
        if args.save_models and ctx.log_dir:
            np.save(f"{ctx.log_dir}/params_rank{rank}.npy", trainer.write_params())
        extra, notes = {}, []
    if rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)

    def summary():
        return report(ctx, logger, trainer, emulator, title,
                      eval_flat=trainer.write_params() if rank == 0 else None,
                      bound=policy.gap_bound(), extra=extra, workers=set(workers), model_label="server model",
                      bound_label=f"bound of --sync {policy.sync}", notes=notes)
    out = summary() if not ft else _on_survivors(ctx, summary)
    if rank == 0:
        print(f"server: {policy.version} updates, {core.dropped} gradients dropped, "
              f"{elapsed:.2f} s", flush=True)
    return out


def failure_notes(core, n):
    """The summary's lines about workers that died (``--fault-tolerance``)."""
    lines = []
    for e in core.failures:
        lines.append(f"failure: worker {e['worker']} died after {e['work']} mini-batches (server at version "
                     f"{e['version']}); the others went on, the work budget is now {e['budget']}")
    if core.failed:
        lines.append(f"{n - len(core.failed)} of {n} workers finished")
    return lines


def _on_survivors(ctx, collective):
    """Fault tolerant: run ``collective`` (how the run ended, the summary) on the survivors:
    ``MPI_Comm_shrink`` agrees who they are (the dead ones' rows are missing); a failure during it
    shrinks and runs it again."""
    from mpi4py import MPI

    from hopdec.transport.mpi import is_peer_failure
    comm = ctx.comm
    while True:
        new = comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
        ctx.comm = new
        try:
            return collective()
        except Exception as err:
            if not is_peer_failure(err, new):
                raise
            try:
                new.Revoke()
            except MPI.Exception:
                pass
            comm = new
