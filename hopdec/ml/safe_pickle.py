"""Read CIFAR-10's python batches without running code from them: an unpickler that admits only their types.

``pickle.load`` calls whatever global a file names (``os.system`` included), so a crafted
``data_batch_1`` ran commands on every rank. A real batch (a Python 2 pickle, read with
``encoding="bytes"``) is a dict with ``b"data"`` (a numpy uint8 array, 10000 x 3072),
``b"labels"`` (a list of ints), ``b"batch_label"`` and ``b"filenames"`` (bytes). Dicts, lists,
bytes, str and ints need no globals at all; the only globals admitted are the ones that rebuild a
numpy uint8 array (``_reconstruct``, ``ndarray`` and ``dtype`` under the old and new numpy module
names, ``_frombuffer`` of protocol 5, ``_codecs.encode`` of Python 3's protocol 2), each checked
to build nothing but that -- and only of a shape a batch has, checked before anything is allocated
(``numpy.ndarray`` itself may only be named as ``_reconstruct``'s argument, never called). Any other global -- including one from a module that does not exist --
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


MAX_ROWS = 60000
"""Rows an array may have: CIFAR-10 holds 50,000 training and 10,000 test images (10,000 per batch)."""
ROW_BYTES = 3072
"""Bytes per row of a batch's ``data`` (32 x 32 x 3)."""


def _text(x):
    return x.decode("latin1") if isinstance(x, bytes) else x


def _check_shape(shape):
    """What a real batch's arrays look like -- ``data`` is N x 3072 uint8 (older dumps: flat) -- checked
    before anything is allocated: a 100-byte file must not ask for gigabytes."""
    if not isinstance(shape, tuple) or not 1 <= len(shape) <= 2 or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise RefusedPickle(f"a numpy array of shape {str(shape)[:40]} (a CIFAR batch holds N x {ROW_BYTES})")
    n = shape[0] * (shape[1] if len(shape) == 2 else 1)
    if (len(shape) == 2 and shape[1] != ROW_BYTES) or n > MAX_ROWS * ROW_BYTES:
        raise RefusedPickle(f"a numpy array of shape {shape} (a CIFAR batch holds at most {MAX_ROWS} x "
                            f"{ROW_BYTES} bytes)")
    return n


class _NdarrayName:
    """What the global ``numpy.ndarray`` stands for: only an argument of ``_reconstruct`` (calling it would
    build any array of any size, e.g. 8 GiB of objects from 100 bytes)."""

    def __call__(self, *args, **kwargs):
        raise RefusedPickle("it calls numpy.ndarray directly (a CIFAR batch only rebuilds uint8 arrays)")


_NDARRAY = _NdarrayName()


class _Checked(np.ndarray):
    """The empty array ``_reconstruct`` builds; its ``__setstate__`` (pickle's BUILD) takes only a uint8
    state whose bytes match its shape, before numpy allocates anything. :func:`load_batch` hands out plain
    ndarrays."""

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) != 5:
            raise RefusedPickle("a numpy array state of an unknown form")
        _, shape, dtype, _, raw = state
        n = _check_shape(shape)
        if not isinstance(dtype, np.dtype) or dtype != np.uint8:
            raise RefusedPickle(f"a numpy array of {str(dtype)[:30]} (a CIFAR batch holds uint8)")
        if not isinstance(raw, (bytes, bytearray)) or len(raw) != n:
            raise RefusedPickle(f"a numpy array of shape {shape} whose data is not its {n} bytes")
        super().__setstate__(state)


def _reconstruct(cls, shape, typecode):
    if cls is not _NDARRAY or tuple(shape) != (0,) or _text(typecode) != "b":
        raise RefusedPickle("numpy _reconstruct with arguments other than an empty ndarray's")
    return _multiarray._reconstruct(_Checked, (0,), b"b")


def _dtype(spec, align=False, copy=False):
    if _text(spec) not in ("u1", "uint8"):
        raise RefusedPickle(f"a numpy dtype other than uint8 ({_text(spec)!r})")
    return np.dtype("u1", bool(align), bool(copy))


def _frombuffer(buf, dtype, shape, order, *rest):
    if np.dtype(dtype) != np.uint8:
        raise RefusedPickle(f"a numpy array of {np.dtype(dtype)} (a CIFAR batch holds uint8)")
    n = _check_shape(tuple(shape) if isinstance(shape, (tuple, list)) else shape)
    if len(memoryview(buf).cast("B")) != n:
        raise RefusedPickle(f"a numpy array of shape {shape} whose buffer is not its {n} bytes")
    return _numeric._frombuffer(buf, np.dtype(np.uint8), shape, order, *rest)


def _encode(text, encoding="latin1"):
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RefusedPickle("_codecs.encode with arguments other than (str, 'latin1')")
    return codecs.encode(text, "latin1")


ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
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
    Python 2 batches need). Raises :class:`RefusedPickle` for any global outside :data:`ALLOWED` and
    for arrays a batch does not hold."""
    return _plain(_Unpickler(fh, encoding="bytes").load())


def _plain(x, depth=0):
    """The unpickled batch with its arrays as plain ndarrays (dicts and lists walked a few levels deep)."""
    if isinstance(x, _Checked):
        return x.view(np.ndarray)
    if depth < 4 and isinstance(x, dict):
        return {k: _plain(v, depth + 1) for k, v in x.items()}
    if depth < 4 and isinstance(x, list):
        return [_plain(v, depth + 1) for v in x]
    return x


def loads_batch(data):
    """:func:`load_batch` on bytes."""
    return load_batch(io.BytesIO(data))
