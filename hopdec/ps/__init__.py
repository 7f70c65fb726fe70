"""The parameter-server mode (``hopdec train --mode ps``), for comparison with decentralized training.

* :mod:`.server` / :mod:`.worker` -- the server and worker protocol cores, sans I/O (:mod:`hopdec.core`);
* :mod:`.sync` -- the seven sync models (BSP, ASP, SSP, DSSP, ElasticBSP, backup workers, ESync);
* :mod:`.zipline` -- ElasticBSP's barrier search;
* :mod:`.actions` -- the vocabulary the cores speak;
* :mod:`.options` -- the command-line options and their checks;
* :mod:`.mpi` -- the MPI driver (rank 0 serves, ranks 1.. are workers).
"""
