"""Decentralized training in your own loop: :class:`HopOptimizer` wraps any ``torch.optim`` optimizer so
that each step also averages the parameters with the rank's graph neighbours (the Hop protocol, the same
core and loop as ``hopdec train``); :class:`HopSGD` is its SGD case.

Modules: :mod:`.hop` (the optimizer), :mod:`.ending` (how a run ends when ranks take different numbers of
steps), :mod:`.failing` (an exception on one rank ends the job with one line), :mod:`.life` (the model
changed under the optimizer), :mod:`.assembly` (the topology, core, transport and logs of one rank).
"""

from hopdec.optim import failing
from hopdec.optim.hop import HopOptimizer, HopSGD

failing.install_early()     # an error on one rank before any optimizer is built ends the job too

__all__ = ["HopOptimizer", "HopSGD"]
