"""CIFAR-10 batches are read without running code from them (hopdec.ml.safe_pickle)."""

import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from hopdec.errors import ConfigError
from hopdec.ml.data import load_dataset


def py2_pickle(obj):
    """Protocol 2 as Python 2's cPickle wrote the real CIFAR batches: str as (SHORT_)BINSTRING,
    arrays through numpy.core.multiarray._reconstruct and numpy.dtype('u1', 0, 1)."""
    out = bytearray(b"\x80\x02")

    def string(b):
        out.extend(b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b)

    def integer(i):
        out.extend(b"K" + bytes([i]) if i < 256 else b"M" + struct.pack("<H", i) if i < 65536
                   else b"J" + struct.pack("<i", i))

    def emit(x):
        if isinstance(x, dict):
            out.extend(b"}(")
            for k, v in x.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(x, list):
            out.extend(b"](")
            for v in x:
                emit(v)
            out.extend(b"e")
        elif isinstance(x, bytes):
            string(x)
        elif isinstance(x, int):
            integer(x)
        elif isinstance(x, np.ndarray):
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85")
            string(b"b")
            out.extend(b"\x87R(K\x01")
            for d in x.shape:
                integer(d)
            out.extend(b"\x86cnumpy\ndtype\n")
            string(b"u1")
            out.extend(b"K\x00K\x01\x87R(K\x03")
            string(b"|")
            out.extend(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
            string(x.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(x))
    emit(obj)
    return bytes(out + b".")


def real_batch(n=20, seed=0):
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"training batch 1 of 5",
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img_{i}.png".encode() for i in range(n)]}


def write_cifar(root, batch_bytes):
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (root / name).write_bytes(batch_bytes)


def test_python2_batches_as_cifar_ships_them():
    from hopdec.ml.safe_pickle import loads_batch
    batch = real_batch()
    got = loads_batch(py2_pickle(batch))
    assert set(got) == set(batch) and got[b"labels"] == batch[b"labels"]
    assert got[b"data"].dtype == np.uint8 and np.array_equal(got[b"data"], batch[b"data"])
    assert got[b"filenames"][3] == b"img_3.png" and got[b"batch_label"] == batch[b"batch_label"]


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_python3_pickles_of_the_same_dict(protocol):
    from hopdec.ml.safe_pickle import loads_batch
    batch = real_batch()
    got = loads_batch(pickle.dumps(batch, protocol=protocol))
    assert np.array_equal(got[b"data"], batch[b"data"]) and got[b"labels"] == batch[b"labels"]


def test_load_dataset_reads_python2_batches(tmp_path):
    write_cifar(tmp_path, py2_pickle(real_batch(n=12)))
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert tuple(ds.train_x.shape) == (60, 3, 32, 32) and len(ds.test_y) == 12


# a pickle (protocol 0) that calls os.system(COMMAND) when loaded: what a crafted data_batch_1 did
def evil(command, module="os", name="system"):
    return f"c{module}\n{name}\n(V{command}\ntR.".encode()


@pytest.mark.parametrize("module,name", [("os", "system"), ("posix", "system"), ("builtins", "eval"),
                                         ("subprocess", "call"), ("numpy", "load")])
def test_crafted_batch_is_refused_and_never_run(tmp_path, module, name):
    marker = tmp_path / "ran"
    command = f"touch {marker}" if name in ("system", "call") else f"open({str(marker)!r}, 'w')"
    if name == "call":
        command = str(marker)
    write_cifar(tmp_path, evil(command, module, name))
    with pytest.raises(ConfigError) as err:
        load_dataset("cifar10", data_dir=str(tmp_path))
    msg = str(err.value)
    assert msg.startswith(str(tmp_path / "data_batch_1")) and f"it names {module}.{name}" in msg
    assert "\n" not in msg and not marker.exists()


def test_protocol_4_global_is_refused_too(tmp_path):
    from hopdec.ml.safe_pickle import RefusedPickle, loads_batch
    class Boom:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {tmp_path / 'ran'}",))
    with pytest.raises(RefusedPickle, match="names (os|posix).system"):
        loads_batch(pickle.dumps({b"data": Boom()}, protocol=4))
    assert not (tmp_path / "ran").exists()


def test_missing_module_is_one_line(tmp_path):
    write_cifar(tmp_path, b"cnosuchmodule_hopdec\nthing\n.")
    with pytest.raises(ConfigError, match="data_batch_1: refused: it names nosuchmodule_hopdec.thing"):
        load_dataset("cifar10", data_dir=str(tmp_path))


@pytest.mark.parametrize("array", [np.array([b"x", 1], dtype=object), np.arange(4, dtype=np.float64)])
def test_numpy_arrays_other_than_uint8_are_refused(array):
    from hopdec.ml.safe_pickle import RefusedPickle, loads_batch
    with pytest.raises(RefusedPickle, match="dtype|array of float64"):
        loads_batch(pickle.dumps({b"data": array, b"labels": []}, protocol=2))


def test_train_command_refuses_crafted_batch(tmp_path):
    marker = tmp_path / "ran"
    write_cifar(tmp_path, evil(f"touch {marker}"))
    r = subprocess.run([sys.executable, "-m", "hopdec.cli", "train", "--dataset", "cifar10",
                        "--data-dir", str(tmp_path), "--iterations", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and not marker.exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "data_batch_1" in lines[0] and "os.system" in lines[0]


# ---- arrays of a size no batch has (issue 17 item 8) ---------------------------------------------------
def _reconstruct_then_build(shape_ops, data_len):
    """_reconstruct an empty ndarray, then BUILD with a uint8 state of the given shape and data length."""
    return (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R(K\x01"
            + shape_ops + b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"
            b"K\x00tb\x89T" + struct.pack("<i", data_len) + b"\0" * data_len + b"tb.")


ALLOC_ATTACKS = {
    # numpy.ndarray((2**30,), "O"): 8 GiB of object pointers from 29 bytes
    "ndarray-objects": b"\x80\x02cnumpy\nndarray\nJ\x00\x00\x00@\x85U\x01O\x86R.",
    # numpy.ndarray((2**36,), numpy.dtype("u1")): 64 GiB
    "ndarray-uint8": b"\x80\x02cnumpy\nndarray\n\x8a\x05\x00\x00\x00\x00\x10\x85cnumpy\ndtype\nU\x02u1\x85R\x86R.",
    "build-huge-shape": _reconstruct_then_build(b"J\x00\x00\x00@M\x00\x0c\x86", 16),
    "build-3d": _reconstruct_then_build(b"K\x02K\x02K\x02\x87", 8),
    "build-short-data": _reconstruct_then_build(b"K\x02M\x00\x0c\x86", 100),
}


def test_a_batch_cannot_ask_for_memory_a_real_batch_does_not_hold():
    """Each crafted batch (a few dozen bytes) asks numpy for up to 64 GiB, or for arrays of shapes no batch
    has: refused before anything is allocated (run under a 2 GiB address-space limit, so a regression is
    a MemoryError there, not a swapping machine here)."""
    prog = ("import json, resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
            "from hopdec.ml.safe_pickle import loads_batch\n"
            "out = {}\n"
            "for name, data in json.loads(sys.stdin.read()).items():\n"
            "    try:\n"
            "        x = loads_batch(bytes.fromhex(data))\n"
            "        out[name] = 'built ' + type(x).__name__\n"
            "    except Exception as err:\n"
            "        out[name] = type(err).__name__ + ': ' + str(err)[:120]\n"
            "print(json.dumps(out))\n")
    import json
    r = subprocess.run([sys.executable, "-c", prog], input=json.dumps({k: v.hex() for k, v in ALLOC_ATTACKS.items()}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name, outcome in json.loads(r.stdout).items():
        assert outcome.startswith("RefusedPickle"), (name, outcome)


def test_protocol_5_buffers_are_checked_too():
    """Protocol 5 rebuilds arrays with _frombuffer: the same shapes are refused there."""
    from hopdec.ml.safe_pickle import RefusedPickle, loads_batch
    assert loads_batch(pickle.dumps({b"data": np.zeros((2, 3072), dtype=np.uint8)}, protocol=5))[b"data"].shape \
        == (2, 3072)
    for shape in ((2, 3073), (2, 2, 768), (1, 1, 1, 3072)):
        with pytest.raises(RefusedPickle):
            loads_batch(pickle.dumps({b"data": np.zeros(shape, dtype=np.uint8)}, protocol=5))
