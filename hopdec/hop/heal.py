"""The Hop side of a heal (``--fault-tolerance``): after workers failed, the healed graph and every
survivor's core reconfigured to it, from the survivors' iterations. The one heal sequence, whoever runs
it: each MPI rank for its own core (:class:`hopdec.runtime.heal.Healer`), the in-process scheduler for
every core (:meth:`hopdec.sim.inproc.InProcNetwork.fail`)."""

from hopdec.hop.worker import node_views
from hopdec.topology.heal import heal_graph


def heal(graph, failed, cores, iterations):
    """Heal ``graph`` without the ``failed`` workers (:func:`hopdec.topology.heal.heal_graph`: each dead
    node's in-neighbours are connected to its out-neighbours) and reconfigure each of ``cores`` (worker id
    -> :class:`~hopdec.hop.worker.Worker`) that survived to its new view
    (:meth:`~hopdec.hop.worker.Worker.reconfigure`); ``iterations``: every survivor's current iteration.
    Returns ``(healed graph, notes)``."""
    healed, notes = heal_graph(graph, failed)
    for view in node_views(healed, ahead=False):     # (healing needs token queues: no path bound)
        if view.rank in cores:
            cores[view.rank].reconfigure(view, iterations)
    return healed, notes
