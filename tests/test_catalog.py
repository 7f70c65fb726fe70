"""The torch-free catalog of the built-in models (hopdec.ml.catalog) agrees with the models torch builds, and
a timing-only ``hopdec sim`` of a built-in model never imports torch."""

import json
import subprocess
import sys

import pytest

from hopdec.errors import ConfigError
from hopdec.ml import catalog
from hopdec.ml.models import parameter_count
from hopdec.ml.registry import MODELS

COMBINATIONS = [(m, d, norm) for m in MODELS for d in catalog.INPUTS for norm in catalog.NORMS]


@pytest.mark.parametrize("model,dataset,norm", COMBINATIONS)
def test_every_count_in_the_table_is_the_models_real_count(model, dataset, norm):
    """Each built-in model on each dataset of known shape, with each norm: the table holds torch's count,
    and a combination that does not build is not in it (so torch says why)."""
    shape, classes = catalog.INPUTS[dataset]
    try:
        real = parameter_count(model, shape, classes, norm=norm)
    except ConfigError:
        real = None
    assert catalog.known_parameter_count(model, dataset, norm) == real


def test_the_table_holds_nothing_else_and_only_normed_models_depend_on_the_norm():
    for (model, dataset, norm) in catalog.PARAMETERS:
        assert model in MODELS and dataset in catalog.INPUTS
        assert (norm is None) == (model not in catalog.NORMED) and norm in (None,) + catalog.NORMS
    assert catalog.known_parameter_count("vgg11", "cifar10", "none") != catalog.known_parameter_count(
        "vgg11", "cifar10", "batch")


def test_unknown_norms_models_and_datasets_are_not_answered_from_the_table():
    assert catalog.known_parameter_count("cnn", "digits", "layer") is None           # torch names the option
    assert catalog.known_parameter_count("mymodels.py:make", "digits") is None
    assert catalog.known_parameter_count("svm", "libsvm") is None                     # its shape is the file's
    assert catalog.known_parameter_count("svm", "mydata:load") is None


@pytest.mark.parametrize("dataset", ["digits", "kjv"])
def test_the_known_input_shapes_are_the_shipped_datasets(dataset):
    from hopdec.ml.data import load_dataset
    d = load_dataset(dataset)
    assert catalog.INPUTS[dataset] == (tuple(d.input_shape), d.num_classes)


def test_the_presets_and_defaults_are_the_models_modules():
    from hopdec.ml import data, models, user
    assert models.PRESETS is catalog.PRESETS and models.default_model_for is catalog.default_model_for
    assert user.USER_PRESET is catalog.USER_PRESET and data.steps_per_epoch is catalog.steps_per_epoch
    assert models.NORMS == catalog.NORMS


TIMING_ONLY = [
    ["-n", "8"],
    ["--topology", "ring-based", "-n", "16", "--compress", "int8"],
    ["--mode", "ps", "--sync", "ssp", "-n", "4"],
    ["--mode", "allreduce", "-n", "4"],
    ["--dataset", "cifar10", "--norm", "none", "-n", "4"],
    ["--dataset", "kjv", "-n", "4"],
    ["--dataset", "libsvm", "--message-mb", "2", "-n", "4"],
    ["-n", "8", "--fault-tolerance", "--deaths", "3@0.3"],
]

CHILD = r"""
import io, json, sys
from hopdec.cli.sim import parse
from hopdec.sim.run import Simulation, simulate
out = []
for argv in json.loads(sys.argv[1]):
    settings = parse(argv + ["--iterations", "3"])
    simulate(settings, out=io.StringIO())
    out.append(Simulation(settings, io.StringIO()).message_bytes)
print(json.dumps(dict(torch="torch" in sys.modules, message_bytes=out)))
"""


def test_a_timing_only_simulation_never_imports_torch():
    """Decentralized, ps and all-reduce, built-in models on every dataset of known shape (or --message-mb):
    torch (about 1.3 s to import) is never loaded, and the message is still 4 bytes per real parameter."""
    got = subprocess.run([sys.executable, "-c", CHILD, json.dumps(TIMING_ONLY)], capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    res = json.loads(got.stdout.splitlines()[-1])
    assert res["torch"] is False
    P = catalog.PARAMETERS
    assert res["message_bytes"] == [4 * P["cnn", "digits", None]] * 4 + [
        4 * P["vgg11", "cifar10", "none"], 4 * P["transformer", "kjv", None], 2 * 2 ** 20, 4 * P["cnn", "digits", None]]


def test_a_model_that_does_not_fit_the_dataset_is_still_one_line_from_torch():
    from hopdec.cli.sim import parse
    from hopdec.sim.run import simulate
    with pytest.raises(ConfigError, match="--model vgg11: needs images of at least 32x32"):
        simulate(parse(["-n", "4", "--iterations", "2", "--model", "vgg11"]))
    with pytest.raises(ConfigError, match="--model cnn: needs CxHxW image input"):
        simulate(parse(["-n", "4", "--iterations", "2", "--model", "cnn", "--dataset", "kjv"]))
