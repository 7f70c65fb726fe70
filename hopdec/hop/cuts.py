"""Consistent cuts of a decentralized run: when its workers checkpoint, which checkpoints may go, where a
stop ends it. Plain functions of iteration numbers (no MPI, no files, no clock).

A cut is Enter(K) on every worker: before Send(K) a worker's protocol state is a function of K alone
(:meth:`hopdec.hop.worker.Worker.resume_at`), so states saved there by every worker fit together, and a
run resumed from them continues exactly. The drivers (:mod:`hopdec.runtime.resume`,
:mod:`hopdec.runtime.interrupt`) only save files and carry messages; these functions decide.

>>> [k for k in range(12) if checkpoint_due(k, every=4, start=0, budget=10)]
[4, 8]
>>> oldest_needed(12, every=4, gap=3, saved=[4, 8])          # everyone has entered 9: 4 is nobody's latest
8
>>> oldest_needed(12, every=4, gap=None, saved=[4, 8])       # gaps unbounded: keep everything
0
>>> stop_agreement([(7, 0), (9, 10), (8, 15)])                # (position, signal) of every worker
(10, 10)
"""


def checkpoint_due(k, every, start, budget):
    """Whether a worker entering iteration ``k`` saves a periodic checkpoint: ``k`` a multiple of ``every``
    (0: none), after the iteration the run started (or resumed) at and before its last one. The final cut,
    Enter(budget), is saved at the end whatever ``every`` is. A jump never skips a multiple of ``every``
    (:meth:`hopdec.hop.worker.Worker._jump_target`), so every worker enters each of them."""
    return bool(every) and k % every == 0 and start < k < budget


def oldest_needed(k, every, gap, saved):
    """After saving ``k``: the oldest checkpoint key a resume may still need (older ones may be deleted).

    Every worker is within ``gap`` iterations of this one (Hop Table 1's bound; None: unbounded, e.g.
    after a heal, when the dead have no newer checkpoint), so each has entered ``k - gap`` and saved the
    multiple of ``every`` below it: older checkpoints are nobody's latest common one. The previous
    checkpoint (the newest of ``saved`` below ``k``) always stays: a worker may die before saving ``k``.
    """
    if gap is None:
        return 0
    keep = int((k - gap) // every) * every if every else k
    older = [x for x in saved if x < k]
    return min(keep, max(older)) if older else keep


def stop_agreement(notes):
    """Where every worker stops, from every worker's ``(position, signal)`` (Ctrl-C).

    ``position``: the last iteration it entered or committed to by a jump
    (:attr:`hopdec.hop.worker.Worker.position`); ``signal``: the stop signal it got (0: none, it heard of
    the stop from a peer). Returns ``(stop_at, signal)``: ``stop_at = max + 1`` -- nobody has passed it,
    so each finishes up to ``stop_at - 1`` normally and Enter(stop_at) is a cut as consistent as the
    periodic ones (:meth:`hopdec.hop.worker.Worker.stop_at`) -- and the first signal in ``notes``' order
    (None when none).
    """
    notes = [(int(p), int(s)) for p, s in notes]
    return max(p for p, _ in notes) + 1, next((s for _, s in notes if s), None)
