"""What the Hop worker core (:class:`hopdec.hop.worker.Worker`) asks its driver to do.

One iteration k on the parallel computation graph (Hop Figure 7, sec. 3.2)::

    Enter(k) -> SendParams(k) -> ComputeGradient(k) -> [Wait] -> Reduce(k) -> ApplyGradient(k)

then a token from every out-neighbour before Enter(k+1). :class:`~hopdec.core.ComputeGradient`,
:class:`~hopdec.core.ApplyGradient`, :class:`~hopdec.core.Wait` and :class:`~hopdec.core.Finished` are
shared with the parameter-server cores (:mod:`hopdec.core`).
"""

from typing import Optional

from hopdec.core import ApplyGradient, ComputeGradient, Finished, Wait  # noqa: F401  (re-exported)
from hopdec.core import Record, action


@action
class Enter(Record):
    """The worker enters ``iteration`` (from ``jumped_from`` when it skipped iterations, sec. 5). Entering
    inserts a token into every local token queue at the same step (sec. 4.2, Theorem 2): ``grants = ((in-
    neighbour, cumulative count), ...)`` tells each in-neighbour how many it has put there in total (counts
    only grow, so grants may coalesce; empty without token queues)."""

    iteration: int
    jumped_from: Optional[int] = None
    grants: tuple = ()


@action
class SendParams(Record):
    """Send my current parameters, tagged with ``iteration``, to ``dests`` (non-blocking). ``skipped``:
    out-neighbours left out because they are known to be past any iteration that could use it (sec. 6.2 b)."""

    iteration: int
    dests: tuple
    skipped: tuple = ()


@action
class SendAcks(Record):
    """Notify-ack (sec. 3.3): tell each in-neighbour how many of its updates I have consumed in total,
    right after Reduce: ``acks = ((in-neighbour, cumulative count), ...)``."""

    acks: tuple


@action
class Reduce(Record):
    """Replace my parameters by ``sum(term.weight * params(term))``; then free the terms' handles."""

    iteration: int
    terms: tuple


@action
class ReleaseUpdates(Record):
    """Free the buffers of received updates that will never be used (late or superseded, sec. 6.2 a)."""

    handles: tuple


@action
class Jump(Record):
    """Iteration skipping (sec. 5): from ``frm`` straight to ``to``."""

    frm: int
    to: int
