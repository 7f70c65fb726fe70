"""Read CIFAR-10's python batches without running code from them: an unpickler that admits only their types.

``pickle.load`` calls whatever global a file names (``os.system`` included), so a crafted
``data_batch_1`` ran commands on every rank. A real batch (a Python 2 pickle, read with
``encoding="bytes"``) is a dict with ``b"data"`` (a numpy uint8 array, 10000 x 3072),
``b"labels"`` (a list of ints), ``b"batch_label"`` and ``b"filenames"`` (bytes). Dicts, lists,
bytes, str and ints need no globals at all; the only globals admitted are the ones that rebuild a
numpy uint8 array (``_reconstruct``, ``ndarray`` and ``dtype`` under the old and new numpy module
names, ``_frombuffer`` of protocol 5, ``_codecs.encode`` of Python 3's protocol 2), each checked
to build nothing but that. Any other global -- including one from a module that does not exist --
is refused before it is looked up.
"""

import codecs
import io
import pickle

import numpy as np

try:                                         # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:                          # numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


class RefusedPickle(pickle.UnpicklingError):
    """The file names a global a CIFAR batch does not hold (the message says which)."""


def _text(x):
    return x.decode("latin1") if isinstance(x, bytes) else x


def _reconstruct(cls, shape, typecode):
    if cls is not np.ndarray or tuple(shape) != (0,) or _text(typecode) != "b":
        raise RefusedPickle("numpy _reconstruct with arguments other than an empty ndarray's")
    return _multiarray._reconstruct(np.ndarray, (0,), b"b")


def _dtype(spec, align=False, copy=False):
    if _text(spec) not in ("u1", "uint8"):
        raise RefusedPickle(f"a numpy dtype other than uint8 ({_text(spec)!r})")
    return np.dtype("u1", bool(align), bool(copy))


def _frombuffer(buf, dtype, shape, order, *rest):
    if np.dtype(dtype) != np.uint8:
        raise RefusedPickle(f"a numpy array of {np.dtype(dtype)} (a CIFAR batch holds uint8)")
    return _numeric._frombuffer(buf, np.dtype(np.uint8), shape, order, *rest)


def _encode(text, encoding="latin1"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle("_codecs.encode with arguments other than (str, 'latin1')")
    return codecs.encode(text, "latin1")


ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _encode,
}
"""(module, name) -> what it stands for: the only globals a CIFAR-10 python batch may name."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise RefusedPickle(f"it names {module}.{name}, which a CIFAR-10 batch does not hold "
                                f"(only dicts, lists, bytes, str, ints and numpy uint8 arrays are "
                                f"read)") from None


def load_batch(fh):
    """Unpickle one CIFAR-10 python batch from binary file ``fh`` (``encoding="bytes"``, as the
    Python 2 batches need). Raises :class:`RefusedPickle` for any global outside :data:`ALLOWED`."""
    return _Unpickler(fh, encoding="bytes").load()


def loads_batch(data):
    """:func:`load_batch` on bytes."""
    return load_batch(io.BytesIO(data))
