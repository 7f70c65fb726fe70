"""The run assemblies: what a run of each mode consists of, whoever executes it.

One module per mode -- :mod:`.decentralized` (:class:`HopRun`), :mod:`.ps` (:class:`PSRun`),
:mod:`.allreduce` (:class:`AllReduceRun`: synchronous data parallelism, what DDP does) -- and the
workload every mode shares (:mod:`.work`: model, presets, data, iterations, trainers). Three executors
carry the same assembly out: real MPI processes (:mod:`hopdec.runtime`), the virtual-time simulator
(:mod:`hopdec.sim.run`) and the seeded in-process scheduler (:mod:`hopdec.sim.inproc`), as SimPy runs the
same process description in several environments. A mode's settings groups are
:data:`hopdec.settings.MODES`; a new mode is a module here plus a runner per executor.
"""

from hopdec.modes.decentralized import HopRun  # noqa: F401
from hopdec.modes.ps import PSRun  # noqa: F401
from hopdec.modes.allreduce import AllReduceRun  # noqa: F401
