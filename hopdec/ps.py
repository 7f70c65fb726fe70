"""Centralized parameter-server mode (``hopdec train --mode ps --sync MODE``), for comparisons.

Rank 0 is the server, ranks 1..n-1 are the workers (worker index = rank - 1; ``--slowdown rank=R``
names a *worker index*, as in :meth:`hopdec.trainer.RunContext.make_emulator`). The logic of every
synchronization model lives in :mod:`hopdec.server_policies` (sans I/O); this module is only its MPI
transport plus the torch side:

* The server holds the flat parameters and the optimizer (a :class:`hopdec.trainer.LocalTrainer`:
  SGD with momentum / weight decay on the one flat tensor). It keeps, per worker, a preallocated
  receive buffer with a nonblocking ``Irecv`` posted on it, polls them with ``Testany``, feeds the
  events to the policy and carries out its actions in order (Apply: combine the buffers and step
  the optimizer, or add model differences for ESync; Drop; Release: send the current weights;
  Answer: an ESync state-query reply).
* Workers compute gradients with the shared trainer and emulation (``--compute-time``,
  ``--slowdown``), push them, and really block (polling, with ``--peer-timeout``) until the server
  answers. ESync workers run local SGD steps on their replica and push the model difference.

Wire format: one message per push and one per release. A data message is a float32 buffer of the
P flat values followed by an int64 header (8-byte aligned), so tags stay constant (MPI only promises
tags up to 32767) and step numbers are unbounded. Control messages (ESync queries, READY/NOT-READY,
STOP) are small int64 arrays. No pickling, no per-parameter messages.

Work budget: ``--iterations N`` is N mini-batches per worker, so the run stops once the server has
received ``N * workers`` mini-batch gradients (pushed gradients, dropped ones included; local steps
for ESync) -- at the first release after that point every worker gets STOP (BSP then runs exactly N
steps). A worker that is silent for ``--peer-timeout`` seconds makes the waiting rank print one line
and ``MPI_Abort`` the job, so a dead or hung worker never hangs the run.

Logs (``--log-dir``): workers write ``rank{r}.jsonl`` with one record per iteration (``rank``,
``iter``, ``time``, ``loss``, ``compute_s``, ``wait_s``, the weights ``version`` it computed on, the
``staleness`` of its gradient when applied (-1: dropped), the server's iteration ``gap`` when it was
released, ...). ``time`` is the server's release time of the weights the iteration computed on (same
machine clock, ``time.time()``), i.e. when the server let the worker enter the iteration -- so the
summary's observed iteration gap is the one the server enforced. The server writes ``rank0.jsonl``:
a header, then events (``apply``, ``drop``, ``release``, ``note``, ``eval``) without an ``iter`` key.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from hopdec.errors import ConfigError
from hopdec.transport.message import header, message_floats
from hopdec.server_policies import (SYNC_MODES, Answer, Apply, Drop, Note, Release, make_policy)

TAG_PUSH = 201     # worker -> server: data buffer (gradient or model difference) + header
TAG_QUERY = 202    # worker -> server: ESync state query (int64 header)
TAG_WEIGHTS = 203  # server -> worker: weights + header
TAG_CTRL = 204     # server -> worker: READY / NOT_READY / STOP (int64 header)

NF = 6             # int64 header fields
# worker -> server header: [kind, step, local_steps, c_ns, iteration, 0]
K_PUSH, K_QUERY = 1, 2
# server -> worker header: [kind, version, gap, staleness, release_time_ns, 0]
R_WEIGHTS, R_STOP, R_READY, R_NOT_READY = 1, 2, 3, 4
STALE_NONE, STALE_DROPPED = -2, -1


class PeerTimeout(RuntimeError):
    """A rank waited longer than ``--peer-timeout``: a peer may have died or hung."""


# ---- options -----------------------------------------------------------------------------------
def add_arguments(parser):
    """The PS-only options (``hopdec train`` adds them; ``--staleness``, ``--backup-workers`` are shared)."""
    g = parser.add_argument_group("parameter server (--mode ps: rank 0 serves, ranks 1.. are workers)")
    g.add_argument("--sync", default="bsp", metavar="{" + ",".join(SYNC_MODES) + "}",
                   help="synchronization model: bsp, asp, ssp (--staleness s, default 3), dssp "
                        "(--staleness-range), elastic (--lookahead), backup (--backup-workers b: "
                        "N = workers - b gradients per step), esync")
    g.add_argument("--staleness-range", default="3,15", metavar="sL,sU",
                   help="dssp: staleness threshold range (3,15 is DSSP Table I's s_L=3, r=12)")
    g.add_argument("--lookahead", type=int, default=15, metavar="R",
                   help="elastic: predicted future pushes per worker for ZipLine")
    g.add_argument("--esync-epsilon", type=float, default=0.0, metavar="SECONDS",
                   help="esync: the state server's boundary constant (a device aggregates when its "
                        "step time + epsilon exceeds the slowest device's remaining time); negative "
                        "lets a fast device finish a step up to |epsilon| after the slowest")
    g.add_argument("--eval-interval", type=float, default=0.0, metavar="SECONDS",
                   help="the server evaluates its model every SECONDS of wall time and logs it "
                        "(0: only at the end)")
    return parser


def _policy_from(args, n_workers):
    return make_policy(getattr(args, "sync", "bsp"), n_workers,
                       staleness=getattr(args, "staleness", None),
                       staleness_range=getattr(args, "staleness_range", None),
                       lookahead=getattr(args, "lookahead", None),
                       backup_workers=getattr(args, "backup_workers", None),
                       esync_epsilon=getattr(args, "esync_epsilon", 0.0) or 0.0)


def check_args(args, size):
    """The PS settings checks that need only the options and the number of ranks (no torch).

    Cheap: ``hopdec.train_cli.setup`` may call it before importing torch so bad settings fail in
    about a second; :func:`check` calls it too. Returns the validated policy.
    """
    if size < 2:
        raise ConfigError(f"--mode ps needs at least 2 ranks (a server and a worker), got {size}")
    ev = getattr(args, "eval_interval", 0.0) or 0.0
    if not ev >= 0:
        raise ConfigError(f"--eval-interval must be >= 0 seconds, got {ev}")
    die = getattr(args, "die_rank", None)
    if die is not None and not 1 <= die < size:
        raise ConfigError(f"--die-rank {die}: in ps mode only worker ranks 1..{size - 1} can die")
    return _policy_from(args, size - 1)


def check(ctx):
    """Validate the PS settings on this rank before any communication (ConfigError: one line)."""
    ctx.extra["ps_policy"] = check_args(ctx.args, ctx.size)
    return ctx.extra["ps_policy"]


# ---- buffers and waiting -----------------------------------------------------------------------
def _data_buffer(numel):
    """float32 buffer: P values then an int64 header of NF fields (the MPI transport's layout)."""
    return np.zeros(message_floats(numel, NF), dtype=np.float32)


def combine(parts, bufs, out, scratch):
    """out <- sum(weight * bufs[w][:P]) over ``parts`` = [(w, weight)], in the order given."""
    P = out.shape[0]
    (w0, a0), rest = parts[0], parts[1:]
    np.copyto(out, bufs[w0][:P])
    if a0 != 1.0:
        out *= np.float32(a0)
    for w, a in rest:
        if a == 1.0:
            out += bufs[w][:P]
        else:
            np.multiply(bufs[w][:P], np.float32(a), out=scratch)
            out += scratch
    return out


def _wait_any(reqs, timeout, what):
    """Index of a completed request among ``reqs`` (polling with backoff); PeerTimeout after ``timeout``."""
    from mpi4py import MPI
    start = time.monotonic()
    nap = 5e-5
    while True:
        idx = MPI.Request.Testany(reqs)[0]
        if idx != MPI.UNDEFINED:
            return idx
        if time.monotonic() - start > timeout:
            raise PeerTimeout(f"{what} for {timeout:.0f} s; a peer may have died or hung")
        time.sleep(nap)
        nap = min(nap * 2, 1e-3)


def _wait(req, timeout, what):
    _wait_any([req], timeout, what)


def _fatal(comm, err):
    print(f"hopdec train: error: {err}", file=sys.stderr, flush=True)
    time.sleep(0.5)            # let the launcher forward the line before MPI_Abort kills everyone
    comm.Abort(3)


# ---- the server --------------------------------------------------------------------------------
class _EventLog:
    """rank0.jsonl: the run header, then server events (no ``iter`` key, so read_log skips them)."""

    def __init__(self, log_dir, header):
        self._f = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            self._f = open(os.path.join(log_dir, "rank0.jsonl"), "w")
            self._f.write(json.dumps({"rank": 0, "run": header}) + "\n")

    def __call__(self, event, **data):
        if self._f:
            self._f.write(json.dumps(dict(event=event, **data)) + "\n")

    def close(self):
        if self._f:
            self._f.close()
            self._f = None


class Server:
    def __init__(self, ctx, policy, trainer, events, budget, bar):
        from mpi4py import MPI
        self.MPI = MPI
        self.ctx, self.comm, self.policy, self.t = ctx, ctx.comm, policy, trainer
        self.n = ctx.size - 1
        self.P = trainer.numel
        self.events, self.budget, self.bar = events, budget, bar
        self.timeout = float(getattr(ctx.args, "peer_timeout", 120.0) or 120.0)
        self.eval_interval = float(getattr(ctx.args, "eval_interval", 0.0) or 0.0)
        self.cpu = trainer.device.type == "cpu"
        P = self.P
        self.push_bufs = [_data_buffer(P) for _ in range(self.n)]
        self.query_bufs = [np.zeros(NF, dtype=np.int64) for _ in range(self.n)]
        self.send_bufs = [_data_buffer(P) for _ in range(self.n)]
        self.ctrl_bufs = [np.zeros(NF, dtype=np.int64) for _ in range(self.n)]
        self.send_reqs = [[] for _ in range(self.n)]
        self.grad = trainer.flat.grad.numpy() if self.cpu else np.zeros(P, dtype=np.float32)
        self.scratch = np.zeros(P, dtype=np.float32)
        self.delta = np.zeros(P, dtype=np.float32)
        self.params_host = np.zeros(P, dtype=np.float32)
        # receives: reqs[2w] = push of worker w, reqs[2w+1] = its query
        self.reqs = [self.MPI.REQUEST_NULL] * (2 * self.n)
        for w in range(self.n):
            self._post_push(w)
            self._post_query(w)
        self.last_staleness = [STALE_NONE] * self.n
        self.work = 0
        self.budget_reached = False
        self.stopping = False
        self.stopped = [False] * self.n
        self.pending_step = [None] * self.n
        self.applied = 0
        self.dropped = 0
        self.t0 = None
        self.last_eval = None
        self.evals = []

    # receives ---------------------------------------------------------------------------------
    def _post_push(self, w):
        self.reqs[2 * w] = self.comm.Irecv(self.push_bufs[w], source=w + 1, tag=TAG_PUSH)

    def _post_query(self, w):
        self.reqs[2 * w + 1] = self.comm.Irecv(self.query_bufs[w], source=w + 1, tag=TAG_QUERY)

    # sends ------------------------------------------------------------------------------------
    def _complete_sends(self, w):
        if self.send_reqs[w]:
            self.MPI.Request.Waitall(self.send_reqs[w])
            self.send_reqs[w] = []

    def _send_weights(self, w, version, gap, now):
        self._complete_sends(w)
        if self.reqs[2 * w] == self.MPI.REQUEST_NULL:
            self._post_push(w)       # the buffer is free again: its contents were applied/dropped
        buf = self.send_bufs[w]
        self.t.write_params(buf[:self.P])
        header(buf, self.P)[:] = [R_WEIGHTS, version, gap, self.last_staleness[w],
                                   int(now * 1e9), 0]
        self.send_reqs[w] = [self.comm.Isend(buf, dest=w + 1, tag=TAG_WEIGHTS)]

    def _send_ctrl(self, w, kind, now):
        self._complete_sends(w)
        self.ctrl_bufs[w][:] = [kind, self.policy.version, 0, self.last_staleness[w], int(now * 1e9), 0]
        self.send_reqs[w] = [self.comm.Isend(self.ctrl_bufs[w], dest=w + 1, tag=TAG_CTRL)]

    def _stop(self, w, now):
        if not self.stopped[w]:
            self._send_ctrl(w, R_STOP, now)
            self.stopped[w] = True

    # actions ----------------------------------------------------------------------------------
    def _do(self, actions, now):
        pol = self.policy
        for a in actions:
            if isinstance(a, Apply):
                combine(a.parts, self.push_bufs, self.delta if a.kind == "delta" else self.grad,
                        self.scratch)
                if a.kind == "delta":   # ESync: w += sum(1/p * delta), global learning rate 1
                    import torch
                    with torch.no_grad():
                        self.t.flat.add_(torch.from_numpy(self.delta).to(self.t.device))
                else:
                    if not self.cpu:
                        import torch
                        self.t.flat.grad.copy_(torch.from_numpy(self.grad).to(self.t.device))
                    self.t.apply()
                steps = [self.pending_step[w] for w, _ in a.parts]
                for (w, _), s in zip(a.parts, a.staleness):
                    self.last_staleness[w] = int(s)
                    self.pending_step[w] = None
                self.applied += 1
                self.events("apply", time=now, version=a.version, kind=a.kind,
                            workers=[w for w, _ in a.parts], weights=[wt for _, wt in a.parts],
                            steps=steps, staleness=list(a.staleness))
            elif isinstance(a, Drop):
                self.last_staleness[a.worker] = STALE_DROPPED
                self.pending_step[a.worker] = None
                self.dropped += 1
                self.events("drop", time=now, worker=a.worker, step=a.step, version=a.version)
            elif isinstance(a, Release):
                if self.budget_reached and not self.stopping:
                    self.stopping = True
                    self.events("stop", time=now, work=self.work, version=pol.version)
                if self.stopping:
                    for w in sorted(set(a.workers) | set(pol.waiting)):
                        self._stop(w, now)
                    continue
                low = min(pol.pushes)
                gaps = [pol.pushes[w] - low for w in a.workers]
                for w, g in zip(a.workers, gaps):
                    self._send_weights(w, a.version, g, now)
                self.events("release", time=now, workers=list(a.workers), version=a.version,
                            gaps=gaps, reason=a.reason)
            elif isinstance(a, Answer):
                self._send_ctrl(a.worker, R_READY if a.ready else R_NOT_READY, now)
            elif isinstance(a, Note):
                self.events("note", time=now, what=a.event, **a.data)
            else:  # pragma: no cover
                raise TypeError(f"unknown action {a!r}")

    def _evaluate(self, now):
        loss, acc = self.t.evaluate()
        rec = dict(time=now, elapsed=now - self.t0, version=self.policy.version, work=self.work,
                   test_loss=loss, test_acc=acc)
        self.evals.append(rec)
        self.events("eval", **rec)
        self.last_eval = time.time()

    # the loop ---------------------------------------------------------------------------------
    def serve(self):
        self.t0 = now = time.time()
        self.last_eval = now
        if self.eval_interval > 0:
            self._evaluate(now)
        self._do(self.policy.start(now), now)
        while not all(self.stopped):
            idx = _wait_any(self.reqs, self.timeout,
                            "rank 0 (server): no message from any worker "
                            f"(still running: ranks {[w + 1 for w in range(self.n) if not self.stopped[w]]})")
            w, is_query = divmod(idx, 2)
            now = time.time()
            if is_query:
                k, c_ns = int(self.query_bufs[w][2]), int(self.query_bufs[w][3])
                self._post_query(w)
                if self.stopping:
                    self._stop(w, now)
                else:
                    self._do(self.policy.on_query(w, k, None if c_ns < 0 else c_ns / 1e9, now), now)
            else:
                self.reqs[2 * w] = self.MPI.REQUEST_NULL   # reposted when the worker is released
                hdr = header(self.push_bufs[w], self.P)
                step, local_steps = int(hdr[1]), max(1, int(hdr[2]))
                self.work += local_steps
                self.bar.update(local_steps)
                if self.work >= self.budget:
                    self.budget_reached = True
                if self.stopping:
                    self._stop(w, now)
                else:
                    self.pending_step[w] = step
                    self._do(self.policy.on_push(w, step, now, local_steps=local_steps), now)
            if self.eval_interval > 0 and time.time() - self.last_eval >= self.eval_interval:
                self._evaluate(time.time())
        for w in range(self.n):
            self._complete_sends(w)
        for i, r in enumerate(self.reqs):      # nothing more will come: cancel the open receives
            if r != self.MPI.REQUEST_NULL:
                r.Cancel()
                r.Wait()
                self.reqs[i] = self.MPI.REQUEST_NULL
        end = time.time()
        self._evaluate(end)
        return end - self.t0


# ---- a worker ----------------------------------------------------------------------------------
class WorkerRunner:
    def __init__(self, ctx, trainer, backend, logger, esync):
        from mpi4py import MPI
        self.MPI = MPI
        self.ctx, self.comm, self.t, self.backend, self.logger = ctx, ctx.comm, trainer, backend, logger
        self.rank = ctx.rank
        self.esync = esync
        self.P = trainer.numel
        self.timeout = float(getattr(ctx.args, "peer_timeout", 120.0) or 120.0)
        self.cpu = trainer.device.type == "cpu"
        self.recv_buf = _data_buffer(self.P)
        self.ctrl_buf = np.zeros(NF, dtype=np.int64)
        self.push_buf = _data_buffer(self.P)
        self.query_buf = np.zeros(NF, dtype=np.int64)
        self.reqs = [self.comm.Irecv(self.recv_buf, source=0, tag=TAG_WEIGHTS),
                     self.comm.Irecv(self.ctrl_buf, source=0, tag=TAG_CTRL)]
        self.iteration = 0
        self.stopped = False

    def _reply(self):
        """Block until the server answers; returns (kind, header copy). Weights are loaded."""
        idx = _wait_any(self.reqs, self.timeout, f"rank {self.rank}: no reply from the server (rank 0)")
        if idx == 0:
            hdr = header(self.recv_buf, self.P).copy()
            self.t.load_params(self.recv_buf[:self.P])
            self.reqs[0] = self.comm.Irecv(self.recv_buf, source=0, tag=TAG_WEIGHTS)
        else:
            hdr = self.ctrl_buf.copy()
            self.reqs[1] = self.comm.Irecv(self.ctrl_buf, source=0, tag=TAG_CTRL)
        return int(hdr[0]), hdr

    def _push(self, step, local_steps, c_s, source):
        """Send the flat ``source`` (gradient or model difference) with its header: one message."""
        np.copyto(self.push_buf[:self.P], source)
        header(self.push_buf, self.P)[:] = [K_PUSH, step, local_steps,
                                             -1 if c_s is None else int(c_s * 1e9), self.iteration, 0]
        self.comm.Send(self.push_buf, dest=0, tag=TAG_PUSH)

    def _query(self, step, k, c_s):
        self.query_buf[:] = [K_QUERY, step, k, -1 if c_s is None else int(c_s * 1e9), self.iteration, 0]
        self.comm.Send(self.query_buf, dest=0, tag=TAG_QUERY)

    def _grad_host(self):
        return self.t.flat.grad.numpy() if self.cpu else self.t.flat.grad.detach().cpu().numpy()

    def run(self):
        kind, hdr = self._reply()                     # the initial weights (or STOP)
        if self.esync:
            self._run_esync(kind, hdr)
        else:
            self._run_sgd(kind, hdr)
        for r in self.reqs:                           # the server sends nothing after STOP
            r.Cancel()
            r.Wait()

    def _run_sgd(self, kind, hdr):
        while kind == R_WEIGHTS:
            version, gap, entered = int(hdr[1]), int(hdr[2]), hdr[4] / 1e9
            rec = dict(rank=self.rank, iter=self.iteration, time=entered, version=version, gap=gap,
                       t_recv=time.time())
            rec.update(self.backend.compute(self.iteration))
            t_push = time.time()
            self._push(version, 1, rec["compute_s"], self._grad_host())
            kind, hdr = self._reply()
            rec.update(t_push=t_push, wait_s=time.time() - t_push,
                       staleness=int(hdr[3]) if int(hdr[3]) != STALE_NONE else None)
            self.logger.log(rec)
            self.iteration += 1

    def _run_esync(self, kind, hdr):
        """ESync Algorithm 1 with blocking state queries (sec. 4.1); the local step is the trainer's SGD.

        Per round: remember w_t, query with k = 0 (RESET-STATE-SERVER: this device has pulled), then
        while the server says NOT-READY run one local step and query again with k and its time c;
        on READY push w_{t,k} - w_t and wait for the next round's weights. The paper's
        RUN-BATCH-DATA-TEST is not run: until a device reports its first c the server counts it
        as the slowest (see :class:`hopdec.server_policies.ESyncPolicy`).
        """
        global_w = np.zeros(self.P, dtype=np.float32)
        delta = np.zeros(self.P, dtype=np.float32)
        c = None                                       # last local step time (unknown at first)
        while kind == R_WEIGHTS:
            rnd = int(hdr[1])
            self.t.write_params(global_w)              # w_t, to form the difference later
            k = 0
            t_q = time.time()
            self._query(rnd, 0, c)
            kind, hdr = self._reply()
            carry = time.time() - t_q                   # the k=0 query's wait goes to the first step
            rec = None
            while kind == R_NOT_READY:
                t_s = time.time()
                rec = dict(rank=self.rank, iter=self.iteration, time=t_s, round=rnd, local_step=k + 1,
                           version=rnd)
                rec.update(self.backend.compute(self.iteration))
                self.t.apply()                         # w_{t,k+1} = w_{t,k} - lr * grad (eq. 5)
                c = time.time() - t_s
                k += 1
                self.iteration += 1
                t_q = time.time()
                self._query(rnd, k, c)
                kind, hdr = self._reply()
                rec["wait_s"] = carry + time.time() - t_q
                carry = 0.0
                if kind == R_NOT_READY:
                    self.logger.log(rec)
            if kind == R_STOP:
                if rec is not None:
                    self.logger.log(rec)
                return
            if kind != R_READY or rec is None:
                raise RuntimeError(f"rank {self.rank}: unexpected server reply {kind} after {k} local steps")
            self.t.write_params(delta)
            delta -= global_w                          # model difference of this round (eq. 6)
            t_push = time.time()
            self._push(rnd, k, c, delta)
            kind, hdr = self._reply()
            rec["wait_s"] += time.time() - t_push
            rec["round_steps"] = k
            self.logger.log(rec)


# ---- entry point -------------------------------------------------------------------------------
def run(ctx):
    """Run the PS mode on this rank (collective); rank 0 prints the summary and returns it."""
    from hopdec.metrics import RankLogger
    from hopdec.trainer import TorchBackend, progress_bar, report

    args, comm, rank = ctx.args, ctx.comm, ctx.rank
    policy = ctx.extra.get("ps_policy") or check(ctx)
    n = ctx.size - 1
    sync = policy.sync
    budget = int(ctx.iterations) * n
    settings = dict(bsp={}, asp={}, ssp=dict(staleness=getattr(policy, "s", None)),
                    dssp=dict(staleness_range=[getattr(policy, "s_lower", None),
                                               getattr(policy, "s_upper", None)]),
                    elastic=dict(lookahead=getattr(policy, "R", None)),
                    backup=dict(backup_workers=getattr(policy, "b", None), N=getattr(policy, "N", None)),
                    esync=dict(epsilon=getattr(policy, "epsilon", 0.0)))[sync]
    bound = {"ssp": settings.get("staleness"), "dssp": (settings.get("staleness_range") or [0, None])[1],
             "bsp": 0}.get(sync)
    title = (f"parameter server --sync {sync}"
             + "".join(f" {k}={v}" for k, v in settings.items()) + f" (1 server + {n} workers)")
    if rank == 0:
        trainer = ctx.make_trainer(0, n)
        emulator = None
        header = dict(mode="ps", sync=sync, workers=n, iterations=ctx.iterations, budget=budget,
                      model=ctx.model_name, params=trainer.numel, hparams=ctx.hparams,
                      device=str(ctx.device), seed=args.seed, **settings)
        events = _EventLog(ctx.log_dir, header)
        logger = RankLogger(None, 0)
        bar = progress_bar(ctx, budget, f"hopdec ps {sync}")
        server = Server(ctx, policy, trainer, events, budget, bar)
        comm.Barrier()
        try:
            elapsed = server.serve()
        except PeerTimeout as err:
            _fatal(comm, err)
        bar.close()
        final = server.evals[-1]
        events("summary", elapsed=elapsed, version=policy.version, applied=server.applied,
               dropped=server.dropped, work=server.work, test_loss=final["test_loss"],
               test_acc=final["test_acc"])
        events.close()
        if args.save_models and ctx.log_dir:
            np.save(f"{ctx.log_dir}/params_rank0.npy", trainer.write_params())
        extra = dict(server_updates=policy.version, dropped=server.dropped, elapsed_server=elapsed)
    else:
        w = rank - 1
        trainer = ctx.make_trainer(w, n)
        emulator = ctx.make_emulator(w, n)
        header = dict(mode="ps", sync=sync, worker=w, workers=n, iterations=ctx.iterations,
                      model=ctx.model_name, params=trainer.numel, hparams=ctx.hparams,
                      device=str(ctx.device), emulation=emulator.describe(), seed=args.seed, **settings)
        logger = RankLogger(ctx.log_dir, rank, header=header)
        backend = TorchBackend(trainer, emulator,
                               die_at=args.die_at if getattr(args, "die_rank", None) == rank else None,
                               die_how=getattr(args, "die_how", "exit"))
        runner = WorkerRunner(ctx, trainer, backend, logger, esync=(sync == "esync"))
        comm.Barrier()
        try:
            runner.run()
        except PeerTimeout as err:
            _fatal(comm, err)
        logger.close()
        if args.save_models and ctx.log_dir:
            np.save(f"{ctx.log_dir}/params_rank{rank}.npy", trainer.write_params())
        extra = {}
    if rank == 0 and ctx.log_dir:
        print(f"logs: {ctx.log_dir}/rank*.jsonl", flush=True)
    out = report(ctx, logger, trainer, emulator, title,
                 eval_flat=trainer.write_params() if rank == 0 else None,
                 bound=bound, extra=extra, workers=set(range(1, ctx.size)), model_label="server model",
                 bound_label=f"bound of --sync {sync}")
    if rank == 0:
        print(f"server: {policy.version} updates, {server.dropped} gradients dropped, "
              f"{elapsed:.2f} s", flush=True)
    return out
