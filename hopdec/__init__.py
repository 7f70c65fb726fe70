"""hopdec: heterogeneity-aware decentralized (gossip) training for PyTorch over MPI.

The protocol core (:mod:`hopdec.protocol`) is plain Python; MPI (:mod:`hopdec.transport`) is one
transport plugged into it. See README.md for the tour.
"""

__version__ = "0.1.0"


# ``hopdec.zipline(times)`` is the function (imported eagerly: numpy only). Import the module's other
# names with ``from hopdec.zipline import zipline_plain, ...``.
from hopdec.zipline import zipline  # noqa: E402,F401
