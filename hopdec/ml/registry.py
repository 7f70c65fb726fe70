"""The names of the built-in models and datasets, without importing torch (the command line's choices
read them before anything heavy is loaded; :mod:`hopdec.ml.models` and :mod:`hopdec.ml.data` build them)."""

MODELS = ("cnn", "vgg11", "svm", "mlp", "transformer")
DATASETS = ("digits", "cifar10", "libsvm", "kjv")
DEFAULT_MODEL = {"digits": "cnn", "cifar10": "vgg11", "libsvm": "svm", "kjv": "transformer"}
"""The model each dataset trains by default (the paper's pairs; the text corpus: the transformer)."""
