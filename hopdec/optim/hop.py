"""``HopOptimizer``: any ``torch.optim`` optimizer, with each step averaged with graph neighbours (Hop).

To the user's code it is a ``torch.optim.Optimizer``: ``param_groups`` (each group its own lr, weight
decay, ...), ``state``, ``zero_grad(set_to_none=...)``, ``step(closure)``, ``state_dict()`` /
``load_state_dict()`` (with the protocol position, so a checkpoint resumes), step and state-dict hooks, and any
``torch.optim.lr_scheduler`` works on it. Under it, one rank runs the same protocol core and worker loop as
``hopdec train`` (:class:`hopdec.hop.worker.Worker`, :func:`hopdec.runtime.hop_loop.worker_loop`), paused
at each ComputeGradient so that the user's loop computes the gradient (Hop Figure 7, parallel graph)::

    opt = HopOptimizer(model, torch.optim.AdamW, lr=3e-4, weight_decay=0.1, topology="ring")
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for xb, yb in my_shard:                   # any number of steps, different on each rank
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step(loss=loss)   # Recv + Reduce with the neighbours, AdamW's step, take tokens, Send the next
        sched.step()
    opt.finish()              # serve the others until every rank is done, agree where to stop
    avg = opt.consensus_model()               # the workers' average, buffers included, on every rank

The API follows PyTorch's ``ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``: the optimizer
must own the parameters' storage (one flat buffer, sent and averaged as one message), so it builds the
inner optimizer itself; an optimizer the user already built can be wrapped too (as Horovod's and BlueFog's
``DistributedOptimizer(optimizer, ...)`` do). See the README's API reference for every argument.
"""

import atexit
import copy
import os
import sys
import time
import warnings
import weakref

import numpy as np
import torch

from hopdec.core import ComputeGradient, Wait
from hopdec.hop.actions import SendParams
from hopdec.errors import ConfigError
from hopdec.optim import assembly, ending, failing, life, stopping
from hopdec.transport.ulfm import fault_tolerant


def _step_never_compiled():
    """Make :meth:`HopOptimizer.step` one ``torch.compile`` never traces: a compiled function calling it
    (PyTorch's "compiling the optimizer" recipe, a whole compiled train step) runs it eagerly -- protocol,
    MPI and the wrapped step -- where Dynamo failed inside hopdec on the buffer's host arrays. Done at the
    first construction, before torch's ``Optimizer.__init__`` wraps the class's step with its hooks (as a
    decorator, ``torch.compiler.disable`` loaded ``torch._dynamo`` at import: a second or more per rank)."""
    if HopOptimizer.__dict__.get("_step_eager"):
        return
    disable = getattr(getattr(torch, "compiler", None), "disable", None)        # (torch >= 2.1)
    if disable is not None:
        HopOptimizer.step = disable(HopOptimizer.__dict__["step"])
    HopOptimizer._step_eager = True


_outside_inference_mode = torch.inference_mode(False)
"""Decorates the methods that drive the protocol: it may create the parameters' next store (a Reduce while
serving, a copy off the wire), and one created under a caller's ``inference_mode()`` (an evaluation around
``consensus_model()``) left the model unable to train."""


_STARTED = weakref.WeakSet()
_TRAINED = weakref.WeakValueDictionary()
"""``id(tensor) -> tensor``: parameters a finished optimizer of this process trained (its workers ended
apart, as decentralized workers do: a next optimizer on them starts from different parameters by design)."""
"""The process's HopOptimizers whose protocol is running (started, not finished): while one waits in
``finish()`` or a consensus call, the others' neighbours may need them (:meth:`HopOptimizer._serve_others`)."""


class _Woken(Exception):
    """Raised out of a wait (an idle hook) when what the caller waits for happened meanwhile."""


def _waker(wake):
    """An idle hook that leaves the wait it runs in (raises :class:`_Woken`) once ``wake()`` is true."""
    def hook():
        if wake():
            raise _Woken()
    return hook


class HopOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose every step also averages parameters with graph neighbours (Hop).

    ``params``: a model (``nn.Module``: its trainable parameters, and its buffers for
    ``average_buffers`` and the consensus model), parameters, parameter groups (dicts), or a
    ``torch.optim.Optimizer`` already built on them (then no ``optimizer_class`` or hyperparameters).
    ``optimizer_class``: the torch optimizer each worker steps with (``torch.optim.AdamW``, ...), built
    with ``**defaults``. The rest is keyword-only (README: "API reference"). Collective: every rank of
    ``comm`` builds it at the same point, with the same settings.
    """

    def __init__(self, params, optimizer_class=None, *, model=None, topology=None, comm=None,
                 protocol="tokens", max_ig=2, compute_graph="parallel", backup_workers=0, staleness=None,
                 stale_reduce="weighted", skip=None, fault_tolerance=False, average_buffers=False,
                 compress="none", local_steps=1, outer_optimizer=None, outer_lr=None, outer_momentum=None,
                 log_dir=None, progress=False, progress_interval=3.0, trace=None, steps=None,
                 consensus_every=None, tensorboard=None, overwrite=False, peer_timeout=120.0,
                 checkpoint_every=None, **defaults):
        from mpi4py import MPI
        self._ready = False
        self.fault_tolerant = bool(fault_tolerance)
        comm = comm or MPI.COMM_WORLD
        if self.fault_tolerant:
            import os
            if comm.Get_size() > 1 and "OMPI_COMM_WORLD_SIZE" in os.environ and \
                    os.environ.get("OMPI_MCA_mpi_ft_enable") != "1":
                raise ConfigError("HopOptimizer: fault_tolerance=True needs mpirun --with-ft ulfm "
                                  "(launch/local.sh --fault-tolerance adds it and the failure detector)")
            from hopdec.runtime.failures import record_started
            record_started()        # (the launcher then knows a job that ends without a word failed)
        if not (isinstance(peer_timeout, (int, float)) and 0 < peer_timeout < float("inf")):
            raise ConfigError(f"HopOptimizer: peer_timeout={peer_timeout!r}: a number of seconds > 0")
        # every rank got here (bounded): the first collective below waited for ever for a rank that hung,
        # or stopped, before building its optimizer
        assembly.arrived(comm, peer_timeout, self.fault_tolerant)
        # this optimizer's own communicator: the messages of another one on the same ranks (a GAN's
        # generator and discriminator) or the script's own never match its receives (they matched: a hang)
        # (fault tolerant: its errors return, and this rank leaves quietly if the others declare it dead)
        comm = fault_tolerant(comm) if self.fault_tolerant else comm.Dup()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._job_size = self.size              # (self.size counts the survivors after a heal)
        # first: what the checks below refuse (on every rank at once, or on one) is one line, printed once,
        # and ends the job (exit code 2), not a traceback per rank or ranks left in a collective
        failing.install(comm)
        # HopOptimizer(model, ...) trains what requires a gradient now; a frozen parameter unfrozen later
        # would train in torch's AdamW(model.parameters()) but has no place in the buffer (see _check_model)
        self._left_out = ([(n, p) for n, p in params.named_parameters() if not p.requires_grad]
                          if isinstance(params, torch.nn.Module) else [])
        inner, model = _inner_optimizer(params, optimizer_class, model, defaults)
        self.model = model
        _step_never_compiled()
        # torch's Optimizer machinery (step hooks, the step patch schedulers rely on); param_groups, state
        # and defaults are the inner optimizer's own (properties: a scheduler's lr reaches it, and they
        # follow it through load_state_dict, which replaces them)
        torch.optim.Optimizer.__init__(self, [{"params": []}], {})
        self.optimizer = inner

        # ---- the tensors that are averaged: parameters (and buffers), in one flat float32 buffer ----
        tracked = _unique([p for g in inner.param_groups for p in g["params"]])
        names = _names(model, tracked, "param_groups")
        buffers = []
        if average_buffers:
            if model is None:
                raise ConfigError("HopOptimizer: average_buffers=True needs the model (pass it as params or "
                                  "model=...)")
            buffers = [b for _, b in model.named_buffers() if b.is_floating_point()]
        life.check_dtypes(tracked + buffers, names + _names(model, buffers, "buffer"), len(buffers))
        from hopdec.ml.trainer import FlatModel
        grads = [p.grad for p in tracked]
        self.flat = FlatModel(tracked, buffers, module=model)
        # the gradients stay the user's, as a torch optimizer finds them: FlatModel gives every parameter a
        # zero .grad view (hopdec train's trainer fills it), and a parameter with a gradient is stepped -- a
        # frozen layer in the groups was decayed by AdamW, a sparse embedding's gradient became dense
        for p, g in zip(tracked, grads):
            p.grad = g
        self.flat.flat.grad = None
        self._tracked = tracked + buffers
        self._names = names + _names(model, buffers, "buffer")
        self._owners = life.owners(model, self._tracked) if model is not None else []
        self.device = self.flat.device
        life.check_same_layout(comm, self._tracked, self._names, float(peer_timeout))

        # ---- the run: topology, protocol, core, transport (hopdec.optim.assembly) ----
        self.timeout = float(peer_timeout)
        self.graph = graph = assembly.resolve_topology(topology, self.size)
        if graph.number_of_nodes() != self.size:
            raise ConfigError(f"HopOptimizer: topology {graph.graph.get('source', topology)} has "
                              f"{graph.number_of_nodes()} workers but the communicator has {self.size} "
                              f"rank{'' if self.size == 1 else 's'}")
        if self.rank == 0:                  # what hopdec train prints of the topology file (a periodic W, ...)
            for note in graph.graph.get("notes", ()):
                warnings.warn(f"HopOptimizer: {note}", UserWarning, stacklevel=failing.user_stacklevel())
        self.cfg, views, notes = assembly.protocol_config(
            protocol, max_ig, compute_graph, backup_workers, staleness, stale_reduce, skip, graph,
            self.fault_tolerant, compress, (local_steps, outer_optimizer, outer_lr, outer_momentum),
            checkpoint_every)
        if self.rank == 0:                  # what hopdec train prints as "note:" (skip max-jump > max_ig, ...)
            from hopdec.runtime.failures import slow_detector_note
            slow = slow_detector_note(self.timeout, self.size, "peer_timeout") if self.fault_tolerant else None
            for note in (*notes, *([f"HopOptimizer: {slow}"] if slow else [])):
                warnings.warn(note, UserWarning, stacklevel=failing.user_stacklevel())
        from hopdec.hop.config import gap_bound
        from hopdec.hop.worker import Worker
        self.core = Worker(views[self.rank], self.cfg)
        self.io = assembly.make_transport(comm, self.core.view, self.flat.numel, self.core.slots, self.timeout,
                                          self.device, self.fault_tolerant, self.cfg.compress)
        self.flat.use_send_storage(self.io.message_floats())        # CPU: sends without a copy
        # local steps: step() is called every inner step, every local_steps-th ends a round (LocalRounds)
        self.rounds = None
        if self.cfg.rounds:
            from hopdec.ml.trainer import LocalRounds, OuterStep
            cfg = self.cfg
            self.rounds = LocalRounds(self.flat, cfg.local_steps, OuterStep(cfg.outer_optimizer, cfg.outer_lr,
                                                                            cfg.outer_momentum), cfg.compute_graph)
        self.bound = gap_bound(graph, self.cfg)
        self._ccomm = comm.Dup()                                     # consensus_model()'s reductions
        self._leaving = ending.LeavingNotes(self._ccomm)             # ranks that ended after finish()
        self.end = ending.EndChannel(comm, self.timeout, self.fault_tolerant)
        self.healer = None
        self._left_behind = []
        if self.fault_tolerant:
            from hopdec.runtime.heal import Healer
            self.healer = Healer(comm, graph, self.core, self.io, self.timeout)

        # ---- what watches it: logs, live progress, trace ----
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"HopOptimizer: steps={steps!r}: the expected steps per rank (for live "
                              f"progress), an integer >= 1, or None")
        self.steps = steps
        expected = None if steps is None else -(-steps // self.cfg.local_steps)    # rounds, for progress
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"
                   and isinstance(v, (int, float, str, bool, tuple, type(None)))} for g in inner.param_groups]
        # (every output checked before any is written: a refused trace left rank files that made the next
        # try "an earlier run's logs")
        watch = assembly.observe_settings(log_dir, progress, progress_interval, trace, consensus_every,
                                          tensorboard, self.rank)
        if watch.consensus_every and not log_dir and not trace:
            raise ConfigError("HopOptimizer: consensus_every needs log_dir (or trace): rank 0 logs the rounds "
                              "there, for hopdec report and plot")
        from hopdec.runtime.metrics import RankLogger
        self._log_dir, self._earlier_logs, self._log_resume = log_dir, None, None
        self._overwrite = bool(overwrite)
        if log_dir is not None:     # (as hopdec train: an earlier run's logs are not replaced unless asked)
            from hopdec.runtime.metrics import check_log_dir
            from hopdec.runtime.setup import check_fresh_log_dir
            try:
                check_fresh_log_dir(log_dir, self.rank, self.size, bool(overwrite))
            except ConfigError as err:      # decided at the first step: a loaded checkpoint of that run
                self._earlier_logs = str(assembly.as_keywords(err))     # continues its logs (_log_start)
            try:
                check_log_dir(log_dir, self.rank)
            except ConfigError as err:
                raise assembly.as_keywords(err) from None
        # one id for every rank's log header (rank 0's), after every rank checked its log: hopdec report
        # refuses a directory whose rank files come from two runs
        import uuid

        from hopdec.transport.collectives import allgather_json
        got = allgather_json(comm, [uuid.uuid4().hex[:12], life.plan_of(graph, self.cfg)], self.timeout,
                             "HopOptimizer(): the run's id")
        life.check_same_plan([g[1] for g in got])
        run_id = got[0][0]
        self.header = assembly.header(graph, self.cfg, skip, self.flat.numel, self.device,
                                      self.io.message_floats(), self.bound, self.fault_tolerant, dict(
                                          driver="hopdec.optim.HopOptimizer", optimizer=type(inner).__name__,
                                          param_groups=groups, iterations=expected, average_buffers=bool(buffers),
                                          run_id=run_id, **({"inner_steps": steps} if self.cfg.rounds else {})))
        self.logger = RankLogger(None, self.rank)         # its file is opened at the first step (_log_start)
        from hopdec.observe import RunObserver
        self.observer = RunObserver(watch, comm, self.timeout, self.logger.event, "worker", range(self.size),
                                    expected, self.header, bound=self.bound, write_params=self.flat.write_params,
                                    numel=self.flat.numel, open_ended=True)   # (steps is only a hint)

        # ---- where the loop stands ----
        self._loop = None                      # the worker loop (a generator), from the first step
        self._resume_at = 0                    # a loaded checkpoint's position
        self._resume_round = None              # ... and where in its round (local steps)
        self._at_compute = False
        self._serving = False                  # True: no gradient (finish(), consensus waits)
        self._waiting = False                  # True: in _serve (another's _serve_others leaves it alone)
        # the serial graph's notes in consensus waits (hopdec.optim.ending): PAUSED k to out-neighbours,
        # NEED k back from one that has sent update k (fault tolerant: none; a heal replaces the channel)
        self._notes = (ending.PausedNotes() if self.cfg.compute_graph == "serial" and self.size > 1
                       and not self.fault_tolerant else None)
        self._paused_at = time.time()          # when the user's loop got control (its compute time)
        self._user = {}                        # iteration -> (compute seconds, loss) of the user's steps
        self._served = set()                   # iterations mixed without a gradient
        self._closure_loss = None
        self._step_error = None                # what the wrapped step raised inside the loop (_applied_step)
        # averaged buffers as sent (see reduce): the forward changes them after the parallel graph's send
        self._sent_buffers = (torch.empty(self.flat.numel - self.flat.numel_params, dtype=torch.float32,
                                          device=self.device) if buffers and self.rounds is None else None)
        self._sent_valid = False
        self._resume_sent = None               # ... as the loaded state dict's rank had sent them (_start)
        self._activity = self._heard = 0        # messages seen while serving (see _serve)
        self.finished = False
        self._stop = None                      # Ctrl-C: where every rank stops (hopdec.optim.stopping)
        self._stopped = False                  # step() raised KeyboardInterrupt there
        self._exit_hook = _register_exit(self)
        failing.mark_built()
        self._group_sizes = [len(g["params"]) for g in self.param_groups]     # (see _check_model)
        self._ready = True

    # ------------------------------------------------------------------ torch.optim.Optimizer
    @_outside_inference_mode
    def step(self, closure=None, *, loss=None):
        """Reduce(k) with the neighbours' iteration-k parameters, the wrapped optimizer's step with the
        gradient of iteration k (``closure``, if given, is passed to it), take tokens, enter k + 1 and send
        its parameters. ``loss``: this step's loss (a float or a tensor), for the logs and live progress.
        Returns the closure's loss, as torch optimizers do.

        Never traced by ``torch.compile`` (:func:`_step_never_compiled`)."""
        if self.finished:
            raise RuntimeError("HopOptimizer: step() after finish(): this rank's training is over")
        if self._stopped:
            raise RuntimeError(f"HopOptimizer: step() after the stop at iteration {self._stop.stop_at}: every "
                               f"rank stopped there (a stop signal); save state_dict() and end, then resume")
        now = time.time()
        failing.resumed()
        self._check_model()
        if self._loop is None:
            self._start()
        k = self.core.iteration
        user = self._user.setdefault(k, [0.0, 0.0, 0, 0])       # compute seconds, loss sum, losses, steps
        user[0] += now - self._paused_at
        user[3] += 1
        if loss is not None:
            user[1] += float(loss.detach() if torch.is_tensor(loss) else loss)
            user[2] += 1
        self._closure_loss = None
        self._closure = closure
        self._serving = False
        r = self.rounds
        if r is not None and r.taken + 1 < r.steps:              # an inner step inside the round
            self._inner_step()
            r.taken += 1
        else:
            self._advance()
        self._check_stop()
        self._hand_back()
        self._paused_at = time.time()
        failed, self._step_error = self._step_error, None
        if self._stop.due(self.core.iteration) and (r is None or r.taken == 0 or r.begun is None):
            self._stopped = True                # every rank is here: its state dict resumes with theirs
            if failed is not None:
                raise failed
            at = self._stop.stop_at
            if r is not None:                   # (positions count rounds; the user's loop counts mini-batches)
                raise KeyboardInterrupt(f"every rank stops at round {at} ({at * r.steps} inner steps, rounds of "
                                        f"local_steps={r.steps})")
            raise KeyboardInterrupt(f"every rank stops at iteration {at}")
        if failed is not None:                  # (see _applied_step)
            raise failed
        return self._closure_loss

    def _check_stop(self):
        """Announce or answer a stop request (an idle hook in every wait too; see hopdec.optim.stopping)."""
        if self._stop is not None and not self.finished:
            self._stop.check(self.core, finished=self.end.done)

    def _inner_step(self):
        """The wrapped optimizer's step (given the step's closure)."""
        closure, self._closure = self._closure, None
        self._closure_loss = self.optimizer.step(closure) if closure is not None else self.optimizer.step()

    def _applied_step(self, iteration):
        """:meth:`_inner_step` inside the worker loop (its ApplyGradient). An exception there -- the closure's
        (an out-of-memory a loop catches to skip the batch), the wrapped optimizer's -- ended the loop's
        generator mid-iteration: every later step() raised a bare StopIteration and finish() could not serve.
        It is kept instead: the iteration goes through without a gradient step (mixed, sent; logged as
        serving) and step() raises it once the rank is between steps again."""
        try:
            self._inner_step()
        except Exception as err:
            self._step_error = err
            self._served.add(iteration)

    def zero_grad(self, set_to_none=True):
        """The wrapped optimizer's ``zero_grad`` (gradients are the user's tensors; nothing else to reset)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        if not self._ready:                    # torch's __init__ (see above)
            return torch.optim.Optimizer.add_param_group(self, param_group)
        raise ConfigError("HopOptimizer: add_param_group() after construction: the parameters live in one "
                          "buffer laid out when the optimizer is built; pass every group to the constructor "
                          "(a frozen layer can be a group with lr=0)")

    def state_dict(self):
        """The wrapped optimizer's ``state_dict()`` plus ``"hop"``: the protocol position (the iteration
        this rank is at between steps) and what it was saved by. Loadable with ``weights_only=True``. Hooks
        registered on this optimizer (``register_state_dict_pre/post_hook``) run as torch runs them, around
        the whole dict; the wrapped optimizer's own run inside its ``state_dict()``."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        out = self.optimizer.state_dict()
        out["hop"] = dict(position=int(self.position), rank=self.rank, ranks=self.size,
                          topology=str(self.graph.graph.get("source")), protocol=self.cfg.protocol)
        if self.logger.path is not None:        # where the log stood: a resume continues it from there
            out["hop"].update(log=os.path.abspath(self.logger.path), log_offset=self.logger.tell(),
                              observed=self.observer.saved())
        if self._sent_valid:            # averaged buffers as sent: a resume sends them so again (_start)
            out["hop"]["sent_buffers"] = self._sent_buffers.detach().cpu().clone()
        r = self.rounds
        if r is not None:               # local steps: where in the round, what it started from, the outer state
            out["hop"].update(local_steps=r.steps, outer=[self.cfg.outer_optimizer, float(self.cfg.outer_lr),
                                                          float(self.cfg.outer_momentum)],
                              round_step=r.taken if r.begun is not None else 0,
                              anchor=r.mid_round_anchor(), outer_momentum=None if r.outer.buf is None
                              else r.outer.buf.detach().clone())
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            hooked = post_hook(self, out)
            if hooked is not None:
                out = hooked
        return out

    def load_state_dict(self, state_dict):
        """Load what :meth:`state_dict` gave (or a plain torch optimizer's state dict: then the protocol
        starts at 0). Call it before the first step: every rank must resume at the same position (the
        first step checks it); together with the model's parameters, training continues as it would have.
        Hooks registered on this optimizer (``register_load_state_dict_pre/post_hook``) run as torch runs
        them: the pre hooks on the whole dict (one may return a new one), the post hooks once it is loaded."""
        if self._loop is not None:
            raise RuntimeError("HopOptimizer: load_state_dict() after the first step(): the protocol is "
                               "running; load checkpoints right after building the optimizer")
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            hooked = pre_hook(self, state_dict)
            if hooked is not None:
                state_dict = hooked
        self._load_state_dict(state_dict)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _load_state_dict(self, state_dict):
        """:meth:`load_state_dict` without the hooks."""
        state_dict = dict(state_dict)
        hop = state_dict.pop("hop", None)
        # (checked before anything is loaded: a refused state dict left the wrapped optimizer holding it)
        if hop is not None:
            if int(hop.get("ranks", self.size)) != self.size or int(hop.get("rank", self.rank)) != self.rank:
                raise ConfigError(f"HopOptimizer: this state dict was saved by rank {hop.get('rank')} of "
                                  f"{hop.get('ranks')}; this is rank {self.rank} of {self.size} (each rank "
                                  f"loads its own checkpoint)")
            # (a state dict without local_steps was saved without rounds: H = 1 and the plain outer step; its
            # position counts rounds of its H, and a mid-round one holds that round's anchor)
            mine = self.cfg.local_steps if self.rounds is not None else 1
            if int(hop.get("local_steps", 1)) != mine:
                raise ConfigError(f"HopOptimizer: this state dict was saved with local_steps="
                                  f"{hop.get('local_steps', 1)}; this optimizer has local_steps={mine}")
            saved = hop.get("outer", None if "local_steps" in hop else ["sgd", 1.0, 0.0])
            outer = ([self.cfg.outer_optimizer, float(self.cfg.outer_lr), float(self.cfg.outer_momentum)]
                     if self.rounds is not None else ["sgd", 1.0, 0.0])
            if saved is not None and list(saved) != outer:
                said = ", ".join(f"{k}={v!r}" for k, v in zip(("outer_optimizer", "outer_lr", "outer_momentum"),
                                                                saved))
                have = ", ".join(f"{k}={v!r}" for k, v in zip(("outer_optimizer", "outer_lr", "outer_momentum"),
                                                               outer))
                raise ConfigError(f"HopOptimizer: this state dict was saved with {said}; this optimizer has "
                                  f"{have}: resume with the outer step it was saved with")
        self.optimizer.load_state_dict(state_dict)
        hop = hop or {}                 # a plain torch optimizer's: position 0 (whatever was loaded before)
        self._resume_at = int(hop.get("position", 0))
        self._log_resume = ((str(hop["log"]), hop.get("log_offset"), hop.get("observed"))
                            if hop.get("log") is not None else None)
        sent = hop.get("sent_buffers")
        self._resume_sent = sent if self._sent_buffers is not None and torch.is_tensor(sent) and \
            sent.numel() == self._sent_buffers.numel() else None
        if self.rounds is not None:
            self.rounds.outer.buf = hop.get("outer_momentum")
            self._resume_round = (int(hop.get("round_step", 0)), hop.get("anchor")) if hop else None

    def _inner_attr(name):
        """``param_groups``, ``state``, ``defaults``: the wrapped optimizer's (torch's ``__init__`` sets
        placeholders before it exists)."""
        def get(self):
            inner = self.__dict__.get("optimizer")
            return getattr(inner, name) if inner is not None else self.__dict__.get("_init_" + name)

        def put(self, value):
            if self.__dict__.get("_ready"):
                raise AttributeError(f"HopOptimizer: cannot set opt.{name}: it is the wrapped optimizer's "
                                     f"(fixed when the optimizer is built)")
            self.__dict__["_init_" + name] = value
        return property(get, put)

    param_groups = _inner_attr("param_groups")
    state = _inner_attr("state")
    defaults = _inner_attr("defaults")
    del _inner_attr

    def __setattr__(self, name, value):
        if name[0] != "_" and self.__dict__.get("_ready") and name in _FIXED | self._hyperparameters():
            what = ("set it in opt.param_groups[i][" + repr(name) + "] (as with any torch optimizer) or use a "
                    "torch.optim.lr_scheduler" if name in self._hyperparameters() else
                    "it is fixed when the optimizer is built; build a new HopOptimizer")
            raise AttributeError(f"HopOptimizer: cannot set opt.{name}: {what}")
        super().__setattr__(name, value)

    def _hyperparameters(self):
        return {k for g in self.optimizer.param_groups for k in g if k != "params"}

    def __repr__(self):
        return (f"HopOptimizer({self.optimizer!r}, topology={self.graph.graph.get('source')}, "
                f"protocol={self.cfg.protocol}, rank {self.rank} of {self.size})")

    # ------------------------------------------------------------------ where it stands
    @property
    def iteration(self):
        """The Hop iteration this rank is at (with iteration skipping it can pass the number of steps)."""
        return self.core.iteration if self._loop is not None else self._resume_at

    @property
    def position(self):
        return self.iteration

    @property
    def checkpoint_due(self):
        """Whether this rank, between two steps, is at a checkpoint iteration of ``checkpoint_every=K``: a
        multiple of K, at the start of its round (with ``local_steps``). Every rank passes each one exactly
        once -- a jump (``skip``) never passes one, as under ``hopdec train --checkpoint-every`` -- so the
        state dicts saved there resume together (:meth:`load_state_dict`, :meth:`common_checkpoint`).
        False without ``checkpoint_every``, and before the first step."""
        every, r = self.cfg.checkpoint_every, self.rounds
        return bool(every) and self._loop is not None and self.core.iteration % every == 0 and \
            (r is None or r.begun != self.core.iteration or r.taken == 0)

    def common_checkpoint(self, iterations):
        """The latest of ``iterations`` (those this rank saved a checkpoint at) that every rank saved too, or
        None: which checkpoint to load before the first step. Collective, bounded by the peer timeout (a
        rank whose files are gone passes ``[]``); before the first step only (a rank waiting in it then would
        serve nobody, and a neighbour waiting for its update never joins it)."""
        if self._loop is not None or self.finished:
            raise RuntimeError("HopOptimizer: common_checkpoint() after the first step: call it right after "
                               "building the optimizer, to choose the checkpoint load_state_dict() loads")
        got = self._allgather(sorted({int(k) for k in iterations}), "common_checkpoint()")
        common = set(got[0]).intersection(*map(set, got[1:]))
        return max(common) if common else None

    @property
    def jumps(self):
        """Iteration-skipping jumps this rank made, ``[(from, to)]`` (Hop sec. 5)."""
        return list(self.core.jumps)

    # ------------------------------------------------------------------ the end
    @_outside_inference_mode
    def finish(self):
        """This rank is done training (collective: every rank calls it, after any number of steps). It
        keeps mixing with its neighbours without a gradient until every rank is done, the ranks agree where
        to stop, and the transport shuts down (:mod:`hopdec.optim.ending`). The model then holds this
        worker's final parameters; :meth:`consensus_model` gives their average."""
        if self.finished:
            return
        failed = failing.failed_exit(sys.exc_info()[1])     # in a finally: that sys.exit(1) passes through
        if failed is not None:
            failing.abort_failed_exit(failed)
        if self._loop is None:
            self._start()
        r = self.rounds
        if r is not None and r.begun is not None and r.taken:
            # the last round was cut short (steps not a multiple of local_steps): it still ends with its
            # exchange and outer step, as hopdec train's shorter last round does -- one more step() without
            # a gradient (a neighbour that finished earlier serves it: this rank's round was sent, so it is ahead)
            serving, self._serving = self._serving, True
            self._advance()
            self._serving = serving
        self.end.announce_done(self._leaving.calls)
        # (self.end read at every call: a heal replaces it, and every survivor that was done says so again)
        self._serve(lambda: self.end.all_done(), "finish(): waiting for the other ranks to finish")  # 2.
        stop = self._among_survivors(                                # 3. (a jump counts with its target)
            lambda abandon: self.end.agree(self.core.position, self._poll, abandon), lambda: self.end.comm)
        serving, self._serving = self._serving, True
        while self.core.iteration < stop:         # 4. catch up to the common stop
            self._advance()
        self._serving = serving
        self.observer.finished(self.core.iteration)
        self._close()
        if self.fault_tolerant:
            from hopdec.runtime.failures import record_finished
            record_finished()       # this rank ended cleanly (the launcher's exit-code file)

    close = finish
    """``HopSGD``'s name for :meth:`finish` (kept)."""

    def _close(self):
        """Shut the transport and the end channel down. Fault tolerant: a rank that dies after the ranks
        agreed where to stop fails the transport's shutdown on every survivor (its barriers): they heal, the
        heal's re-send goes out, and they shut down again on the survivors' communicator -- as ``hopdec
        train``'s runner does."""
        from hopdec.transport.waiting import PeerFailed
        self.finished = True
        _STARTED.discard(self)
        for t in self._tracked:
            _TRAINED[id(t)] = t
        while True:
            try:
                self.io.close()
                break
            except PeerFailed:
                if self.healer is None:
                    raise
                self._heal_waiting()
        self.end.close()
        if self._notes is not None:
            from hopdec.transport.waiting import remove_idle_hook
            remove_idle_hook(self._trade_notes)
        if self._stop is not None:
            from hopdec.transport.waiting import remove_idle_hook
            remove_idle_hook(self._check_stop)
            stopping.release_signals(self)
            self._stop.close()
        self.observer.close()
        self.logger.event("messages", **self.io.counters(), send_stores=self.flat.stores)
        from hopdec.ml import transfers             # what crossed between host and a GPU, if any
        transfers.log_to(self.logger, self.flat.device)
        self.logger.close()
        if not self.fault_tolerant:
            atexit.unregister(self._exit_hook)
            atexit.register(_last_word, self._leaving)      # (see _wait_collective)

    # ------------------------------------------------------------------ the consensus model
    @_outside_inference_mode
    def consensus_state_dict(self, root=None):
        """The average over every worker of the model's state dict: parameters and floating-point buffers
        (BatchNorm statistics) averaged, other buffers (counters) this rank's own. Collective (every rank
        calls it the same number of times); ``root=r``: only rank r gets it (the others get None) -- r in
        the numbering of every hopdec message, the communicator's at construction, also after a heal; a
        root that died: the lowest survivor gets it, so that a script saving it where it is not None still
        does. Safe while updates are in flight: it reduces on a communicator of its own, and a rank that
        waits here keeps its neighbours going (see :mod:`hopdec.optim.ending`). Bounded by the peer timeout."""
        if self.model is None:
            raise ConfigError("HopOptimizer: the consensus model needs the model (pass it as params or model=...)")
        if root is not None and not (isinstance(root, int) and not isinstance(root, bool)
                                     and 0 <= root < self._job_size):
            raise ConfigError(f"HopOptimizer: consensus_model(root={root!r}): root names a rank of the "
                              f"optimizer's communicator, 0 to {self._job_size - 1}")
        if self._loop is None and not self.finished:
            self._start()
        from mpi4py import MPI
        self._leaving.calls += 1                # (the count each rank tells at finish() and as it ends)
        extra = [b for _, b in self.model.named_buffers() if b.is_floating_point()
                 and not any(b is t for t in self._tracked)]

        def reduce(abandon):
            to = None if root is None else self._rank_now(root)
            mine = np.concatenate([self.flat.write_params().astype(np.float64)]
                                  + [b.detach().cpu().double().numpy().reshape(-1) for b in extra])
            # fault tolerant, an all-reduce even for one root: a reduce completes on a rank that has sent its
            # part, which then left, and a root that met a death had nobody to heal and reduce again with
            everyone = to is None or self.fault_tolerant
            total = np.zeros_like(mine) if everyone or to == self._ccomm.Get_rank() else None
            if everyone:
                req = self._ccomm.Iallreduce(mine, total, op=MPI.SUM)
            else:
                req = self._ccomm.Ireduce(mine, total, op=MPI.SUM, root=to)
            self._wait_collective(req, "consensus_model()", abandon)
            return total if to is None or to == self._ccomm.Get_rank() else None
        total = self._among_survivors(reduce, lambda: self._ccomm)
        self._hand_back()                   # (a rank that waited here may have served and sent)
        if total is None:
            return None
        total /= self.size
        from hopdec.ml.trainer import view_like
        values = {}
        n = self.flat.numel
        flat_avg = torch.from_numpy(total[:n].astype(np.float32))
        off = 0
        for t in self._tracked:
            values[id(t)] = view_like(flat_avg[off:off + t.numel()], t)
            off += t.numel()
        off = n
        for b in extra:
            values[id(b)] = torch.from_numpy(total[off:off + b.numel()]).to(b.dtype).view_as(b)
            off += b.numel()
        out = {}
        for name, t in self.model.state_dict(keep_vars=True).items():
            v = values.get(id(t))
            out[name] = (v if v is not None else t.detach().clone()).to(t.device)
        return out

    def _rank_now(self, rank):
        """Rank ``rank`` of the communicator at construction (as every hopdec message and log numbers the
        workers, Healer) in the optimizer's communicator now: the survivors' numbering after a heal; a rank
        that died: the lowest survivor."""
        if self.healer is None or not self.healer.events:
            return rank
        survivors = self.healer.events[-1]["survivors"]     # (in the order of the survivors' ranks)
        return survivors.index(rank) if rank in survivors else 0

    def consensus_model(self, root=None):
        """A copy of the model holding the workers' average (:meth:`consensus_state_dict`), for evaluation
        and saving; ``root=r``: only on rank r (None elsewhere; as :meth:`consensus_state_dict`). Collective."""
        state = self.consensus_state_dict(root)
        if state is None:
            return None
        twin = copy.deepcopy(self.model)
        twin.load_state_dict(state)
        return twin

    def _wait_collective(self, req, what, abandon=None):
        """Wait for ``req`` while the protocol goes on (see :meth:`_serve`); a rank that finished before
        making this call, or whose script ended after fewer calls (:class:`~hopdec.optim.ending.LeavingNotes`),
        is an error at once (it never will make it). Returns early once ``abandon()`` is true (a heal left
        the request's communicator)."""
        call = self._leaving.calls

        def done():
            if abandon is not None and abandon():
                return True
            missing = {r: c for r, c in self.end.finished_ranks().items() if c < call}
            if missing and not self.finished:
                r, c = sorted(missing.items())[0]
                raise RuntimeError(f"HopOptimizer: rank {r} called finish() after {c} {what} call(s) while rank "
                                   f"{self.rank} waits in call {call}: every rank must make the same collective "
                                   f"calls")
            if self.finished:
                gone = {r: c for r, c in self._leaving.heard().items() if c < call}
                if gone:
                    r, c = sorted(gone.items())[0]
                    raise RuntimeError(f"HopOptimizer: rank {r} ended after {c} {what} call(s) while rank "
                                       f"{self.rank} waits in call {call}: every rank must make the same "
                                       f"collective calls")
            return req.Test()
        self._serve(done, what)

    def _may_serve(self, paused=False):
        """Whether a waiting rank advances without a gradient: when a neighbour is known to be ahead
        (:func:`hopdec.optim.ending.neighbour_ahead`); with update queues only (no tokens or ACKs to tell),
        whenever it can; with the serial graph, when an out-neighbour asked (NEED). ``paused``: this rank is
        served by another optimizer's wait (:meth:`_serve_others`): it says it is paused, as in a wait of
        its own."""
        if self._loop is None or self.finished:
            return False
        level = self.end.done and self.cfg.compute_graph == "serial"     # finish(): see hopdec.optim.ending
        if self.cfg.protocol == "queue-only" or ending.neighbour_ahead(self.core, level):
            return True
        if self._notes is not None and self._at_compute and not self.end.done:     # the serial graph's notes
            self._trade_notes()
            k = self.core.iteration
            if self._notes.asked(k):
                return True
            if (self._waiting or paused) and self._notes.announce(k):
                for j in self.core.view.out_neighbors:
                    self.end.note(j, ending.TAG_PAUSED, k)
        return False

    def _trade_notes(self):
        """Take the serial graph's notes that arrived, and answer an in-neighbour paused at an iteration
        whose update this rank has sent (it waits, or will, for that neighbour's): NEED k (an idle hook,
        so in every wait of this process; see :mod:`hopdec.optim.ending`)."""
        if self._loop is None or self.finished or self.end.done:
            return
        self._notes.heard(*self.end.take_notes())
        for j, k in self._notes.answers(self.core.last_sent):
            self.end.note(j, ending.TAG_NEED, k)

    def _serve(self, done, what):
        """Until ``done()``: advance without a gradient while :meth:`_may_serve`, else wait for messages. The
        peer timeout counts silence: any message arriving (an update, a grant, a rank finishing) restarts it,
        so ranks that train for longer are waited for, and a hung one is found."""
        from hopdec.transport.collectives import wait_for_all
        serving, self._serving = self._serving, True
        self._waiting = True

        def wake():                     # (the others are served meanwhile; this wait goes on for them)
            self._serve_others()
            return done() or self.end.failed
        try:
            while not done():
                if self.end.failed:            # a peer died, seen only by the end channel: heal (_poll)
                    self._poll()
                    continue
                if self._may_serve():
                    if self._advance(wake=wake) is None and not self.end.failed:
                        return                                  # woken: done
                    continue
                seen = self._activity
                # (every other rank waited for: one that noticed nothing, hung outside hopdec, is named)
                wait_for_all(self.comm, lambda: self._serve_others() or self._poll() or done() or self._may_serve()
                             or self._activity != seen, self.timeout,
                             lambda: f"rank {self.rank}: {what}: no message from any rank for {self.timeout:.0f} s; "
                                     f"a peer may have died or hung (or trains much longer than this one: raise "
                                     f"peer_timeout)")
        finally:
            self._serving = serving
            self._waiting = False
            if self.end.done:               # the others go back to the user's loop too (see _hand_back)
                for o in list(_STARTED):
                    if o is not self:
                        o._hand_back()

    def _serve_others(self):
        """While this optimizer waits in ``finish()`` (:meth:`_serve`), the process's other running ones (a
        GAN's two) mix without a gradient as their own waits would -- each one starts an iteration only when
        a neighbour is ahead (:meth:`_may_serve`) and goes on with one it started -- without ever blocking:
        a rank whose shard ran out waits in one optimizer's ``finish()`` while a rank still training steps
        the other, and needs this rank's updates of that one. Returns True when one of them moved (activity:
        the wait's peer timeout counts silence), else None.

        Not in a consensus call's wait: this rank trains on after it, and how far each optimizer was served
        there depends on timing -- two optimizers stepped in turn whose iterations then differ by another
        amount on each rank wait on each other (ranks that take different numbers of steps call
        ``finish()`` before ``consensus_model()``, README)."""
        if not self.end.done:
            return None
        moved = None
        for o in list(_STARTED):
            if o is self or o.finished or o._waiting or o._loop is None:
                continue
            o._poll()
            if o._at_compute and not o._may_serve(paused=True):   # (between steps: start only when needed)
                continue
            serving, o._serving = o._serving, True
            before = o._activity, o.core.iteration
            try:
                went = o._advance(wake=lambda: True)            # up to the first wait, never into it
            finally:
                o._serving = serving
            if went or (o._activity, o.core.iteration) != before:
                moved = True
        return moved

    # ------------------------------------------------------------------ driving the protocol
    def _start(self):
        """The first step (or finish): every rank at the same position, then Enter(k), Send(k)."""
        from hopdec.runtime.hop_loop import worker_loop
        append, refused = self._log_start()     # (every rank continues its log, or none: one run)
        mine = [self._resume_at, refused, append, None if self._resume_at else self.flat.digest()]
        # (fault tolerant: a rank that died after building its optimizer, before its first step, fails this
        # on the others -- an MPI_ERR_PROC_FAILED ended the job -- so the survivors heal and start without it)
        got = self._allgather(mine, "HopOptimizer: starting")
        where = [g[0] for g in got]
        if len(set(where)) != 1:
            raise ConfigError(f"HopOptimizer: the ranks start at different positions {where} (the loaded "
                              f"state dicts were saved at different iterations): every rank must load a "
                              f"checkpoint of the same iteration, or none")
        differ = [r for r, g in enumerate(got) if g[3] != got[0][3]]
        if differ and self.rank == 0:           # (a resumed run's workers differ by design: not checked)
            earlier = any(_TRAINED.get(id(t)) is t for t in self._tracked)
            why = ("where an earlier HopOptimizer on these parameters left them (its workers ended apart, as "
                   "decentralized workers do); to start from one model, load its consensus_state_dict() into "
                   "the model first" if earlier else
                   "Hop's workers start from one model, as hopdec train's do; seed the model the same on every "
                   "rank (torch.manual_seed before building it) or load one state dict")
            warnings.warn(f"HopOptimizer: the workers start from different parameters (rank(s) "
                          f"{', '.join(map(str, differ[:8]))}{' ...' if len(differ) > 8 else ''} differ from rank "
                          f"0's): {why}", UserWarning, stacklevel=failing.user_stacklevel())
        self._stop = stopping.AgreedStop(self.comm, self.timeout)     # (collective: every rank, here)
        refusals = [(r, g[1]) for r, g in enumerate(got) if g[1]]
        if refusals:                            # the same line on every rank
            r, text = refusals[0]
            raise ConfigError(text if r == self.rank or text.startswith(f"rank {r}") else f"{text} (on rank {r})")
        if self._log_dir is not None:
            from hopdec.files import trim_log
            if any(g[2] for g in got) and not all(g[2] for g in got):     # (on every rank: the same line)
                raise ConfigError(f"HopOptimizer: log_dir {self._log_dir}: ranks "
                                  f"{', '.join(str(r) for r, g in enumerate(got) if not g[2])} loaded state dicts "
                                  f"saved without these logs, the others with them: load one run's checkpoints")
            append = append and trim_log(*self._log_resume[:2])
            self.logger.open(self._log_dir, dict(self.header, **({"resumed_from": self._resume_at}
                                                                  if self._resume_at else {})), append)
        if self._resume_at:
            self.core.resume_at(self._resume_at)
        if self._resume_round is not None and self._resume_round[0]:     # a round saved mid-way
            self.rounds.resume(self._resume_at, *self._resume_round)
        if self._resume_at:                 # its consensus rounds: from here on, each logged once
            self.observer.resume(self._resume_at, self._log_resume[2] if append else None)
        self.observer.begin()
        stopping.take_signals(self)
        from hopdec.transport.waiting import add_idle_hook
        add_idle_hook(self._check_stop)
        if self._notes is not None:
            add_idle_hook(self._trade_notes)
        self._loop = worker_loop(self.core, self.io, self, on_record=self._on_record,
                                 spans=self.observer.spans, step=True)
        _STARTED.add(self)
        sent, self._resume_sent = self._resume_sent, None
        if sent is not None:
            # a resume with averaged buffers: the loop's first forward has moved them already, but the
            # uninterrupted run sent iteration k's update before that forward -- so it goes out with the
            # buffers as they were sent then (saved in the state dict), and this rank keeps what its
            # forward made of them (reduce() adds that change), as the uninterrupted run did
            bufs = self.flat.values()[self.flat.numel_params:]
            moved = bufs.detach().clone()
            with torch.no_grad():
                bufs.copy_(sent.to(self.device))
        self._advance()                               # Enter(k), Send(k): stop where the gradient is due
        if sent is not None:
            self._off_the_wire()                      # (the store was just sent from)
            with torch.no_grad():
                self.flat.values()[self.flat.numel_params:].copy_(moved)

    def _log_start(self):
        """``(continues, refusal)`` of this rank's log, at the first step (as ``hopdec train --resume``): a
        state dict saved by a run that logged to this same file continues it from where it stood then
        (:func:`hopdec.files.log_continues`), unless ``overwrite=True`` (a new log); otherwise a
        log_dir holding an earlier run's logs is refused (one line)."""
        if self._log_dir is None:
            return False, None
        from hopdec.files import log_continues
        from hopdec.runtime.metrics import log_path
        res, path = self._log_resume, os.path.abspath(log_path(self._log_dir, self.rank))
        if res is not None and not self._overwrite and res[0] == path:
            if log_continues(path, res[1]):
                return True, None
            return False, (f"HopOptimizer: log_dir {self._log_dir}: rank{self.rank}.jsonl cannot be continued "
                           f"from the loaded state_dict() (it is gone or shorter than when it was saved); give "
                           f"a new directory, or overwrite=True to replace the logs")
        if self._earlier_logs is not None:
            return False, (f"{self._earlier_logs}; a resumed run continues them when it loads a state_dict() "
                           f"saved with them")
        return False, None

    def _advance(self, wake=None):
        """Carry out the core's actions up to the next ComputeGradient (returns True). ``wake()``: checked
        in every wait; when true, the wait is left (the loop resumes there next time) and None returned."""
        from hopdec.transport.waiting import PeerFailed, watching
        self._at_compute = False
        hook = None if wake is None else _waker(wake)
        while not self._at_compute:
            a = next(self._loop)
            if not isinstance(a, Wait):
                if isinstance(a, ComputeGradient) and self._serving:
                    self._served.add(a.iteration)
                elif isinstance(a, SendParams):
                    self._sent()
                continue
            if wake is not None and wake():
                return None
            try:
                if hook is None:
                    self.io.wait(self.core, a)
                else:
                    with watching(hook):
                        self.io.wait(self.core, a)
            except _Woken:
                return None
            except PeerFailed:
                if self.healer is None:
                    raise
                self._heal()
        return True

    def _poll(self):
        """Deliver what arrived to the core; count it as a sign of life (see :meth:`_serve`)."""
        live = self._loop is not None and not self.finished
        got = self.io.poll(self.core) if live else 0
        # late updates the core let go of while it is paused between actions: their receive slots must
        # take new updates now -- a done rank waits here to learn that a neighbour is ahead, and with every
        # slot of a sender full it never would (ring, staleness 2, unequal steps: finish() timed out)
        freed = self.core.take_releases() if live else ()
        if freed:
            self.io.release(freed)
        heard = len(self.end.finished_ranks())
        if got or heard != self._heard:
            self._heard = heard
            self._activity += 1
        if self.io.failed or self.end.failed:
            from hopdec.transport.waiting import PeerFailed
            if self.healer is None:
                raise PeerFailed(f"rank {self.rank}: a peer failed")
            self._heal_waiting()

    def _allgather(self, mine, what):
        """Every rank's ``mine`` (JSON), in rank order, before the protocol runs (bounded by the peer
        timeout); fault tolerant, among the survivors of a death it meets (:meth:`_among_survivors`)."""
        from hopdec.transport.collectives import allgather_json
        return self._among_survivors(lambda abandon: allgather_json(self._ccomm, mine, self.timeout, what),
                                     lambda: self._ccomm)

    def _among_survivors(self, collective, comm):
        """``collective(abandon)`` -- a collective call on ``comm()`` that waits with the protocol going on
        and returns early once ``abandon()`` is true -- until it completes on the communicator it was posted
        on; returns its result. Fault tolerant: a rank that died before or during it fails it (or this
        rank's wait heals, replacing ``comm()``): the survivors heal (unless this rank's wait already did)
        and make it again on their communicator. A heal before the call is posted changes nothing: every
        survivor then posts it once, on the new one."""
        from mpi4py import MPI

        from hopdec.transport.mpi import is_peer_failure
        while True:
            c = comm()
            try:
                out = collective(lambda: comm() is not c)
            except MPI.Exception as err:
                if self.healer is None or not is_peer_failure(err, c):
                    raise
                if comm() is c:
                    self._heal_waiting()
                continue
            if comm() is c:
                return out                  # (else healed while waiting: what it did is void)

    def _heal_waiting(self):
        """:meth:`_heal` while this rank waits between actions (finish(), a consensus call). It acts only
        when a neighbour is ahead, and a neighbour level with it waits for the update the heal lost in
        flight: so the core's re-send of it (Worker.reconfigure) goes out now, through the loop (after any
        releases)."""
        self._heal()
        for _ in range(3):
            if self._loop is None or not self.core.catching_up:
                break
            if isinstance(next(self._loop), SendParams):
                self._sent()

    def _heal(self):
        """A peer died (``fault_tolerance=True``): the survivors heal the graph and go on; the consensus and
        end agreements move to the survivors' communicator."""
        event = self.healer.heal()
        self._left_behind.append((self.end, self._ccomm))     # requests of the old communicator: untouched
        self.comm = self.healer.comm
        self._ccomm = self.comm.Dup()
        self._leaving.comm, self._leaving.left = self._ccomm, {}
        done = self.end.done
        self.end = ending.EndChannel(self.comm, self.timeout, self.fault_tolerant)
        if done:
            self.end.announce_done(self._leaving.calls)
        self.size = self.comm.Get_size()
        if self._stop is not None:
            self._stop.moved_to(self.comm)
        self.logger.event("heal", **{k: v for k, v in event.items() if k != "event"})
        self.observer.on_failure(event, self.comm)
        return event

    # ---- the backend interface of hopdec.runtime.hop_loop ----
    def send_storage(self):
        return self.flat.send_storage()

    def spare_stores(self):
        return self.flat.spare_stores()

    def add_store(self):
        return self.flat.add_store()

    def write_params(self, out=None):
        return self.flat.write_params(out)

    def compute(self, iteration):
        self._at_compute = True                        # the user's loop computes; we pause here
        if self.rounds is not None:                    # its inner steps train from here (LocalRounds)
            self.rounds.begin(iteration)
        return {"loss": None, "compute_s": 0.0}

    def _sent(self):
        """An update was just sent: keep its averaged buffers (see :meth:`reduce`)."""
        if self._sent_buffers is not None:
            with torch.no_grad():
                self._sent_buffers.copy_(self.flat.values()[self.flat.numel_params:])
            self._sent_valid = True

    def reduce(self, pairs, into=None):
        """Reduce; with averaged buffers, the forward's change to them since this rank's send goes on top.

        With the parallel graph the update of iteration k is sent before the loop's forward, which moves
        the BatchNorm statistics (spectral_norm's vectors) in place: the neighbours' buffers arrive as
        they were sent, this rank's as the forward left them. Averaged as they stand, the forward's change
        was scaled by this rank's own weight -- running statistics tracked with a third of their momentum
        on a ring, spectral_norm's power iteration slowed -- and identical workers did not track as torch
        does. Like a gradient step, the change is local: ``x <- sum_j w_j b_j(sent) + (b_now - b_sent)``,
        which is the Reduce plus ``(1 - w_self) * (b_now - b_sent)``. (The serial graph sends after the
        forward: no change then. Local steps add the round's changes, buffers included, already.)"""
        f = self.flat
        if not self._sent_valid:
            f.reduce(pairs, into=into)
            return
        self._sent_valid = False
        with torch.no_grad():
            minus = self._sent_buffers.sub_(f.values()[f.numel_params:])       # b_sent - b_now
            f.reduce(pairs, into=into)
            own = sum(w for arr, w in pairs if arr is None)
            f.values()[f.numel_params:].sub_(minus, alpha=1.0 - own)

    def apply(self, iteration):
        if self.rounds is not None:                    # the round's last inner step and its outer step
            self.rounds.end(iteration, None if self._serving else lambda: self._applied_step(iteration))
            return
        if self._serving:                              # mixing without a gradient: no optimizer step
            return
        self._applied_step(iteration)

    def _on_record(self, rec):
        """A finished iteration's record: the user's compute time (between steps, outside hopdec) and loss
        go in as ``compute_s`` and ``loss``; iterations mixed without a gradient say ``serving``."""
        dt, total, count, steps = self._user.pop(rec["iter"], (0.0, 0.0, 0, 0))
        rec["compute_s"] = dt
        rec["loss"] = total / count if count else None
        if self.rounds is not None:
            rec["inner_steps"] = steps
        if rec["iter"] in self._served:
            self._served.discard(rec["iter"])
            rec["serving"] = True
        for span in rec.get("spans", ()):
            if span[0] == "compute":
                span[2] = dt
                break
        self.logger.log(rec)
        self.observer.on_record(rec)

    # ---- the model's life (hopdec.optim.life) ----
    def _check_model(self):
        # add_param_group() refuses; appending to param_groups (the wrapped optimizer's list) went around it
        if [len(g["params"]) for g in self.param_groups] != self._group_sizes:
            raise ConfigError("HopOptimizer: param_groups changed after construction (a group appended to "
                              "opt.param_groups, or parameters to a group's list): the parameters live in one "
                              "buffer laid out when the optimizer is built, so new ones would be stepped but "
                              "never averaged; pass every group to the constructor (a frozen layer can be a "
                              "group with lr=0)")
        for name, p in self._left_out:
            if p.grad is not None:
                raise ConfigError(f"HopOptimizer: {name} has a gradient but is not trained: it had requires_grad="
                                  f"False when HopOptimizer(model, ...) was built, which lays out the trainable "
                                  f"parameters in one buffer; to unfreeze it later, give it to the optimizer from "
                                  f"the start: HopOptimizer(model.parameters(), ..., model=model) (a parameter "
                                  f"without a gradient is not stepped)")
        found = life.changes(self._tracked, [p for _, p in self.flat.expected_pointers()], self._names,
                             self.device, self._owners)
        if not found:
            return
        refused = [c for c in found if not c.can_follow]
        if refused:
            raise ConfigError(refused[0].message())
        if self._loop is not None:                     # the buffer may still be on its way to neighbours:
            self._off_the_wire()                       # the values move to a free store of the pool
        for c in found:
            self._adopt(c)

    def _off_the_wire(self):
        """Make sure the values' store has no send in flight before it is written outside a Reduce: copy
        the values into a free (or new) store of the pool and point at it, as a Reduce would
        (:func:`hopdec.runtime.hop_loop.writable_store`). The pool may hold one store more than the worker
        loop's cap (:func:`hopdec.runtime.hop_loop.store_cap`): the one the user's loop holds, never sent
        from, beside the ``slots`` in flight and the one a Reduce writes -- so neither this copy nor the
        next Reduce waits for a send (at that limit, which the protocol does not reach, it waits for the
        oldest store's sends, as a Reduce at its cap does)."""
        from hopdec.runtime.hop_loop import store_cap, writable_store
        store = self.flat.send_storage()
        if store is None or self.flat._views is not None or self.io.sends_done(store):
            return                                     # (local steps training a copy: it is written)
        spares = self.flat.spare_stores()
        into, _ = writable_store(spares, self.flat, self.io, store_cap(self.core) + 1)
        if into is None:
            into = spares[0]
            self.io.wait_sent(into)
        self.flat.reduce([(None, 1.0)], into=into)

    def _hand_back(self):
        """The model goes back to the user's loop (step() returns, a consensus call ends): its store must
        not be one a send is still reading. With zero-copy sends the values' store was just sent from, and
        a send above the eager limit is read when the receiver gets to it -- so whatever the loop wrote in
        place meanwhile (BatchNorm statistics in the forward with average_buffers, spectral_norm's vectors,
        weight clipping, SAM's perturbation, load_state_dict) reached the neighbours in this send for a
        large model and in the next one for a small one, or torn (an MPI send buffer must not change
        before its send completes). Moved off the wire (one copy, only while a send is in flight), every
        in-place change reaches the neighbours with the next send, whatever the size."""
        if self._loop is not None and not self.finished:
            self._off_the_wire()

    def _adopt(self, change):
        """Follow a tensor the model now holds instead of a tracked one (same shape, dtype, device): its
        values go into the buffer, it becomes the view, and the optimizer's groups and state follow it."""
        old, new = self._tracked[change.slot], change.new
        values = new.detach().clone()
        if new is not old:
            self._tracked[change.slot] = new
            slots = self.flat._params if change.slot < len(self.flat._params) else self.flat._buffers
            i = change.slot if slots is self.flat._params else change.slot - len(self.flat._params)
            slots[i] = new
            for g in self.optimizer.param_groups:
                g["params"] = [new if p is old else p for p in g["params"]]
            if old in self.optimizer.state:
                self.optimizer.state[new] = self.optimizer.state.pop(old)
            self._owners = life.owners(self.model, self._tracked) if self.model is not None else []
        # (p.data = t or p.set_(t): the same tensor on another storage, so it too is pointed back at its slot
        # before the values are copied in -- else they went into the foreign storage and were lost)
        self.flat.repoint()
        with torch.no_grad():
            new.data.copy_(values)


_FIXED = frozenset({"optimizer", "param_groups", "state", "defaults", "model", "flat", "core", "io"})
"""Attributes a user might set expecting an effect that is fixed at construction."""


class HopSGD(HopOptimizer):
    """:class:`HopOptimizer` with ``torch.optim.SGD`` (momentum, dampening, weight decay, Nesterov)."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, dampening=0.0, nesterov=False, **hop):
        super().__init__(params, torch.optim.SGD, lr=lr, momentum=momentum, weight_decay=weight_decay,
                         dampening=dampening, nesterov=nesterov, **hop)


# ---------------------------------------------------------------------- helpers
def _inner_optimizer(params, optimizer_class, model, defaults):
    """(the torch optimizer each worker steps with, the model or None) from the constructor's arguments."""
    if isinstance(params, torch.optim.Optimizer):
        if isinstance(params, HopOptimizer):
            raise ConfigError("HopOptimizer: params is already a HopOptimizer")
        if optimizer_class is not None or defaults:
            raise ConfigError("HopOptimizer: params is an optimizer already built; optimizer_class and "
                              "hyperparameters are its own (got " + ", ".join(
                                  (["optimizer_class"] if optimizer_class is not None else []) + sorted(defaults))
                              + ")")
        return params, model
    if optimizer_class is None:
        raise ConfigError("HopOptimizer: optimizer_class is required: the torch optimizer each worker steps "
                          "with, e.g. HopOptimizer(model, torch.optim.AdamW, lr=3e-4)")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise ConfigError(f"HopOptimizer: optimizer_class={optimizer_class!r} is not a torch.optim.Optimizer "
                          f"class")
    if isinstance(params, torch.nn.Module):
        if model is not None and model is not params:
            raise ConfigError("HopOptimizer: params is a model and model= another one")
        model = params
        params = [p for p in params.parameters() if p.requires_grad]
    elif isinstance(params, torch.Tensor):
        raise ConfigError("HopOptimizer: params is one tensor; pass a model, a list of parameters or of "
                          "parameter groups (as to any torch optimizer)")
    params = list(params)
    if not params:
        raise ConfigError("HopOptimizer: no parameters to train (an empty list, or every parameter has "
                          "requires_grad=False)")
    try:
        return optimizer_class(params, **defaults), model
    except TypeError as err:
        import inspect
        from hopdec.errors import closest
        ours = [k for k, p in inspect.signature(HopOptimizer).parameters.items() if p.kind is p.KEYWORD_ONLY]
        hint = ""
        for key in defaults:          # a mistyped argument of ours reached the inner optimizer
            meant = closest(key, ours) if f"'{key}'" in str(err) else None
            if meant:
                hint = f"; did you mean {meant}= (a HopOptimizer argument)?"
                break
        raise ConfigError(f"HopOptimizer: {optimizer_class.__name__}(...): {err}{hint}") from None


def _unique(tensors):
    out, seen = [], set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _names(model, tensors, what):
    """A readable name per tensor: its name in the model, else ``param_groups[g][i]``-like."""
    known = {}
    if model is not None:
        for name, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers()):
            known.setdefault(id(t), name)
    return [known[id(t)] if id(t) in known else f"{what} tensor {i} ({_shape(t)})" for i, t in enumerate(tensors)]


def _shape(t):
    """``shape (a, b)``, or what stands for it in a lazy module's parameter before its first forward."""
    from torch.nn.parameter import UninitializedTensorMixin
    return "uninitialized" if isinstance(t, UninitializedTensorMixin) else f"shape {tuple(t.shape)}"


def _register_exit(opt):
    """A rank that reaches the end of its script without ``finish()`` finishes there (the others may still
    need it) -- unless it is leaving through ``sys.exit`` with a failure status, which ends the job
    (:mod:`hopdec.optim.failing`). In a job of several ranks the optimizer is held until then: a loop in a
    function that returned (or exited) before its first step dropped it with the frame, and the others
    waited for its start until their peer timeout. Alone (one rank: nothing waits for it), held weakly."""
    ref = (lambda: opt) if opt.size > 1 else weakref.ref(opt)

    def at_exit():
        o = ref()
        if o is not None:                       # sys.exit(1): end the job, do not finish (failing.py),
            failing.end_if_failing()            # also after finish() (fault tolerant: not a death)
        if o is not None and not o.finished and o._ready:
            o.finish()
        if o is not None and o.fault_tolerant:
            _leave_without_finalize()
    atexit.register(at_exit)
    return at_exit


def _last_word(leaving):
    """At the exit of a rank whose optimizer finished (not fault tolerant): a failing ``sys.exit`` ends the
    job with its one line and code -- the others may wait for this rank in a consensus call, and would
    otherwise report only that it left after fewer calls -- else the :class:`~hopdec.optim.ending.
    LeavingNotes`."""
    failing.end_if_failing()
    leaving.say()


def _leave_without_finalize():
    """``fault_tolerance=True``: Open MPI 5.0 cannot finalize after a failure (it waits for the dead), and
    with its threaded failure detector not even without one (:func:`hopdec.cli.train._finish`); so the
    process ends here, before mpi4py's MPI_Finalize, with exit code 0 -- after ending the ranks declared
    dead that still exist (stopped, hung), for which ``mpirun`` would otherwise wait forever
    (:func:`hopdec.runtime.failures.end_dead_ranks`)."""
    import os
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        from hopdec.runtime.failures import end_dead_ranks
        end_dead_ranks()
    except Exception:                       # leaving must not fail: the launcher's own timeout remains
        pass
    os._exit(0)
