"""The names of the built-in models and datasets, and the syntax of a model or dataset of your own
(``--model pkg.module:factory``), without importing torch (the command line's checks read them before
anything heavy is loaded; :mod:`hopdec.ml.models`, :mod:`hopdec.ml.data` and :mod:`hopdec.ml.user` build
them)."""

import re

MODELS = ("cnn", "vgg11", "svm", "mlp", "transformer")
DATASETS = ("digits", "cifar10", "libsvm", "kjv")
DEFAULT_MODEL = {"digits": "cnn", "cifar10": "vgg11", "libsvm": "svm", "kjv": "transformer"}
"""The model each dataset trains by default (the paper's pairs; the text corpus: the transformer)."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
ENTRY_POINT = re.compile(rf"^(?P<module>{_NAME}(?:\.{_NAME})*|[^:]+\.py):(?P<attr>{_NAME}(?:\.{_NAME})*)$")
"""``pkg.module:factory`` (a module on the import path, or in the working directory) or
``path/to/file.py:factory`` (a file of your own), as uvicorn and setuptools entry points name objects."""


def is_entry_point(name):
    """Whether ``name`` names a factory of your own (``module:attr``) rather than a built-in."""
    return isinstance(name, str) and ENTRY_POINT.match(name) is not None


def check_name(name, option, builtins):
    """None when ``name`` is one of ``builtins`` or a ``module:factory``; else the words of the error."""
    if name in builtins or is_entry_point(name):
        return None
    return (f"expected one of {', '.join(builtins)}, or module:factory for one of your own "
            f"(e.g. mymodels:make or ./mymodels.py:make)")
