"""Synchronous data parallelism with an all-reduce -- what PyTorch DDP does -- as a sans-I/O core.

Every worker computes the gradient of its own mini-batch at the same parameters, the gradients are
averaged by one all-reduce, and every worker applies the same averaged gradient with the same optimizer,
so the workers' parameters stay identical (synchronous SGD without backup workers: Chen et al.,
*Revisiting Distributed Synchronous SGD*, sec. 2; Li et al., *PyTorch Distributed*, VLDB 2020, sec. 3).
:mod:`.worker` holds the one core: when a worker computes, reduces, applies, checkpoints and stops. No
MPI, torch or clock here; the MPI runner (:mod:`hopdec.runtime.allreduce_mpi`) and the simulator
(:mod:`hopdec.sim.allreduce`) carry its actions out through one loop (:mod:`hopdec.runtime.allreduce_loop`).
"""

from hopdec.allreduce.worker import GAP_BOUND, AllReduce, Worker  # noqa: F401
