"""Checkpoint, resume and clean stop for the two MPI runners: what ``runtime/hop_mpi.py`` and ``runtime/ps_mpi.py``
call (the files are :mod:`hopdec.runtime.checkpoint`, the stop :mod:`hopdec.runtime.interrupt`).

* :func:`with_checkpoint_defaults` / :func:`plan` -- during setup, a resumed run takes ``--iterations`` and
  ``--checkpoint-every`` from its checkpoint when not given, a fresh ``--checkpoint-dir`` must hold no
  other run's; at ``--resume D`` the ranks exchange their manifests and agree on the latest cut every
  rank has (one line and exit 2 otherwise, like any setup error).
* :class:`HopRank` -- one decentralized rank: resumes its core at Enter(K) with its trainer's state,
  checkpoints where :mod:`hopdec.hop.cuts` says (before Send(K): a cut with nothing in flight, see
  :meth:`hopdec.hop.worker.Worker.resume_at`) and at the end, and takes part in a stop.
* :class:`PSRank` -- the parameter server or one PS worker: saves at the cuts the server core decides.
"""

import contextlib
import math
import os
import time
from dataclasses import replace

from hopdec.errors import ConfigError
from hopdec.hop.cuts import checkpoint_due, oldest_needed
from hopdec.ps.server import work_budget
from hopdec.runtime import checkpoint as C
from hopdec.runtime import interrupt


# ---- options and the resume plan -------------------------------------------------------------------------
def with_checkpoint_defaults(settings, rank):
    """The settings of a run on this rank, checked against its checkpoint directory (reads files, no torch):
    a resumed run takes ``--iterations`` and ``--checkpoint-every`` from the checkpoint when they were not
    given; a fresh ``--checkpoint-dir`` must not hold another run's checkpoints."""
    ck, work = settings.checkpoints, settings.work
    if ck.resume is None:
        if ck.dir is not None:
            C.check_fresh(ck.dir, rank)
        return settings
    man = C.read_manifest(ck.resume, rank)
    if man is None:
        return settings
    changes = {}
    # the run's --iterations: its rounds' inner steps with --local-steps (the manifest's "iterations"
    # counts the core's iterations, rounds then)
    steps = man.get("inner_steps", man.get("iterations"))
    if work.iterations is None and work.epochs is None and isinstance(steps, int):
        changes["work"] = replace(work, iterations=steps)
    if ck.every is None and isinstance(man.get("checkpoint_every"), int) and man["checkpoint_every"]:
        changes["checkpoints"] = replace(ck, every=man["checkpoint_every"])
    return settings.replace(**changes) if changes else settings


def plan(ctx, settings, timeout):
    """At ``--resume D``: the cut to start from, the same on every rank (collective; ConfigError, the same
    on every rank, when there is none to use). Without ``--resume``: None."""
    from hopdec.transport.collectives import allgather_json
    d = ctx.settings.checkpoints.resume
    if d is None:
        return None
    mine = C.summary(d, ctx.rank)
    everyone = allgather_json(ctx.comm, mine, timeout, "reading the checkpoints' manifests")
    key, info = C.choose(d, everyone, ctx.size, settings, ctx.settings.checkpoints.resume_at)
    man = C.read_manifest(d, ctx.rank)
    return dict(dir=d, key=key, manifest=man, entry=man["complete"][str(key)], info=info)


def _store(ctx, target, extra=None):
    ck = ctx.settings.checkpoints
    if ck.directory is None:
        return None
    res = ctx.resume
    return C.RankCheckpoints(ck.directory, ctx.rank, ctx.size, ctx.settings.mode, ctx.fingerprint, ck.every or 0,
                             target, extra=extra, previous=res["manifest"] if res else None,
                             resumed=res["key"] if res else None)


def open_log(ctx, path):
    """Before a resumed run opens its log: cut it back to where it was at the cut, so records continue
    (True: append to it). Another --log-dir, or no log then: a new log (False)."""
    res = ctx.resume
    if res is None or path is None:
        return False
    entry = res["entry"]
    if entry.get("log") != os.path.abspath(path):
        return False
    from hopdec.files import trim_log
    return trim_log(path, entry.get("log_offset"))


def _log_info(logger):
    if logger is None or getattr(logger, "path", None) is None:
        return {}
    return {"log": os.path.abspath(logger.path), "log_offset": logger.tell()}


def _stopped_line(ctx, where, signum, saved):
    cause = f" ({interrupt.signal_name(signum)})" if signum else ""
    if saved:
        d = ctx.settings.checkpoints.directory
        return (f"stopped {where}{cause}; checkpoint in {d}; resume with: "
                f"{C.resume_command(ctx.settings.argv, ctx.size, d)}")
    return f"stopped {where}{cause}; no checkpoint to resume from (--checkpoint-dir D writes one)"


def restore(trainer, directory, rank, manifest, key, stepped=False):
    """Load rank ``rank``'s checkpoint ``key`` into ``trainer``; ``(arrays, meta)``. What does not fit this
    run's model (a shape, an RNG state of another size) is a ConfigError naming the file (exit 2), and so is,
    with ``stepped`` (the rank stepped its own optimizer before this checkpoint), a missing optimizer state
    (resumed, its momentum would have started again from zero without a word)."""
    arrays, meta = C.load(directory, rank, manifest, key)
    path = C.path_of(directory, rank, manifest, key)
    missing = [k for k in (trainer.stepped_state() if stepped else ()) if k not in arrays]
    if missing:
        raise ConfigError(f"{path}: refused: it has no {', '.join(missing)} (the optimizer's state after {key} "
                          f"iterations: a damaged or edited file)")
    try:
        trainer.load_state(arrays)
    except (ConfigError, ValueError, TypeError, KeyError, RuntimeError) as err:
        msg = " ".join(str(err).split())[:300]
        raise ConfigError(f"{path}: refused: it does not fit this run "
                          f"({msg if isinstance(err, ConfigError) else f'{type(err).__name__}: {msg}'})") from None
    return arrays, meta


# ---- decentralized ----------------------------------------------------------------------------------------
class HopRank:
    """Checkpoint, resume and stop for one rank of the decentralized runner."""

    def __init__(self, ctx, core, trainer, gap_bound):
        self.ctx, self.core, self.trainer = ctx, core, trainer
        self.every = ctx.settings.checkpoints.every or 0
        self.gap = gap_bound if gap_bound is not None and math.isfinite(gap_bound) else None
        self.target = ctx.iterations
        rounds = getattr(getattr(ctx.run, "cfg", None), "rounds", False)    # (the all-reduce mode has none)
        self.store = _store(ctx, self.target, {"inner_steps": ctx.run.work.iterations} if rounds else None)
        # with local steps, each checkpoint records the inner steps taken by its round (a run's last round
        # may be short: a resume goes on from that inner step, hopdec.runtime.setup.continue_run)
        self.work_at = ctx.run.inner_steps_at if rounds else None
        res = ctx.resume
        self.start = 0
        if res is not None:
            self.start = res["key"]
            restore(trainer, res["dir"], ctx.rank, res["manifest"], self.start,
                    stepped=self.start > 0 and not rounds)      # (every rank steps its optimizer each iteration)
            core.resume_at(self.start)
        self.channel = interrupt.StopChannel(ctx.comm, ctx.timeout)
        self._in_wait = False
        self.saved_final = False
        self.observer = None

    def header(self):
        return {"run_id": self.ctx.run_id, **({"resumed_from": self.start} if self.start else {})}

    def watched_by(self, observer, continues_log):
        """``observer`` (:class:`hopdec.observe.RunObserver`): each checkpoint keeps what it logged; a resumed
        run tells it where it starts (and, when it continues the logs, what the checkpoint kept)."""
        self.observer = observer
        if self.start:
            observer.resume(self.start, self.ctx.resume["entry"].get("observed") if continues_log else None)

    # ---- during training ----
    @contextlib.contextmanager
    def running(self):
        """Inside: every wait looks for a stop request."""
        from hopdec.transport.waiting import watching
        with watching(self._watch):
            yield

    @contextlib.contextmanager
    def wakeable(self):
        """Around the core's wait: a stop agreed meanwhile ends the wait (the core is asked again)."""
        self._in_wait = True
        try:
            yield
        except interrupt.Woken:
            pass
        finally:
            self._in_wait = False

    def _watch(self):
        self._check(peers=True)

    def _check(self, peers):
        if self.channel.stop_at is not None or (not peers and interrupt.requested() is None):
            return
        stop_at = self.channel.check(self.core.position, finished=self.finished)
        if stop_at is not None and not self.finished:
            self.core.stop_at(stop_at)
            if self._in_wait:
                raise interrupt.Woken()

    def after(self, action, logger):
        """Called after each action the core's loop carried out (``step=True``)."""
        from hopdec.hop.actions import Enter
        if isinstance(action, Enter):
            k = action.iteration
            if self.store is not None and checkpoint_due(k, self.every, self.start, self.core.budget):
                self._save(k, logger, "periodic")
            self._check(peers=True)
        else:
            self._check(peers=False)

    finished = False

    def finish(self, logger):
        """The core is finished: the final checkpoint at Enter(budget) (what ran is complete)."""
        self.finished = True
        k = self.core.budget
        if self.store is not None and k > self.start:
            self._save(k, logger, "stop" if self.stopped else "end")
            self.saved_final = True

    def _save(self, k, logger, cause):
        seen = self.observer.saved() if self.observer is not None else {}
        self.store.save(k, self.trainer.state(), dict(iteration=k, cause=cause, **_log_info(logger),
                                                      **({"work": self.work_at(k)} if self.work_at else {}),
                                                      **({"observed": seen} if seen else {})))
        self.store.forget_before(oldest_needed(k, self.every, self.gap, self.store.keys))

    def rehome(self, comm):
        """After a heal (``--fault-tolerance``): the stop agreement goes on among the survivors, and no
        checkpoint is deleted any more -- the ranks that died have none newer, so a resume goes back to
        the latest one every rank of the original run has."""
        self.channel = self.channel.moved_to(comm)
        self.gap = None

    @property
    def stopped(self):
        """A stop ended the run before its last iteration."""
        return self.channel.stop_at is not None and self.core.budget < self.target

    def close(self):
        self.channel.close()

    def report_stop(self):
        """After a stop: every rank has saved (io.close() passed its barriers); rank 0 says so."""
        if self.ctx.rank == 0:
            where = f"at iteration {self.core.budget} of {self.target}"
            if self.work_at is not None:        # --local-steps: the core's iterations are rounds
                where = (f"at round {self.core.budget} of {self.target} ({self.work_at(self.core.budget)} of "
                         f"{self.ctx.run.work.iterations} inner steps)")
            saved = self.saved_final or (self.store is not None and self.start > 0)   # or the resumed one
            if self.core.budget == 0:
                interrupt.announce(f"stopped before the first iteration "
                                   f"({interrupt.signal_name(self.channel.signum)}); nothing to resume")
            else:
                interrupt.announce(_stopped_line(self.ctx, where, self.channel.signum, saved))
        return None


# ---- parameter server ---------------------------------------------------------------------------------------
class PSRank:
    """Checkpoint, resume and stop for the parameter server (rank 0) or one of its workers."""

    def __init__(self, ctx, trainer):
        self.ctx, self.trainer = ctx, trainer
        self.target = ctx.iterations
        self.store = _store(ctx, self.target)
        self.resume = ctx.resume
        self.state = None
        if self.resume is not None:
            arrays, meta = restore(trainer, self.resume["dir"], ctx.rank, self.resume["manifest"],
                                   self.resume["key"])
            self.arrays, self.state = arrays, meta
        self.notified = False
        self.signum = None

    @property
    def checkpoints(self):
        return self.store is not None

    def header(self):
        return {"run_id": self.ctx.run_id, **({"resumed_from_cut": self.resume["key"]} if self.resume else {})}

    # ---- server ----
    def resume_server(self, core, io):
        """Restore the server core's books and the pushed gradients it had not used yet; sends go out."""
        if self.state is None:
            return False
        state = self.state["state"]
        for w in sorted(int(w) for w in state["core"]["pending_step"]):
            io.restore_pushed(w, self.arrays[f"pending/{w}"])
        core.resume(state["core"], time.time(), shift=time.time() - float(state["saved_at"]))
        return True

    def save_server(self, core, io, action, logger):
        arrays = self.trainer.state()
        for w in core.pending_step:
            arrays[f"pending/{w}"] = io.pushed(w).copy()
        self.store.save(action.cut, arrays, dict(cut=action.cut, version=action.version, work=action.work,
                                                 final=action.final, **_log_info(logger)),
                        state=dict(core=core.state(), saved_at=time.time()))
        self.store.forget_before(action.keep_from, keep=action.pin)

    def server_watch(self, core):
        def watch():
            s = interrupt.requested()
            if s is not None and not core.stopping:
                self.signum = self.signum or s
                core.request_stop()
        return watch

    def on_stop_notice(self, core, signum):
        """A worker was asked to stop (its signal number)."""
        self.signum = self.signum or signum or None
        core.request_stop()

    # ---- worker ----
    def resume_worker(self, core):
        if self.state is not None:
            core.resume(self.state["iteration"], self.resume["key"])

    def save_worker(self, core, action, logger):
        last = action.cuts[-1]
        self.store.save(last, self.trainer.state(), dict(cut=last, iteration=core.iteration,
                                                         **_log_info(logger)), also=action.cuts[:-1])
        self.store.forget_before(action.keep_from, keep=action.pin)

    def worker_watch(self, io):
        def watch():
            s = interrupt.requested()
            if s is not None and not self.notified:
                self.notified = True
                io.notify_stop(s)
        return watch

    # ---- the end ----
    def outcome(self, core=None):
        """Rank 0's view of how the run ended, shared with every rank (collective)."""
        from hopdec.transport.collectives import allgather_json
        mine = None
        if core is not None:
            mine = dict(stopped=bool(core.interrupted), work=core.work, version=core.policy.version,
                        budget=work_budget(self.target, core.policy.n), signum=self.signum, saved=self.checkpoints,
                        cut=core.cuts)
        return allgather_json(self.ctx.comm, mine, self.ctx.timeout, "how the run ended")[0]

    def report_stop(self, end):
        if self.ctx.rank == 0:
            where = (f"after {end['work']} of {end['budget']} mini-batches (server version {end['version']})")
            interrupt.announce(_stopped_line(self.ctx, where, end["signum"], end["saved"]))
        return None

