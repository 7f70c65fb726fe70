"""The flat-buffer trainer: parameters and gradients are views of one tensor, and SGD is unchanged."""

import copy

import numpy as np
import pytest
import torch

from hopdec.ml.data import load_dataset, partition
from hopdec.report.gaps import max_iteration_gap
from hopdec.runtime.metrics import format_table
from hopdec.ml.trainer import LocalTrainer
from hopdec.runtime.context import pick_device


def make(seed=0, **kw):
    ds = load_dataset("digits", seed=0)
    return LocalTrainer("cnn", ds, partition(ds.train_y, 2, 0, "iid", 0), lr=0.05, momentum=0.9,
                        weight_decay=1e-4, batch_size=16, seed=seed, **kw)


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    t = make()
    params = list(t.model.parameters())
    assert sum(p.numel() for p in params) == t.numel == t.flat.numel()
    for p in params:
        assert p.data.untyped_storage().data_ptr() == t.flat.data.untyped_storage().data_ptr()
    with torch.no_grad():
        t.flat.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in params)       # writing the buffer writes the model
    t.load_params(np.arange(t.numel, dtype=np.float32))
    t.compute()
    flat_from_params = torch.cat([p.grad.reshape(-1) for p in params])
    assert torch.equal(flat_from_params, t.flat.grad) and float(t.flat.grad.abs().sum()) > 0


def test_flat_sgd_matches_torch_sgd_on_the_unflattened_model():
    t = make(seed=1)
    ref = copy.deepcopy(t.model)
    for p, q in zip(ref.parameters(), t.model.parameters()):
        p.data = q.detach().clone()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    stream = make(seed=1).stream                          # the same batches
    for _ in range(5):
        t.compute()
        t.apply()
        xb, yb = next(stream)
        opt.zero_grad()
        t.criterion(ref(xb), yb).backward()
        opt.step()
    got = t.write_params()
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()]).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_reduce_is_the_weighted_sum_with_self_in_place():
    t = make()
    own = t.write_params()
    other = np.ones(t.numel, dtype=np.float32)
    t.reduce([(None, 0.25), (other, 0.75)])
    np.testing.assert_allclose(t.write_params(), 0.25 * own + 0.75, rtol=1e-6, atol=1e-6)


def test_evaluate_given_parameters_leaves_the_model_alone():
    t = make()
    before = t.write_params()
    loss, acc = t.evaluate(np.zeros(t.numel, dtype=np.float32))
    assert 0 <= acc <= 1 and loss > 0
    np.testing.assert_array_equal(t.write_params(), before)


def test_pick_device_auto(monkeypatch):
    """auto: CPU without CUDA; with CUDA, local rank mod the number of GPUs (asserted on any machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto", 3) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("auto", 3) == torch.device("cuda:1")
    # --device cuda: the same GPU as auto, named (before: "cuda", every rank on the current GPU, the logs
    # and the summary not saying which)
    assert pick_device("cuda", 3) == torch.device("cuda:1") and pick_device("cuda:0", 3) == torch.device("cuda:0")
    assert pick_device("cpu", 0) == torch.device("cpu")


def test_reduce_swaps_buffers_instead_of_copying_back():
    """Reduce writes the spare buffer and makes it the parameters; the model's parameter views and the
    optimizer's momentum follow the flat tensor across swaps."""
    t = make()
    x = t.write_params()
    other = np.ones(t.numel, dtype=np.float32)
    t.reduce([(None, 0.5), (other, 0.5)])
    np.testing.assert_allclose(t.write_params(), 0.5 * x + 0.5, rtol=1e-6)
    a = t.flat.data_ptr()
    p0 = next(t.model.parameters())
    assert p0.data_ptr() == a                                    # the module sees the new buffer
    t.compute()
    t.apply()
    state = t.optimizer.state[t.flat]
    t.reduce([(None, 1.0)])
    b = t.flat.data_ptr()
    t.reduce([(None, 1.0)])
    assert a != b and t.flat.data_ptr() == a                     # two buffers, alternating
    assert t.optimizer.state[t.flat] is state


def test_the_optimizer_and_the_trainer_share_one_flat_model():
    """One flat-buffer implementation (double buffering, zero-copy sends, Reduce) for ``hopdec train`` and
    the optimizer of a user's loop: neither carries its own copy of the averaging."""
    from hopdec.ml.trainer import FlatModel, FlatSGD
    from hopdec.optim import hop
    assert issubclass(LocalTrainer, FlatSGD) and issubclass(FlatSGD, FlatModel)
    import inspect
    src = inspect.getsource(hop)
    assert "FlatModel(" in src and "weighted_sum_into" not in src


def test_max_iteration_gap_replays_entry_times():
    # rank 0 enters 0,1,2 at t=0,1,2; rank 1 enters 0 at t=0 and 1 at t=5
    gap = max_iteration_gap([[(0, 0), (1, 1), (2, 2)], [(0, 0), (5, 1)]])
    assert gap[0, 1] == 2 and gap[1, 0] == 0
    # a jump counts with its size; events at the same time are applied together
    gap = max_iteration_gap([[(0, 0), (3, 4)], [(0, 0), (3, 1)]])
    assert gap[0, 1] == 3


def test_format_table_aligns_columns():
    text = format_table(["a", "bb"], [[1, 2.5], [10, None]])
    lines = text.splitlines()
    assert lines[0] == " a   bb" and lines[2] == " 1  2.5" and lines[3] == "10    -"


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.0, 1e-3)])
def test_the_flat_sgd_steps_exactly_as_torch_sgd(momentum, wd):
    """``hopdec train``'s optimizer (no torch._dynamo import at start-up) gives torch.optim.SGD's
    parameters bit for bit, step after step, and keeps the momentum where checkpoints read it."""
    from hopdec.ml.trainer import FlatMomentumSGD
    g = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(1000, generator=g))
    b = torch.nn.Parameter(a.detach().clone())
    ours = FlatMomentumSGD([a], lr=0.05, momentum=momentum, weight_decay=wd)
    ref = torch.optim.SGD([b], lr=0.05, momentum=momentum, weight_decay=wd)
    for _ in range(5):
        grad = torch.randn(1000, generator=g)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
        assert torch.equal(a, b)
    if momentum:
        assert torch.equal(ours.state[a]["momentum_buffer"], ref.state[b]["momentum_buffer"])
