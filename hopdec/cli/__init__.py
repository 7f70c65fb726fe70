"""The ``hopdec`` command line: ``hopdec train`` and ``hopdec topo`` (see :mod:`hopdec.cli.main`)."""

from hopdec.cli.main import main  # noqa: F401
