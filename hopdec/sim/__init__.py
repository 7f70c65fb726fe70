"""Drivers that run the protocol cores without MPI: seeded random interleavings of the Hop cores
(:mod:`.inproc`, for property tests) and the parameter-server cores in virtual time (:mod:`.ps` on
:mod:`.events`)."""
