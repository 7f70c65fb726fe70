"""Surviving dead workers over MPI (ULFM, ``--fault-tolerance``): agree on who failed, shrink, heal, go on.

When a peer dies, ULFM makes the survivors' operations that involve it fail; the transport records that
and the driver calls :meth:`Healer.heal`: it revokes the communicator (so every survivor, wherever it is
blocked, joins the recovery), shrinks it to the survivors (``MPI_Comm_shrink`` is the agreement on who
failed), exchanges the survivors' iterations, heals the graph (:mod:`hopdec.topology.heal`), reconfigures
the Hop core (:meth:`hopdec.hop.worker.Worker.reconfigure`) and the transport, and returns. The run goes
on from every survivor's current iteration: nothing is restarted. A failure during the recovery starts it
over. Worker ids stay the ranks of the first communicator, in every log and message.
"""

import time

from hopdec.hop.heal import heal
from hopdec.topology.heal import relabelled
from hopdec.transport.collectives import allgather_json
from hopdec.transport.ulfm import on_survivors


class Healer:
    """One survivor's part of the recovery; ``events`` lists every heal it took part in."""

    def __init__(self, comm, graph, core, io, timeout):
        self.comm, self.graph, self.core, self.io, self.timeout = comm, graph, core, io, timeout
        self.me = core.rank
        self.events = []

    def heal(self):
        """Run the recovery with the other survivors (collective); returns its event record. A death that
        is a rank ending the job (it recorded the job's exit code first) is no failure to heal: this rank
        leaves (:func:`hopdec.runtime.failures.leave_if_ending`)."""
        from mpi4py import MPI

        from hopdec.runtime.failures import leave_if_ending
        leave_if_ending()
        t0 = time.time()
        info, new = on_survivors(self.comm, lambda c: allgather_json(c, [self.me, self.core.iteration],
                                                                       self.timeout, "healing"),
                                 self.timeout, "healing", revoke=True,
                                 again=lambda err, c: isinstance(err, MPI.Exception))
        survivors = [i for i, _ in info]
        failed = sorted(set(self.graph.nodes) - set(survivors))
        before = self.core.iteration
        healed, notes = heal(self.graph, failed, {self.me: self.core}, dict((i, k) for i, k in info))
        view = self.core.view
        self.io.reconfigure(new, view, self.core.held_handles(), {i: r for r, (i, _) in enumerate(info)})
        self.comm, self.graph = new, healed
        event = dict(event="heal", time=t0, failed=failed, survivors=survivors, iteration=before,
                     stall_s=round(time.time() - t0, 6), spectral_gap=_gap(healed),
                     in_neighbors=list(view.in_neighbors), out_neighbors=list(view.out_neighbors),
                     notes=notes)
        self.events.append(event)
        return event


def _gap(graph):
    from hopdec.topology.spectral import spectral_gap
    try:
        return round(float(spectral_gap(relabelled(graph))), 6)
    except Exception:                               # pragma: no cover - a measure, never a reason to fail
        return None
