"""Models build deterministically, give the right shapes, train, and carry the paper's presets."""

import pytest
import torch

from hopdec.ml.data import batches, load_dataset
from hopdec.errors import ConfigError
from hopdec.ml.models import PRESETS, build_model, default_model_for, loss_fn, predict


@pytest.mark.parametrize("name,shape,classes,out", [
    ("cnn", (1, 8, 8), 10, (5, 10)),
    ("cnn", (3, 32, 32), 10, (5, 10)),
    ("vgg11", (3, 32, 32), 10, (5, 10)),
    ("mlp", (1, 8, 8), 10, (5, 10)),
    ("svm", (7,), 2, (5,)),
    ("svm", (7,), 3, (5, 3)),
])
def test_forward_shapes(name, shape, classes, out):
    torch.manual_seed(0)
    m = build_model(name, shape, classes).eval()
    with torch.no_grad():
        logits = m(torch.randn(5, *shape))
    assert tuple(logits.shape) == out
    pred = predict(name, logits)
    assert pred.shape == (5,) and pred.dtype == torch.int64
    assert int(pred.min()) >= 0 and int(pred.max()) < classes


def test_vgg11_is_configuration_a_with_norm_choices():
    m = build_model("vgg11", (3, 32, 32), 10)
    convs = [c.out_channels for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    assert convs == [64, 128, 256, 256, 512, 512, 512, 512]
    assert sum(isinstance(c, torch.nn.MaxPool2d) for c in m.modules()) == 5
    assert list(m.buffers()) == []  # BN on batch stats: all state is parameters, gossip averages it
    assert sum(isinstance(c, torch.nn.BatchNorm2d) for c in m.modules()) == 8
    bn = build_model("vgg11", (3, 32, 32), 10, norm="running")
    assert len(list(bn.buffers())) > 0
    gn = build_model("vgg11", (3, 32, 32), 10, norm="group")
    assert list(gn.buffers()) == [] and any(isinstance(c, torch.nn.GroupNorm) for c in gn.modules())
    plain = build_model("vgg11", (3, 32, 32), 10, norm="none")
    assert not any(isinstance(c, (torch.nn.GroupNorm, torch.nn.BatchNorm2d)) for c in plain.modules())


def test_deterministic_init():
    torch.manual_seed(3)
    a = build_model("cnn", (1, 8, 8), 10)
    torch.manual_seed(3)
    b = build_model("cnn", (1, 8, 8), 10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread (and do not fight other test processes for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_cnn_sgd_on_digits_cuts_loss(one_thread):
    torch.manual_seed(0)
    ds = load_dataset("digits")
    m = build_model("cnn", ds.input_shape, ds.num_classes)
    p = PRESETS["cnn"]
    opt = torch.optim.SGD(m.parameters(), lr=p["lr"], momentum=p["momentum"], weight_decay=p["weight_decay"])
    crit = loss_fn("cnn")
    with torch.no_grad():
        before = crit(m(ds.test_x), ds.test_y).item()
    it = batches(ds.train_x, ds.train_y, torch.arange(len(ds.train_y)), p["batch_size"], seed=0)
    for _ in range(60):
        xb, yb = next(it)
        opt.zero_grad()
        crit(m(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        logits = m(ds.test_x)
        after = crit(logits, ds.test_y).item()
        acc = (predict("cnn", logits) == ds.test_y).float().mean().item()
    assert after < before / 2
    assert acc > 0.8


def test_svm_log_loss_learns_separable_data():
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x[:, 0] - x[:, 2] > 0).long()
    m = build_model("svm", (4,), 2)
    crit = loss_fn("svm")
    assert isinstance(crit(m(x), y), torch.Tensor)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    before = crit(m(x), y).item()
    for _ in range(50):
        opt.zero_grad()
        crit(m(x), y).backward()
        opt.step()
    after = crit(m(x), y).item()
    assert after < before / 2
    assert (predict("svm", m(x)) == y).float().mean().item() > 0.95
    # log loss = BCE with logits on float targets
    logits = torch.tensor([0.0, 2.0])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([0.0, 1.0]))
    assert crit(logits, torch.tensor([0, 1])).item() == pytest.approx(expected.item())


def test_presets_and_defaults():
    assert PRESETS["vgg11"] == {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "batch_size": 128}
    assert PRESETS["svm"] == {"lr": 10.0, "momentum": 0.9, "weight_decay": 1e-7, "batch_size": 128}
    assert PRESETS["cnn"]["batch_size"] == 32 and PRESETS["cnn"]["momentum"] == 0.9
    assert set(PRESETS) == {"cnn", "vgg11", "svm", "mlp", "transformer"}
    assert PRESETS["transformer"]["optimizer"] == "adamw" and PRESETS["transformer"]["clip"] == 1.0
    assert default_model_for("digits") == "cnn"
    assert default_model_for("kjv") == "transformer"
    assert default_model_for("cifar10") == "vgg11"
    assert default_model_for("libsvm") == "svm"
    assert isinstance(loss_fn("cnn"), torch.nn.CrossEntropyLoss)


def test_bad_model_inputs():
    with pytest.raises(ConfigError, match="'resnet'"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="vgg11.*32x32"):
        build_model("vgg11", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="cnn.*CxHxW"):
        build_model("cnn", (7,), 2)
    with pytest.raises(ConfigError, match="norm"):
        build_model("vgg11", (3, 32, 32), 10, norm="layer")
    with pytest.raises(ConfigError):
        default_model_for("mnist")
