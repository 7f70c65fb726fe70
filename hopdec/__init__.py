"""hopdec: heterogeneity-aware decentralized (gossip) training for PyTorch over MPI.

Packages, from the protocol outwards (README "Design" has the tour and the layers):

* :mod:`hopdec.hop` -- the Hop protocol core (one worker as a sans-I/O state machine);
* :mod:`hopdec.ps` -- the parameter-server cores (server and worker state machines, sync models);
* :mod:`hopdec.topology` -- communication graphs, mixing weights, Hop Table 1 bounds;
* :mod:`hopdec.transport` -- messages over MPI (flat buffers, nonblocking, timeouts, ULFM);
* :mod:`hopdec.ml` -- data, models and the flat-buffer trainer (the torch side);
* :mod:`hopdec.settings` -- a run's settings: typed, frozen, checked once;
* :mod:`hopdec.modes` -- what a run of each mode consists of (the run assemblies);
* :mod:`hopdec.runtime` -- the MPI executor, and the loops every executor shares;
* :mod:`hopdec.sim` -- the virtual-time simulator and the seeded in-process scheduler;
* :mod:`hopdec.observe`, :mod:`hopdec.report` -- watching a run, reading its logs;
* :mod:`hopdec.cli` -- the ``hopdec`` command.
"""

__version__ = "0.1.0"
