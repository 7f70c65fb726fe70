"""A stand-in communicator for ``hopdec train``'s setup checks, which run without MPI."""


class SizedComm:
    """Just enough of a communicator for setup(): ``size`` ranks, this one rank 0."""

    def __init__(self, size):
        self.size = size

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return 0
