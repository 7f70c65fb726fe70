"""hopdec: heterogeneity-aware decentralized (gossip) training for PyTorch over MPI.

The protocol core (:mod:`hopdec.protocol`) is plain Python; MPI (:mod:`hopdec.transport`) is one
transport plugged into it. See README.md for the tour.
"""

__version__ = "0.1.0"


def zipline(times):
    """ElasticBSP barrier search; see :func:`hopdec.zipline.zipline` (imported lazily)."""
    from hopdec.zipline import zipline as _zipline
    return _zipline(times)
