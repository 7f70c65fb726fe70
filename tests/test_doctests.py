"""The examples in the docstrings are tests: each module's doctests must pass."""

import doctest
import importlib

import pytest

from hopdec import topology as T

MODULES = ["hopdec.topology", "hopdec.topology.graph_io", "hopdec.topology.generators",
           "hopdec.topology.weights", "hopdec.topology.spectral", "hopdec.topology.bounds", "hopdec.topology.heal",
           "hopdec.hop.update_queue", "hopdec.hop.token_queue", "hopdec.hop.cuts", "hopdec.sim.events",
           "hopdec.transport.message", "hopdec.topology.schedule", "hopdec.topology.schedule_analysis",
           "hopdec.transport.codec", "hopdec.hop.receive", "hopdec.sim.allreduce", "hopdec.sim.gap",
           "hopdec.allreduce.worker", "hopdec.topology.traffic", "hopdec.words"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, extraglobs=vars(T), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
