"""The parameter-server mode (``hopdec train --mode ps``), for comparison with decentralized training.

* :mod:`.server` / :mod:`.worker` -- the server and worker protocol cores, sans I/O (:mod:`hopdec.core`);
* :mod:`.sync` -- the seven sync models (BSP, ASP, SSP, DSSP, ElasticBSP, backup workers, ESync);
* :mod:`.zipline` -- ElasticBSP's barrier search;
* :mod:`.actions` -- the vocabulary the cores speak.

Cores only: the run assembly is :mod:`hopdec.modes.ps`, the MPI runner :mod:`hopdec.runtime.ps_mpi` (its
messages: :mod:`hopdec.transport.ps`), the simulator's :mod:`hopdec.sim.ps`.
"""
