"""Runs on real processes: per-rank setup, the MPI runners of each mode (:mod:`.hop_mpi`, :mod:`.ps_mpi`),
checkpoints, stops, healing and failures; and what every executor shares: the loops that carry out the
cores' actions (:mod:`.hop_loop`, :mod:`.ps_loop`), the torch backends, logs and the summary table."""
