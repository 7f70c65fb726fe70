"""A run's settings as typed, frozen, documented objects, checked once when they are built.

The command line (:mod:`hopdec.cli`) turns options into a :class:`RunSettings`; everything below it -- the
run assemblies (:mod:`hopdec.modes`), the MPI runners (:mod:`hopdec.runtime`), the simulator
(:mod:`hopdec.sim`) -- reads these objects, never an ``argparse.Namespace``. One group per concern, one
module each:

* :class:`Work` -- data, model, optimiser, length (:mod:`.work`);
* :class:`Protocol` -- the decentralized protocol and topology (:mod:`.protocol`);
* :class:`PS` -- the parameter server's sync model (:mod:`.ps`);
* :class:`Emulation` -- emulated heterogeneity (:mod:`.emulation`);
* :class:`Observe` -- logs, progress, evaluation, traces (:mod:`.observe`);
* :class:`Checkpoints` -- checkpoints and resuming (:mod:`.checkpoints`);
* :class:`Faults` -- peer timeout, fault tolerance, fault injection (:mod:`.faults`);
* :class:`Cost` -- the simulator's cost model (:mod:`.cost`);
* :class:`RunSettings` -- the mode and the groups, and the rules between them (:mod:`.run`).

Each field names its option, so every error names what the user typed (:mod:`.base`).
"""

from hopdec.settings.checkpoints import Checkpoints  # noqa: F401
from hopdec.settings.cost import Cost  # noqa: F401
from hopdec.settings.emulation import Emulation  # noqa: F401
from hopdec.settings.faults import Faults  # noqa: F401
from hopdec.settings.observe import Observe  # noqa: F401
from hopdec.settings.protocol import Protocol  # noqa: F401
from hopdec.settings.ps import PS  # noqa: F401
from hopdec.settings.run import MODES, RunSettings  # noqa: F401
from hopdec.settings.work import Work  # noqa: F401
