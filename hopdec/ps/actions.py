"""What the parameter-server cores ask their drivers to do, and the events they consume.

Server core (:class:`hopdec.ps.server.Server`). Events: ``start(now)``, ``on_push(worker, step, now,
local_steps)``, ``on_query(worker, k, c, now)``. Actions:

* :class:`ApplyGradients` -- optimizer step on the weighted sum of the pushed gradients of ``parts``;
* :class:`ApplyDeltas` -- ESync: add the weighted sum of the pushed model differences to the weights;
* :class:`DropGradient` -- discard a pushed gradient (a backup worker that lost the race);
* :class:`SendWeights` -- send the current weights to ``workers``; they continue;
* :class:`AnswerQuery` -- ESync: READY (aggregate now) or NOT-READY (one more local step);
* :class:`StopWorkers` -- tell ``workers`` that training is over;
* :class:`Note` -- a decision worth logging (a barrier chosen, a controller's r*, a round's steps);
* :class:`Checkpoint` -- save the server's state: a consistent cut, every worker waiting.

Worker core (:class:`hopdec.ps.worker.PSWorker`). Events: ``on_weights(version, ...)``,
``on_answer(ready)``, ``on_stop()``. Actions: :class:`LoadWeights`, :class:`~hopdec.core.ComputeGradient`,
:class:`~hopdec.core.ApplyGradient` (an ESync local step), :class:`PushGradient`, :class:`PushDelta`,
:class:`QueryState`, :class:`SaveCheckpoint`, and the shared :class:`~hopdec.core.Wait` / :class:`~hopdec.core.Finished`.

Workers are named by their ids everywhere (the MPI rank in ``hopdec train``), never by a position.
"""

from dataclasses import dataclass, field

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait  # noqa: F401  (re-exported)


# ---- server actions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ApplyGradients:
    """``w <- optimizer_step(sum(weight * gradient of worker))`` over ``parts = ((worker, weight), ...)``.

    ``steps``: the weights version each gradient was computed on; ``staleness``: updates applied since
    (``version - 1 - step``); ``version``: the server model's version after this update."""

    parts: tuple
    version: int
    steps: tuple = ()
    staleness: tuple = ()


@dataclass(frozen=True)
class ApplyDeltas:
    """ESync: ``w <- w + sum(weight * model difference of worker))`` over ``parts``."""

    parts: tuple
    version: int
    steps: tuple = ()


@dataclass(frozen=True)
class DropGradient:
    """Discard ``worker``'s pushed gradient, computed on version ``step`` (older than ``version``)."""

    worker: int
    step: int
    version: int
    reason: str = "late"


@dataclass(frozen=True)
class SendWeights:
    """Send the current weights (``version``) to ``workers``. ``gaps[i]``: how many pushes worker i is
    ahead of the slowest; ``staleness[i]``: of its last gradient (None: none applied yet, -1: dropped).
    ``cut``: the latest checkpoint cut (0: none), which a worker that has not saved it saves before
    going on; ``keep_from``: the oldest cut still needed (older checkpoints may be deleted) but ``pin``,
    when not 0: the last cut a dead worker saved (:mod:`hopdec.ps.server`), kept for ``--resume``."""

    workers: tuple
    version: int
    reason: str = ""
    gaps: tuple = ()
    staleness: tuple = ()
    cut: int = 0
    keep_from: int = 0
    pin: int = 0


@dataclass(frozen=True)
class AnswerQuery:
    """ESync state query reply: ``ready`` means aggregate now, else run one more local step."""

    worker: int
    ready: bool


@dataclass(frozen=True)
class StopWorkers:
    """Training is over for ``workers``: the work budget was reached (or a stop was requested).
    ``cut``, ``keep_from``, ``pin``: as in :class:`SendWeights` (the final cut, when checkpointing).
    ``staleness[i]``: what worker i is told of its last gradient (as in :class:`SendWeights`;
    :data:`hopdec.ps.server.DISCARDED` when it came after the stop and was not used) -- filled in by the
    server core from its books, so it is not part of the action's identity (``==`` ignores it)."""

    workers: tuple
    version: int
    cut: int = 0
    keep_from: int = 0
    pin: int = 0
    discarded: tuple = ()           # of ``workers``, those whose last push came after the stop: unused
    staleness: tuple = field(default=(), compare=False)


@dataclass(frozen=True)
class Checkpoint:
    """Save the server's state as checkpoint ``cut``: every worker is waiting (none computes, no push is
    in flight), a consistent cut. ``final``: the last one of the run (every worker has been stopped)."""

    cut: int
    version: int
    work: int
    final: bool = False
    keep_from: int = 0
    pin: int = 0


@dataclass(frozen=True)
class Note:
    """Something worth logging: ``event`` names it, ``data`` holds plain JSON-ready values."""

    event: str
    data: dict = field(default_factory=dict)


# ---- worker actions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadWeights:
    """Make the weights just received (``version``) the local parameters; ``keep`` a copy of them too
    (ESync: the round's starting point w_t, to form the model difference later)."""

    version: int
    keep: bool = False


@dataclass(frozen=True)
class PushGradient:
    """Send the computed gradient to the server, tagged with the weights version it was computed on."""

    step: int
    iteration: int


@dataclass(frozen=True)
class PushDelta:
    """ESync: send the model difference (current parameters minus the kept copy) after ``local_steps``."""

    round: int
    local_steps: int
    iteration: int


@dataclass(frozen=True)
class SaveCheckpoint:
    """A worker saves its state (data position, iteration) as the checkpoint of ``cuts`` (the same state
    for each: it was waiting for the server through all of them); ``keep_from``: older ones may go, but
    ``pin`` (0: none; see :class:`SendWeights`)."""

    cuts: tuple
    keep_from: int = 0
    pin: int = 0


@dataclass(frozen=True)
class QueryState:
    """ESync: ask the state server whether to aggregate (``k`` local steps done in ``round``). The driver
    attaches the last local step's measured time (the device's capability, ESync sec. 4.1)."""

    round: int
    k: int
    iteration: int
