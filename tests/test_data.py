"""Datasets load offline with the right shapes; shards are disjoint, covering and deterministic."""

import os
import pickle

import numpy as np
import pytest
import torch

from hopdec.ml.data import (CIFAR10_MEAN, CIFAR10_STD, Dataset, batches, load_dataset, partition,
                         steps_per_epoch)
from hopdec.errors import ConfigError


def test_digits_default_offline_shapes(monkeypatch):
    import socket

    def no_network(*a, **k):
        raise AssertionError("load_dataset tried to open a network connection")
    monkeypatch.setattr(socket, "socket", no_network)
    ds = load_dataset()
    assert isinstance(ds, Dataset) and ds.name == "digits"
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert tuple(ds.train_x.shape[1:]) == (1, 8, 8)
    assert len(ds.train_y) + len(ds.test_y) == 1797
    assert abs(len(ds.test_y) / 1797 - 0.2) < 0.01
    assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
    assert set(ds.test_y.tolist()) == set(range(10))  # stratified: every class in test
    again = load_dataset("digits")
    assert torch.equal(again.test_y, ds.test_y)  # fixed split


def _write_cifar(root, n=10):
    rng = np.random.default_rng(0)
    batches_written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(root / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
        batches_written[name] = (data, labels)
    return batches_written


@pytest.mark.parametrize("nested", [False, True])
def test_cifar10_from_pickle_batches(tmp_path, nested):
    root = tmp_path / "cifar-10-batches-py" if nested else tmp_path
    root.mkdir(exist_ok=True)
    written = _write_cifar(root)
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.train_x.shape == (50, 3, 32, 32) and ds.test_x.shape == (10, 3, 32, 32)
    assert ds.train_y.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert ds.test_y.tolist() == written["test_batch"][1]
    # Channel layout and per-channel normalisation: pixel 0 of channel 1 of image 0.
    raw = written["data_batch_1"][0][0, 1024] / 255.0
    assert ds.train_x[0, 1, 0, 0].item() == pytest.approx((raw - CIFAR10_MEAN[1]) / CIFAR10_STD[1], abs=1e-5)


def test_cifar10_missing_dir_says_how(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset("cifar10", data_dir=str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert "nowhere" in msg and "cifar" in msg.lower() and "\n" not in msg
    with pytest.raises(ConfigError, match="data-dir"):
        load_dataset("cifar10")


def test_cifar10_bad_batch_names_file(tmp_path):
    _write_cifar(tmp_path)
    (tmp_path / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="data_batch_3"):
        load_dataset("cifar10", data_dir=str(tmp_path))


def test_libsvm_split_and_labels(tmp_path):
    f = tmp_path / "spam.svm"
    lines = [f"{'+1' if i % 2 else '-1'} 1:{i / 10} 3:0.5" for i in range(10)]
    f.write_text("\n".join(lines) + "\n")
    ds = load_dataset("libsvm", path=str(f), seed=1)
    assert ds.num_classes == 2 and ds.input_shape == (3,)
    assert len(ds.train_y) == 8 and len(ds.test_y) == 2
    assert set(torch.cat([ds.train_y, ds.test_y]).tolist()) == {0, 1}
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    # +1 rows have odd i, i.e. feature 1 = i/10 with odd i.
    for xrow, yrow in zip(ds.train_x, ds.train_y):
        assert int(round(xrow[0].item() * 10)) % 2 == yrow.item()
    same = load_dataset("libsvm", path=str(f), seed=1)
    assert torch.equal(same.test_x, ds.test_x)


def test_libsvm_separate_test_file_fewer_features(tmp_path):
    tr, te = tmp_path / "train.svm", tmp_path / "test.svm"
    tr.write_text("1 1:1 5:2\n0 2:1\n1 5:1\n")
    te.write_text("0 1:3\n1 2:4\n")
    ds = load_dataset("libsvm", path=str(tr), test_path=str(te))
    assert ds.input_shape == (5,) and ds.train_x.shape == (3, 5) and ds.test_x.shape == (2, 5)
    assert ds.test_x[1].tolist() == [0, 4, 0, 0, 0]
    assert ds.train_y.tolist() == [1, 0, 1] and ds.test_y.tolist() == [0, 1]


def test_libsvm_bad_inputs_name_the_file(tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("this is not libsvm\n")
    with pytest.raises(ConfigError, match="bad.svm"):
        load_dataset("libsvm", path=str(bad))
    multi = tmp_path / "multi.svm"
    multi.write_text("1 1:1\n2 1:2\n3 1:3\n")
    with pytest.raises(ConfigError, match="multi.svm.*binary"):
        load_dataset("libsvm", path=str(multi))
    with pytest.raises(ConfigError, match="missing.svm"):
        load_dataset("libsvm", path=str(tmp_path / "missing.svm"))
    with pytest.raises(ConfigError, match="data-path"):
        load_dataset("libsvm")


def test_libsvm_path_that_is_not_a_regular_file_says_so(tmp_path):
    """A FIFO or a directory given as the LIBSVM file is named for what it is, not "not found"."""
    fifo = tmp_path / "pipe.svm"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="pipe.svm: not a regular file") as err:
        load_dataset("libsvm", path=str(fifo))
    assert "not found" not in str(err.value) and "no such" not in str(err.value)
    with pytest.raises(ConfigError, match="is a directory"):
        load_dataset("libsvm", path=str(tmp_path))
    with pytest.raises(ConfigError, match="missing.svm: no such file"):
        load_dataset("libsvm", path=str(tmp_path / "missing.svm"))


def test_unknown_dataset():
    with pytest.raises(ConfigError, match="'mnist'.*digits"):
        load_dataset("mnist")


@pytest.mark.parametrize("scheme", ["iid", "noniid"])
def test_partition_disjoint_covering_deterministic(scheme):
    y = torch.arange(103) % 10
    parts = [partition(y, 4, r, scheme, seed=7) for r in range(4)]
    allidx = torch.cat(parts).tolist()
    assert sorted(allidx) == list(range(103))  # disjoint and covering
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(p.dtype == torch.int64 for p in parts)
    assert all(torch.equal(p, partition(y, 4, r, scheme, seed=7)) for r, p in enumerate(parts))
    assert not all(torch.equal(p, partition(y, 4, r, scheme, seed=8)) for r, p in enumerate(parts))


def test_partition_of_per_position_targets_splits_samples():
    """A language model's targets are (samples, positions) tensors: the shards split the samples (a
    flattened (N, T) tensor gave indices up to N*T, out of range: IndexError in the first batch)."""
    y = torch.randint(0, 256, (50, 8))
    parts = [partition(y, 4, r, "iid", seed=1) for r in range(4)]
    assert sorted(torch.cat(parts).tolist()) == list(range(50))
    with pytest.raises(ConfigError, match="noniid.*one class per sample"):
        partition(y, 4, 0, "noniid")


def test_partition_noniid_is_label_skewed():
    y = load_dataset("digits").train_y
    iid = [len(set(y[partition(y, 5, r, "iid")].tolist())) for r in range(5)]
    non = [len(set(y[partition(y, 5, r, "noniid")].tolist())) for r in range(5)]
    assert all(k == 10 for k in iid)
    assert all(k <= 3 for k in non)


def test_partition_errors():
    with pytest.raises(ConfigError, match="scheme"):
        partition(torch.zeros(4), 2, 0, "dirichlet")
    with pytest.raises(ConfigError, match="part 2"):
        partition(torch.zeros(4), 2, 2)


def test_batches_deterministic_and_epochs():
    x = torch.arange(10).float().unsqueeze(1)
    y = torch.arange(10)
    idx = torch.tensor([1, 3, 5, 7, 9])
    a, b = batches(x, y, idx, 2, seed=3), batches(x, y, idx, 2, seed=3)
    seq_a = [next(a)[1].tolist() for _ in range(9)]
    seq_b = [next(b)[1].tolist() for _ in range(9)]
    assert seq_a == seq_b
    assert steps_per_epoch(5, 2) == 3
    epoch1 = sum(seq_a[:3], [])
    epoch2 = sum(seq_a[3:6], [])
    assert sorted(epoch1) == sorted(epoch2) == [1, 3, 5, 7, 9]  # each epoch visits each index once
    assert epoch1 != epoch2 or sum(seq_a[6:9], []) != epoch1  # reshuffled between epochs
    xb, yb = next(batches(x, y, idx, 2, seed=4))
    assert torch.equal(xb.squeeze(1).long(), yb)
    other = [next(batches(x, y, idx, 5, seed=s))[1].tolist() for s in range(5)]
    assert len({tuple(o) for o in other}) > 1  # different seeds, different orders


def test_libsvm_dense_size_is_checked_before_allocating(tmp_path, monkeypatch):
    # 110 bytes: feature index 2e9 on 10 samples would be 75 GiB dense
    small = tmp_path / "wide.svm"
    small.write_text("+1 2000000000:1\n-1 1:1\n" * 5)
    assert small.stat().st_size < 200
    monkeypatch.setattr("hopdec.limits.host_memory_bytes", lambda: 64 * 2 ** 30)
    with pytest.raises(ConfigError) as err:
        load_dataset("libsvm", path=str(small))
    msg = str(err.value)
    assert msg.startswith(str(small)) and "10 samples x 2000000000 features" in msg
    assert "would need 149 GiB of memory, more than this host's 64 GiB" in msg and "\n" not in msg
    # a narrow training file with a wide test file: the padded training matrix is counted too
    narrow = tmp_path / "narrow.svm"
    narrow.write_text("+1 1:1\n-1 2:1\n" * 500)
    one = tmp_path / "one.svm"
    one.write_text("+1 20000000:1\n")                             # 80 MB alone; 80 GB padded
    with pytest.raises(ConfigError, match=r"narrow.svm and .*one.svm: 1001 samples x 20000000 "
                                          r"features .* would need 75 GiB"):
        load_dataset("libsvm", path=str(narrow), test_path=str(one))


def test_libsvm_wide_file_refused_on_any_host(tmp_path):
    wide = tmp_path / "wider.svm"
    wide.write_text("+1 2000000000:1\n" * 1000)                  # 15 TiB dense: more than any host
    with pytest.raises(ConfigError, match="wider.svm: 1000 samples x 2000000000 features"):
        load_dataset("libsvm", path=str(wide))
    huge = tmp_path / "huge.svm"
    huge.write_text("+1 200000000000:1\n-1 1:1\n")                # overflows the reader's int
    with pytest.raises(ConfigError, match="huge.svm: a feature index too large"):
        load_dataset("libsvm", path=str(huge))
