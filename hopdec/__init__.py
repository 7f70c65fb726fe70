"""hopdec: heterogeneity-aware decentralized (gossip) training for PyTorch over MPI.

Packages, from the protocol outwards (README "Design" has the tour):

* :mod:`hopdec.hop` -- the Hop protocol core (one worker as a sans-I/O state machine);
* :mod:`hopdec.ps` -- the parameter-server core (server and worker state machines, sync models);
* :mod:`hopdec.topology` -- communication graphs, mixing weights, Hop Table 1 bounds;
* :mod:`hopdec.transport` -- messages over MPI (flat buffers, nonblocking, timeouts);
* :mod:`hopdec.runtime` -- drivers that carry out the cores' actions with torch and MPI;
* :mod:`hopdec.ml` -- data, models and the flat-buffer trainer (the torch side);
* :mod:`hopdec.sim` -- drivers without MPI (in-process scheduler);
* :mod:`hopdec.cli` -- the ``hopdec`` command.
"""

__version__ = "0.1.0"
