"""Watching a run: live progress, consensus distance, TensorBoard, a timeline trace.

The runners (:mod:`hopdec.runtime.hop_mpi`, :mod:`hopdec.runtime.ps_mpi`) make one :class:`RunObserver`
per rank and call a few hooks: :meth:`~RunObserver.begin` when training starts, :meth:`~RunObserver.on_record`
with every iteration record (after the log has it), :meth:`~RunObserver.event` with the PS server's
events, :meth:`~RunObserver.finished` when the rank's training is over, :meth:`~RunObserver.close` after
the transport's shutdown. Observers only read: no protocol decision is taken here, and nothing they do
waits for another rank while training runs (their messages are tested between polls of the waits the
rank makes anyway, :func:`hopdec.transport.waiting.add_idle_hook`).

The time spent in these hooks is measured on every rank and logged (``observer`` event), so every run
says what watching it cost.
"""

import os
import time


class RunObserver:
    """One rank's observers. ``role``: ``worker`` (decentralized), ``ps-server`` or ``ps-worker``.

    Collective: every rank of ``comm`` constructs it at the same point (it duplicates the communicator
    for its own messages).
    """

    def __init__(self, settings, comm, timeout, log_event, role, workers, iterations, header, bound=None,
                 write_params=None, numel=None, board_extra=None, evaluate=None, open_ended=False):
        """``settings``: :class:`hopdec.settings.Observe`; ``timeout``: the peer timeout of every wait;
        ``open_ended``: nobody knows where the run ends (a user's loop: ``iterations`` is only what live
        progress expects), so consensus rounds come every K iterations with no end round;
        ``log_event(name, **data)`` writes a line into this rank's log (``RankLogger.event``);
        ``evaluate()``: makes a function ``flat -> (loss, accuracy)`` with a model of its own, with which
        rank 0 evaluates the average model of consensus rounds every ``--eval-interval`` seconds
        (decentralized runs with ``--consensus-every``)."""
        self.settings, self.comm, self.timeout = settings, comm, timeout
        self.log_event, self.role = log_event, role
        self.rank = comm.Get_rank()
        self.workers, self.n, self.header, self.bound = tuple(workers), iterations, header, bound
        self.hook_s = 0.0                  # in on_record/event: on the rank's own path
        self.idle_s = 0.0                  # in the idle hook: while the rank waits anyway
        self.idle_calls = 0
        self._idle_next = 0.0
        self.records = 0
        self.progress = self.consensus = self.tb = None
        self.trace_path = settings.trace
        self.kept = [] if self.trace_path else None
        self.events = [] if self.trace_path and self.rank == 0 else None
        self._interval = float(settings.every_s)
        self._want_progress = settings.progress
        self._board_extra = board_extra
        self._comms = []
        if self._want_progress:
            self._pcomm = self._dup(comm)
        every = settings.consensus_every
        if every and role == "worker":
            from hopdec.observe.consensus import Consensus
            on_result = self._consensus_result if self.rank == 0 else None
            self._eval_every = float(settings.eval_interval or 0.0)
            self._next_eval = -1.0
            on_average = None
            if self.rank == 0 and self._eval_every > 0 and evaluate is not None:
                self._evaluate = evaluate()          # a model of its own: the worker's may be in flight
                on_average = self._on_average
            self.consensus = Consensus(self._dup(comm), self._dup(comm), every,
                                       None if open_ended else iterations, numel, write_params,
                                       on_result=on_result, timeout=timeout, on_average=on_average)
        tb_dir = settings.tensorboard
        if tb_dir:
            from hopdec.observe.tensorboard import TBWriter
            self.tb = TBWriter(tb_dir, self.rank, role)
        self.spans = bool(self.trace_path) and role == "worker"

    def _dup(self, comm):
        c = comm.Dup()
        self._comms.append(c)
        return c

    # ---- hooks the runner calls ----
    def begin(self, t0=None):
        """Training starts now (after the start barrier)."""
        from hopdec.observe.progress import LiveProgress
        from hopdec.transport.waiting import add_idle_hook
        self.t0 = time.time() if t0 is None else t0
        if self._want_progress:
            self.t0 = self._common_start(self.t0)
            self.progress = LiveProgress(self._pcomm, self.workers, self.n, self._interval, self.t0,
                                         bound=self.bound, board_extra=self._board_extra,
                                         timeout=self.timeout,
                                         what=self._counted())
        if self.progress is not None or self.consensus is not None:
            add_idle_hook(self._idle)

    def _counted(self):
        """What the progress lines count: a PS run's mini-batches, a --local-steps run's rounds (the header
        says H; "iter 4 of 15" read as 4 of the 15 mini-batches asked for, where 60 were), else iterations."""
        if self.role != "worker":
            return "mini-batch"
        return "round" if isinstance(self.header, dict) and self.header.get("local_steps") else "iter"

    def _common_start(self, t0):
        """Rank 0's start time on every rank (one Ibcast right after the start barrier), so that the
        progress grid's instants are the same for everyone (ranks leave a barrier at different times)."""
        import numpy as np

        from hopdec.transport.waiting import poll_until
        buf = np.array([t0])
        req = self._pcomm.Ibcast(buf, root=0)
        poll_until(req.Test, self.timeout, f"rank {self.rank}: the start time did not arrive from rank 0 "
                                           f"in {self.timeout:.0f} s")
        return float(buf[0])

    def on_record(self, rec):
        t = time.perf_counter()
        self.records += 1
        now = time.time()
        if self.consensus is not None:
            nxt = rec["jump"][1] if "jump" in rec else rec["iter"] + 1
            self._guard(lambda: (self.consensus.enter(nxt, now), self.consensus.poll()))
        if self.progress is not None:
            self._guard(lambda: self.progress.on_record(rec, now))
        if self.tb is not None:
            self.tb.record(rec)
        if self.kept is not None:
            self.kept.append(rec)
        self.hook_s += time.perf_counter() - t

    def event(self, name, **data):
        """A server event (PS mode: ``apply``, ``drop``, ``note``, ...) or a failure to show."""
        t = time.perf_counter()
        if self.events is not None:
            self.events.append(dict(event=name, **data))
        if self.tb is not None:
            self.tb.event(name, data)
        self.hook_s += time.perf_counter() - t

    IDLE_EVERY_S = 0.005

    def _idle(self):
        t = time.perf_counter()
        if t < self._idle_next:          # at most every 5 ms: the waits poll far more often than that
            return
        self._idle_next = t + self.IDLE_EVERY_S
        self.idle_calls += 1
        if self.consensus is not None:
            self._guard(self.consensus.poll)
        if self.progress is not None and self.rank == 0:
            self._guard(self.progress.poll)
        self.idle_s += time.perf_counter() - t

    def _guard(self, fn):
        """Run an observer's MPI step; a peer's failure (fault tolerance) stops the observers that talk to
        other ranks -- the transport finds the failure too and the survivors heal -- never the run."""
        try:
            fn()
        except Exception as err:
            if getattr(err, "Get_error_class", None) is None:
                raise
            self._stop_cross_rank()

    def _stop_cross_rank(self):
        from hopdec.transport.waiting import remove_idle_hook
        remove_idle_hook(self._idle)
        self._stale = getattr(self, "_stale", []) + [self.progress, self.consensus, self._comms]
        self.progress = self.consensus = None
        self._comms = []

    # ---- checkpoints (hopdec.runtime.resume, HopOptimizer.state_dict) ----
    def saved(self):
        """What a checkpoint keeps of the observers, so that a resumed run that continues the logs writes
        each consensus round and evaluation once: rank 0's last round logged and the size of ``eval.jsonl``
        then (the all-reduce mode's evaluations are written there too)."""
        if self.rank != 0:
            return {}
        out = {} if self.consensus is None else {"consensus_logged": self.consensus.logged}
        path = self._eval_path()
        if path is not None and os.path.isfile(path):
            out["eval_bytes"] = os.path.getsize(path)
        return out

    def resume(self, start, saved=None):
        """The run resumes at iteration ``start``; ``saved``: :meth:`saved` of the checkpoint when the run
        continues its logs (None: new logs, every round from ``start`` on is logged)."""
        saved = saved or {}
        if self.consensus is not None:
            self.consensus.resume(start, saved.get("consensus_logged"))
        path = self._eval_path()
        if path is not None and saved.get("eval_bytes") is not None:
            from hopdec.files import trim_log
            trim_log(path, saved["eval_bytes"])         # rows of the rounds lost with the saved run

    def _eval_path(self):
        return os.path.join(self.settings.log_dir, "eval.jsonl") if self.settings.log_dir else None

    def _on_average(self, xbar, at):
        now = time.time()
        if at != self.n and now < self._next_eval:
            return None
        self._next_eval = now + self._eval_every
        loss, acc = self._evaluate(xbar)
        return dict(test_loss=loss, test_acc=acc)

    def _consensus_result(self, ev):
        if "test_acc" in ev and self.settings.log_dir:
            import json

            from hopdec.files import writing
            path = self._eval_path()
            with writing(path, "a") as f:
                f.write(json.dumps(dict(time=ev["time"], at=ev["at"], test_loss=ev["test_loss"],
                                        test_acc=ev["test_acc"], final=ev["end"],
                                        model="average of every worker's parameters")) + "\n")
        self.log_event("consensus", **ev)
        if self.events is not None:
            self.events.append(dict(event="consensus", **ev))
        if self.tb is not None:
            self.tb.consensus(ev)

    def on_failure(self, event, comm=None):
        """Workers died and the survivors healed (``--fault-tolerance``); ``comm``: the survivors'
        communicator (the trace is gathered on it). The progress and consensus messages travel on
        duplicates of the old communicator, which holds the dead: they stop (a line says so), their
        requests are left alone; the failure goes to the trace and TensorBoard."""
        if comm is not None:
            self.comm = comm
        self.event("failure", **{k: v for k, v in event.items() if k != "event"})
        self._stop_cross_rank()
        if self.rank == 0 or event.get("survivors", [None])[0] == self.rank:
            print(f"hopdec: rank(s) {', '.join(map(str, event['failed']))} failed; {len(event['survivors'])} "
                  f"survivors go on (live progress and consensus distance stop here; the logs go on)",
                  flush=True)

    def finished(self, last_iteration=None):
        """This rank trained its last iteration; call before the transport's shutdown."""
        if self.progress is not None:
            self.progress.finished(self.n - 1 if last_iteration is None else last_iteration)

    def close(self):
        """After the transport's shutdown: finish the reductions, take the last progress reports, write
        the trace (rank 0 gathers every rank's records), log what observing cost. Collective."""
        from hopdec.transport.waiting import remove_idle_hook
        remove_idle_hook(self._idle)
        t = time.perf_counter()
        if self.consensus is not None:
            self.consensus.close()
        if self.progress is not None:
            self.progress.close()
        close_s = time.perf_counter() - t
        cost = dict(hook_s=round(self.hook_s, 6), idle_s=round(self.idle_s, 6), idle_calls=self.idle_calls,
                    close_s=round(close_s, 6), records=self.records,
                    per_record_ms=round(1e3 * self.hook_s / max(self.records, 1), 4),
                    progress=self.progress is not None, consensus=self.consensus is not None,
                    tensorboard=self.tb is not None, trace=bool(self.trace_path))
        self.log_event("observer", **cost)
        if self.tb is not None:
            self.tb.close()
        if self.trace_path:
            self._write_trace()
        for c in self._comms:
            c.Free()
        self._comms = []
        return cost

    def _write_trace(self):
        from hopdec.transport.collectives import gather_json
        everyone = gather_json(self.comm, dict(rank=self.rank, header=self.header, records=self.kept),
                               self.timeout, "gathering the trace")
        if self.rank != 0:
            return
        from hopdec.report.trace import write_trace
        from hopdec.report.data import Run
        run = Run.from_parts(self.header, {p["rank"]: p["records"] for p in everyone},
                             {0: self.events or []}, label=self.trace_path)
        write_trace(run, self.trace_path)
        print(f"trace: {self.trace_path} (open it in ui.perfetto.dev or chrome://tracing)", flush=True)
