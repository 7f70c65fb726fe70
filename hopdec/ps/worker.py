"""A parameter-server worker's protocol core, sans I/O: plain SGD push/pull, or ESync's local steps.

Plain SGD (BSP, ASP, SSP, DSSP, ElasticBSP, backup workers)::

    Wait(weights) -> LoadWeights(v) -> ComputeGradient(i) -> PushGradient(v, i) -> Wait(weights) -> ...

ESync (ESync Algorithm 1 with blocking state queries, sec. 4.1): every round starts from the server's
weights (kept, to form the difference later), then asks before each local step whether to go on::

    Wait(weights) -> LoadWeights(r, keep) -> QueryState(r, 0) -> Wait(answer)
        NOT-READY -> ComputeGradient(i) -> ApplyGradient(i) -> QueryState(r, k) -> Wait(answer) ...
        READY     -> PushDelta(r, k) -> Wait(weights)

The paper's RUN-BATCH-DATA-TEST is not run: until a device reports its first step time the server counts
it as the slowest (see :class:`hopdec.ps.sync.esync.ESyncPolicy`). A stop from the server ends either loop.

Checkpoints: a message from the server carries the latest cut (see :class:`hopdec.ps.server.Server`); when
it is newer than the last one this worker saved, the worker saves its state first (:class:`SaveCheckpoint`)
-- it has been waiting since the cut, so that is its state at the cut.
"""

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait
from hopdec.ps.actions import LoadWeights, PushDelta, PushGradient, QueryState, SaveCheckpoint
from hopdec.ps.server import DISCARDED, DROPPED

SERVER = 0
"""The server's id in :class:`~hopdec.core.Wait` actions (MPI rank 0)."""


class PSWorker:
    """One worker of the parameter-server mode. Feed it with ``on_*``; drive it with :meth:`next_action`."""

    def __init__(self, worker, pushes_differences=False, server=SERVER):
        self.worker = worker
        self.pushes_differences = bool(pushes_differences)  # local rounds, differences pushed (policy says)
        self.server = server
        self.iteration = 0                  # mini-batches computed so far (local steps for ESync)
        self.version = None                 # weights version (ESync: round) last loaded
        self.gap = self.staleness = None    # what the server said with those weights
        self.sent_at = None                 # when the server sent them (its clock; data, not read here)
        self.local_steps = 0                # ESync: local steps in the current round
        self.saved_cut = 0                  # the last checkpoint cut this worker saved
        self._cut = (0, 0, 0)               # (cut, keep_from, pin) the last server message carried
        self._reply = None
        self._steps = self._run()

    def resume(self, iteration, cut):
        """Continue from checkpoint ``cut``, with ``iteration`` mini-batches done (before the first action)."""
        self.iteration, self.saved_cut = int(iteration), int(cut)

    # ---- events ----
    def on_weights(self, version, gap=0, staleness=None, sent_at=None, cut=0, keep_from=0, pin=0):
        """The server sent weights of ``version`` at ``sent_at`` (its clock): I am ``gap`` pushes ahead of
        the slowest worker, my last gradient had ``staleness`` (None: none applied yet, -1: dropped);
        ``cut``: the server's latest checkpoint cut, ``keep_from``: the oldest one still needed, ``pin``:
        one older still that is kept (a dead worker's last; 0: none)."""
        self._cut = (int(cut), int(keep_from), int(pin))
        self._set_reply(("weights", int(version), gap, staleness, sent_at))

    def on_answer(self, ready):
        """ESync: the state server's answer to my last query."""
        self._set_reply(("ready" if ready else "not_ready",))

    def on_stop(self, staleness=None, cut=0, keep_from=0, pin=0):
        """Training is over (the server's work budget was reached); ``staleness`` of my last gradient,
        :data:`~hopdec.ps.server.DISCARDED` when it came after the stop and was not used: then it does not
        count as an iteration done (a resumed run computes that iteration again, with the next batch)."""
        self._discarded = staleness == DISCARDED
        self.staleness = DROPPED if self._discarded else staleness
        self._cut = (int(cut), int(keep_from), int(pin))
        self._set_reply(("stop",))

    def next_action(self):
        return next(self._steps, Finished())

    # ---- the loop ----
    def _set_reply(self, reply):
        if self._reply is not None:
            raise RuntimeError(f"worker {self.worker}: a second server reply before the first was used")
        self._reply = reply

    def _await(self, what):
        while self._reply is None:
            yield Wait((self.server,), what)
        reply, self._reply = self._reply, None
        return reply

    def _checkpoint(self):
        cut, keep_from, pin = self._cut
        if cut > self.saved_cut:
            yield SaveCheckpoint(tuple(range(self.saved_cut + 1, cut + 1)), keep_from, pin)
            self.saved_cut = cut

    def _run(self):
        reply = yield from self._await("weights")
        while reply[0] == "weights":
            _, self.version, self.gap, self.staleness, self.sent_at = reply
            yield from self._checkpoint()
            yield LoadWeights(self.version, keep=self.pushes_differences)
            if self.pushes_differences:
                reply = yield from self._esync_round()
            else:
                yield ComputeGradient(self.iteration)
                yield PushGradient(self.version, self.iteration)
                self.iteration += 1
                reply = yield from self._await("weights")
        if reply[0] != "stop":
            raise RuntimeError(f"worker {self.worker}: unexpected server reply {reply[0]!r}")
        if getattr(self, "_discarded", False):
            self.iteration -= self.local_steps if self.pushes_differences else 1
        yield from self._checkpoint()

    def _esync_round(self):
        self.local_steps = 0
        yield QueryState(self.version, 0, self.iteration)
        reply = yield from self._await("answer")
        while reply[0] == "not_ready":
            yield ComputeGradient(self.iteration)
            yield ApplyGradient(self.iteration)      # w_{t,k+1} = w_{t,k} - lr * grad (ESync eq. 5)
            self.iteration += 1
            self.local_steps += 1
            yield QueryState(self.version, self.local_steps, self.iteration)
            reply = yield from self._await("answer")
        if reply[0] == "stop":
            return reply
        if reply[0] != "ready" or self.local_steps < 1:
            raise RuntimeError(f"worker {self.worker}: unexpected reply {reply[0]!r} after "
                               f"{self.local_steps} local steps")
        yield PushDelta(self.version, self.local_steps, self.iteration)   # w_{t,k} - w_t (eq. 6)
        return (yield from self._await("weights"))
