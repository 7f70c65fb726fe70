"""Transports that carry the protocol core's messages: MPI (:mod:`.mpi`) and in-process (:mod:`.inproc`)."""
