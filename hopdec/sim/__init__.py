"""Executors without MPI: the virtual-time simulator (:mod:`.run`, ``hopdec sim``: a run assembly with a cost
model, on the cores in virtual time, :mod:`.hop` and :mod:`.ps` on :mod:`.events` and :mod:`.network`) and
the seeded in-process scheduler of the Hop cores (:mod:`.inproc`, for property tests)."""
