"""Models and their losses (Hop sec. 7.1-7.2); their default hyper-parameters and sizes, which need no torch,
are in :mod:`hopdec.ml.catalog`.

``build_model`` is deterministic under ``torch.manual_seed``, so every rank can start from the
same weights. Normalisation in vgg11 (``norm``): the default "batch" is BatchNorm *without*
running statistics (``track_running_stats=False``): it trains like ordinary BN (in a short CPU
check at the paper's lr 0.1, VGG-11 with BN learned while no-norm and GroupNorm stayed at chance
loss), yet has no buffers, so gossip averaging of parameters covers all model state. The price:
eval also normalises with the batch's statistics, so evaluate in large batches (hundreds). "running" is classic BN (running
mean/var are buffers: per-worker unless the engine averages them too); "group"; "none".
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch
from torch import nn

from hopdec.errors import ConfigError

from hopdec.ml.catalog import NORMS, PRESETS, default_model_for  # noqa: F401  (torch-free, re-exported)
from hopdec.ml.registry import MODELS, is_entry_point

# VGG configuration A (VGG-11): numbers are conv widths, "M" a 2x2 max-pool.
VGG11_CFG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class SmallCNN(nn.Module):
    """Two 3x3 conv layers (32, 64 channels), one 2x2 pool, then a 128-unit classifier.

    Sized for 1x8x8 digits; adaptive pooling makes it accept any CxHxW with H, W >= 2.
    """

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveMaxPool2d((4, 4)),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(inplace=True), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def _norm_layer(kind: str, channels: int):
    """The layer after each conv: see the module docstring for why "batch" is the default."""
    if kind == "batch":
        return [nn.BatchNorm2d(channels, track_running_stats=False)]
    if kind == "running":
        return [nn.BatchNorm2d(channels)]
    if kind == "group":
        return [nn.GroupNorm(min(32, channels), channels)]
    return []


class VGG11(nn.Module):
    """VGG-11 (configuration A) for 3x32x32 inputs; ``norm`` after each conv (see module docstring)."""

    def __init__(self, in_channels: int, num_classes: int, norm: str = "batch"):
        super().__init__()
        layers, c = [], in_channels
        for v in VGG11_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), *_norm_layer(norm, v), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        # 5 pools: 32x32 -> 1x1. Other sizes go through an adaptive pool to 1x1.
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(inplace=True),
            nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Linear(512, num_classes))
        for m in self.modules():  # Kaiming init, as in torchvision's VGG
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)))


class LinearSVM(nn.Module):
    """A linear model w.x + b: one logit for binary problems (trained with log loss), else one per class."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.binary = num_classes == 2
        self.linear = nn.Linear(in_features, 1 if self.binary else num_classes)

    def forward(self, x):
        out = self.linear(x.flatten(1))
        return out.squeeze(1) if self.binary else out


def _mlp(in_features: int, num_classes: int) -> nn.Module:
    """Flatten, one hidden layer of 128 ReLU units."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, 128), nn.ReLU(inplace=True),
                         nn.Linear(128, num_classes))


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t (one fused q, k, v projection)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) (4x wide, GELU)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    """A GPT-style causal language model: token + learned position embeddings, ``layers`` pre-norm blocks,
    a final LayerNorm and an output layer tied to the token embedding. Input (B, T) token ids with
    T <= ``context``; output (B, T, vocab) logits of the next token at every position. No dropout: the
    same seed gives the same model and the same run."""

    def __init__(self, vocab: int, context: int, dim: int = 128, layers: int = 4, heads: int = 4):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight                  # tied weights: one parameter, used twice
        for m in self.modules():                            # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:                           # residual projections scaled by depth
            nn.init.normal_(block.attn.proj.weight, std=0.02 / (2 * layers) ** 0.5)
            nn.init.normal_(block.mlp[2].weight, std=0.02 / (2 * layers) ** 0.5)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        return self.head(self.ln(x))


class LMLoss(nn.Module):
    """Cross-entropy of the next token at every position: logits (B, T, V), targets (B, T)."""

    def forward(self, logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def build_model(name: str, input_shape: Sequence[int], num_classes: int,
                norm: str = "batch") -> nn.Module:
    """A fresh model; call ``torch.manual_seed`` first for identical weights on every rank.

    ``norm`` (vgg11 only): "batch" (default; BN on batch statistics, no buffers), "running"
    (classic BN with running-stat buffers), "group" or "none".
    """
    shape = tuple(int(s) for s in input_shape)
    if is_entry_point(name):                        # --model module:factory (yours)
        from hopdec.ml.user import build
        return build(name, shape, num_classes)
    if norm not in NORMS:
        raise ConfigError(f"--norm {norm!r}: unknown normalisation (expected one of {', '.join(NORMS)})")
    if num_classes < 2:
        raise ConfigError(f"--model {name}: need at least 2 classes, got {num_classes}")
    if name in ("cnn", "vgg11"):
        if len(shape) != 3:
            raise ConfigError(f"--model {name}: needs CxHxW image input, dataset gives shape {shape}")
        if name == "cnn":
            return SmallCNN(shape[0], num_classes)
        if min(shape[1:]) < 32:
            raise ConfigError(f"--model vgg11: needs images of at least 32x32, dataset gives {shape}")
        return VGG11(shape[0], num_classes, norm)
    if name == "svm":
        return LinearSVM(_numel(shape), num_classes)
    if name == "mlp":
        return _mlp(_numel(shape), num_classes)
    if name == "transformer":
        if len(shape) != 1:
            raise ConfigError(f"--model transformer: needs token sequences (a text dataset such as kjv), "
                              f"dataset gives shape {shape}")
        return TransformerLM(num_classes, shape[0])
    raise ConfigError(f"--model {name!r}: unknown model (expected one of {', '.join(MODELS)})")


def parameter_count(name: str, input_shape: Sequence[int], num_classes: int, norm: str = "batch") -> int:
    """Trainable parameters of ``build_model(...)``, counted on the meta device (nothing allocated)."""
    return parameter_layout(name, input_shape, num_classes, norm)[0]


def tensor_layout(tensors: Sequence[torch.Tensor]) -> list[int]:
    """``[numbers, tensors, crc32 of their shapes, crc32 of their strides]``: what every rank exchanging one
    flat buffer of ``tensors`` must agree on (JSON-ready; compared by :func:`layout_difference`)."""
    shapes, strides = [list(t.shape) for t in tensors], [list(t.stride()) for t in tensors]
    return [sum(t.numel() for t in tensors), len(tensors), zlib.crc32(repr(shapes).encode()),
            zlib.crc32(repr(strides).encode())]


def layout_difference(r: int, mine: Sequence[int], ref: Sequence[int]) -> str:
    """One line on how rank ``r``'s :func:`tensor_layout` differs from rank 0's. Without the comparison a
    rank whose model was built differently (a rank-dependent size) exchanged messages of another length and
    the job ended on MPI's ``MPI_ERR_IN_STATUS``; one whose model alone was ``channels_last`` averaged its
    elements with others in another order, silently (the buffer holds each tensor in its own layout)."""
    (n0, t0, s0, _), (n1, t1, s1, _) = ref, mine
    if (n0, t0) != (n1, t1):
        differs = f"rank 0 averages {n0:,} numbers in {t0} tensors, rank {r} {n1:,} in {t1}"
    elif s0 != s1:
        differs = f"rank 0's and rank {r}'s tensors have the same sizes in all but different shapes"
    else:
        differs = (f"rank 0's and rank {r}'s tensors have the same shapes but different memory layouts "
                   f"(strides: channels_last on some ranks only?)")
    return (f"the ranks' models differ: {differs}; every rank must build the same model (the messages are "
            f"the whole parameter buffer)")


def parameter_layout(name: str, input_shape: Sequence[int], num_classes: int,
                     norm: str = "batch") -> list[int]:
    """The :func:`tensor_layout` of ``build_model(...)``'s trainable parameters, built on the meta device."""
    try:
        with torch.device("meta"):
            model = build_model(name, input_shape, num_classes, norm=norm)
    except Exception:       # a factory of yours that cannot build on meta (int(torch.tensor(shape).prod())
        model = build_model(name, input_shape, num_classes, norm=norm)    # came back as "the factory raised");
        # a real error is raised again here
    return tensor_layout([p for p in model.parameters() if p.requires_grad])


class _BinaryLogLoss(nn.Module):
    """Log loss on one logit per sample: BCE-with-logits with the int labels cast to float."""

    def __init__(self):
        super().__init__()
        self.bce = nn.BCEWithLogitsLoss()

    def forward(self, logits, target):
        if logits.dim() == 2:  # a multi-class "svm": fall back to softmax log loss
            return nn.functional.cross_entropy(logits, target)
        return self.bce(logits, target.float())


def loss_fn(name: str, model: nn.Module = None) -> nn.Module:
    """The training criterion: log loss (BCE with logits) for svm, next-token cross-entropy for the
    transformer, cross-entropy otherwise; a model of your own: its ``loss`` method, else cross-entropy over
    the last dimension (:class:`hopdec.ml.user.UserLoss`)."""
    if is_entry_point(name):
        from hopdec.ml.user import UserLoss
        return UserLoss(model)
    if name not in MODELS:
        raise ConfigError(f"--model {name!r}: unknown model (expected one of {', '.join(MODELS)})")
    if name == "transformer":
        return LMLoss()
    return _BinaryLogLoss() if name == "svm" else nn.CrossEntropyLoss()


def predict(name: str, logits: torch.Tensor) -> torch.Tensor:
    """Class indices (int64) from model output, for accuracy; svm: logit > 0 -> class 1; transformer: the
    most likely next token at every position."""
    if name == "svm" and logits.dim() == 1:
        return (logits > 0).long()
    return logits.argmax(dim=-1)
