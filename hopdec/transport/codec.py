"""Compressed exchanges: ``--compress fp16|bf16|int8|topk:F`` -- the codecs and the layout of a coded message.

A codec turns a float32 vector into fewer bytes and back (:meth:`Codec.encode`, :meth:`Codec.decode_add`).
What is coded is never the parameters themselves but the *difference* between a sender's parameters and
the copy its receivers hold of them (Choco-SGD's public copy, :mod:`hopdec.transport.streams`), so what a
message leaves out stays in the difference and goes with the next one (error feedback). The same scheme
serves every codec: direct quantization of the parameters (``C(x + e)``) would average zeros into the
receivers with top-k, and spends fp16/bf16/int8's precision on the parameters' magnitude rather than on
their change, which is one to two orders of magnitude smaller.

Wire layout (one uint8 buffer per message, nothing pickled): four int64 header fields -- iteration, carried
token grant (-1: none), the stream's sequence number, the kind -- then the payload:

* ``KEY``: float32 x numel, the full parameters (the first message of every stream: the receiver's copy
  starts exact, whatever the workers' initial parameters were);
* ``fp16`` / ``bf16``: 2 bytes per parameter (bf16 rounded to nearest even; fp16 saturates at 65504);
* ``int8``: one float32 scale per chunk of :data:`INT8_CHUNK` parameters (max |value| / 127), then 1 byte
  per parameter (round to nearest);
* ``topk:F``: the k = ceil(F * numel) largest |values|: k int32 indices (ascending), then k float32 values.

``--compress none`` (the default) is not a codec: the plain float32 message of :mod:`hopdec.transport.mpi`.
"""

import math
from dataclasses import dataclass

import numpy as np

from hopdec.errors import ConfigError

HEADER_FIELDS = 4
HEADER_BYTES = 8 * HEADER_FIELDS
ITERATION, GRANT, SEQ, KIND = range(HEADER_FIELDS)
"""Indices of the int64 header fields of a coded message."""

KEY, FP16, BF16, INT8, TOPK = range(5)
KIND_NAMES = {KEY: "key", FP16: "fp16", BF16: "bf16", INT8: "int8", TOPK: "topk"}
CODECS = ("none", "fp16", "bf16", "int8", "topk")

INT8_CHUNK = 256
"""Parameters per int8 scale: 1.6% of the payload for scales, and one large value only coarsens 255 others."""

FP16_MAX = 65504.0


@dataclass(frozen=True)
class CompressSpec:
    """What ``--compress`` asks for: a codec (``fraction`` for top-k) and Choco's consensus step ``gamma``
    (Reduce moves a worker ``gamma`` of the way to its neighbours' average; 1, the default: the plain
    weighted average)."""

    codec: str = "none"
    fraction: float = None
    gamma: float = 1.0

    @property
    def lossless(self):
        return self.codec == "none"

    def __str__(self):
        name = f"topk:{self.fraction:g}" if self.codec == "topk" else self.codec
        return name + (f",gamma={self.gamma:g}" if self.gamma != default_gamma(self.codec, self.fraction) else "")


def default_gamma(codec, fraction=None):
    """Choco's consensus step when ``gamma=`` is not given: 1, the plain weighted average of the copies, for
    every codec. Measured (experiments/README.md, "Compressed exchanges"): on the digits CNN, ring-based 8,
    top-1% reached the same loss at gamma 1 and 0.3 and a worse one at 0.04; in pure gossip gamma < 1 only
    slows consensus, while it moves the workers' mean less (the copies' lag shifts it, see
    :func:`hopdec.hop.receive.damped`)."""
    return 1.0


def parse_compress(text):
    """``none|fp16|bf16|int8|topk:F`` with an optional ``,gamma=G`` -> :class:`CompressSpec`.

    >>> str(parse_compress("topk:0.01")), parse_compress("int8,gamma=0.5").gamma
    ('topk:0.01', 0.5)
    """
    if text is None:
        return CompressSpec()
    if isinstance(text, CompressSpec):
        return text
    head, *rest = str(text).strip().split(",")
    name, _, arg = head.partition(":")
    name = name.strip()
    bad = (f"--compress {text!r}: expected none, fp16, bf16, int8 or topk:F (0 < F <= 1), optionally "
           f"followed by ,gamma=G (0 < G <= 1)")
    if name not in CODECS or (name == "topk") != bool(arg):
        raise ConfigError(bad)
    fraction = None
    if name == "topk":
        try:
            fraction = float(arg)
        except ValueError:
            raise ConfigError(bad) from None
        if not (0 < fraction <= 1):
            raise ConfigError(f"--compress {text!r}: the top-k fraction F must be in (0, 1]")
    gamma = default_gamma(name, fraction)
    for part in rest:
        key, _, val = part.partition("=")
        try:
            gamma = float(val)
        except ValueError:
            raise ConfigError(bad) from None
        if key.strip() != "gamma" or not (0 < gamma <= 1):
            raise ConfigError(bad)
    if name == "none" and gamma != 1.0:
        raise ConfigError(f"--compress {text!r}: gamma applies to a codec (none reduces exactly)")
    return CompressSpec(name, fraction, gamma)


def header(buf):
    """The int64 header fields of a coded message buffer (a view)."""
    return buf[:HEADER_BYTES].view(np.int64)


def payload(buf):
    return buf[HEADER_BYTES:]


class Codec:
    """Encodes float32 vectors of ``numel`` values into ``payload_bytes`` bytes, and adds them back."""

    kind = None
    name = None

    def __init__(self, numel):
        self.numel = int(numel)
        self.payload_bytes = self._payload_bytes()

    def message_bytes(self):
        return HEADER_BYTES + self.payload_bytes

    def encode(self, delta, out):
        """Write the code of float32 ``delta`` into uint8 ``out`` (``payload_bytes`` long)."""
        raise NotImplementedError

    def decode_add(self, code, into):
        """``into += decoded(code)``: the sender applies it to its copy and every receiver to theirs, with
        the same operations on the same bytes, so all copies stay bit-identical."""
        raise NotImplementedError


class _Half(Codec):
    """fp16 / bf16: two bytes per value, converted by torch (round to nearest even)."""

    def _payload_bytes(self):
        return 2 * self.numel

    def _half(self, code):
        import torch
        return torch.from_numpy(code.view(np.int16)).view(self.dtype)

    def decode_add(self, code, into):
        import torch
        torch.from_numpy(into).add_(self._half(code))


class Fp16(_Half):
    kind, name = FP16, "fp16"

    def __init__(self, numel):
        import torch
        super().__init__(numel)
        self.dtype = torch.float16
        self._clipped = torch.empty(self.numel, dtype=torch.float32)

    def encode(self, delta, out):
        import torch
        torch.clamp(torch.from_numpy(delta), -FP16_MAX, FP16_MAX, out=self._clipped)   # no inf: saturate
        self._half(out).copy_(self._clipped)


class Bf16(_Half):
    kind, name = BF16, "bf16"

    def __init__(self, numel):
        import torch
        super().__init__(numel)
        self.dtype = torch.bfloat16

    def encode(self, delta, out):
        import torch
        self._half(out).copy_(torch.from_numpy(delta))


class Int8(Codec):
    """int8 with one float32 scale per :data:`INT8_CHUNK` values (max |value| / 127; round to nearest)."""

    kind, name = INT8, "int8"

    def _payload_bytes(self):
        self.chunks = -(-self.numel // INT8_CHUNK)
        return 4 * self.chunks + self.numel

    def __init__(self, numel):
        super().__init__(numel)
        self._work = np.empty(self.chunks * INT8_CHUNK, dtype=np.float32)

    def _split(self, code):
        return code[:4 * self.chunks].view(np.float32), code[4 * self.chunks:].view(np.int8)

    def encode(self, delta, out):
        scale, q = self._split(out)
        w = self._work
        w[self.numel:] = 0.0
        np.abs(delta, out=w[:self.numel])
        rows = w.reshape(self.chunks, INT8_CHUNK)
        np.max(rows, axis=1, out=scale)
        scale /= 127.0
        safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
        np.copyto(w[:self.numel], delta, casting="same_kind")
        rows /= safe[:, None]
        np.rint(rows, out=rows)
        np.clip(rows, -127, 127, out=rows)
        np.copyto(q, w[:self.numel], casting="unsafe")

    def decode_add(self, code, into):
        scale, q = self._split(code)
        w = self._work
        w[self.numel:] = 0.0
        np.copyto(w[:self.numel], q, casting="unsafe")
        rows = w.reshape(self.chunks, INT8_CHUNK)
        rows *= scale[:, None]
        np.add(into, w[:self.numel], out=into)


class TopK(Codec):
    """The k largest |values| (k = ceil(F * numel)): their indices (int32, ascending) and values (float32)."""

    kind, name = TOPK, "topk"

    def __init__(self, numel, fraction):
        self.k = max(1, min(int(numel), math.ceil(fraction * numel - 1e-9)))
        super().__init__(numel)
        self._abs = np.empty(self.numel, dtype=np.float32)

    def _payload_bytes(self):
        return 8 * self.k

    def _split(self, code):
        return code[:4 * self.k].view(np.int32), code[4 * self.k:].view(np.float32)

    def encode(self, delta, out):
        idx, val = self._split(out)
        np.abs(delta, out=self._abs)
        if self.k < self.numel:
            import torch                                # its top-k is several times numpy's argpartition
            top = torch.from_numpy(self._abs).topk(self.k, sorted=False).indices.numpy()
        else:
            top = np.arange(self.numel)
        top.sort()
        idx[:] = top
        np.take(delta, top, out=val)

    def decode_add(self, code, into):
        idx, val = self._split(code)
        into[idx] += val


def make_codec(spec, numel):
    """The codec of a :class:`CompressSpec` for vectors of ``numel`` (None for ``none``)."""
    spec = parse_compress(spec)
    if spec.codec == "none":
        return None
    if spec.codec == "topk":
        return TopK(numel, spec.fraction)
    return {"fp16": Fp16, "bf16": Bf16, "int8": Int8}[spec.codec](numel)


def key_bytes(numel):
    """Bytes of a key message (the full float32 parameters and the header)."""
    return HEADER_BYTES + 4 * int(numel)


def message_bytes(spec, numel):
    """Bytes one update message puts on the wire: the coded message of ``spec``, or for ``none`` the float32
    message of :mod:`hopdec.transport.mpi` (parameters, padding, two int64 header fields)."""
    codec = make_codec(spec, numel)
    if codec is None:
        from hopdec.transport.message import message_floats
        return 4 * message_floats(int(numel), 2)
    return codec.message_bytes()
