"""Drivers that run the protocol cores without MPI: the seeded in-process scheduler (:mod:`.inproc`)."""
