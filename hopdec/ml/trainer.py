"""One worker's model whose parameters live in one flat buffer, with an optimizer on it (and its data shard).

:class:`FlatModel` -- parameters (and, on request, floating-point buffers such as BatchNorm statistics) in
ONE contiguous flat tensor: every ``nn.Parameter`` is a view into it, and so is every ``.grad``; sending and
averaging are single-tensor operations, with no per-parameter messages or loops. :class:`FlatSGD` adds SGD
(momentum, weight decay) on the flat tensor; :class:`LocalTrainer` adds a model, a data shard, the model's
preset optimizer (SGD, or AdamW with warmup + cosine and gradient clipping for the transformer) and
evaluation: ``t.compute(); t.reduce([...]); t.apply()``. :class:`LocalRounds` and :class:`OuterStep` make
an iteration a round of local steps with an outer step (``--local-steps``, DiLoCo).
:class:`hopdec.optim.HopOptimizer` keeps a user's own model in a :class:`FlatModel` and steps it with the
user's torch optimizer. No MPI here.
"""

import collections
import math

import numpy as np
import torch

from hopdec.ml import transfers
from hopdec.ml.data import batches
from hopdec.ml.models import build_model, loss_fn, predict
from hopdec.ml.registry import is_entry_point
from hopdec.ml.stores import StoreOrder


def view_like(data, t):
    """``data`` (a 1-D tensor of ``t.numel()`` elements) shaped and laid out as ``t``: with t's strides when
    they cover its elements densely (``channels_last`` stays ``channels_last``, a transposed parameter stays
    transposed), else contiguous. The flat buffer holds each tensor in this order, and every reader of it
    (Reduce's views, gradients, the consensus model) must use the same one."""
    return view_in(data, layout(t))


def layout(t):
    """``(size, strides or None)``: how :func:`view_like` lays out a view like ``t`` (None: contiguous)."""
    return t.size(), (t.stride() if _dense(t) else None)


def view_in(data, lay):
    """``data`` as a view of :func:`layout` ``lay`` (kept per tensor: Reduce re-points every view each step)."""
    size, stride = lay
    return data.view(size) if stride is None else data.as_strided(size, stride)


def _dense(t):
    """Whether ``t``'s strides address exactly ``t.numel()`` elements with no gap or overlap (a permutation
    of some contiguous layout)."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.size()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def flatten_parameters(module=None, params=None):
    """Move every trainable parameter of ``module`` (or the float32 tensors ``params``) into one contiguous
    float32 tensor; return it.

    The returned ``nn.Parameter`` (on the parameters' device) owns the storage: each parameter becomes a
    view into it and each ``.grad`` a view into ``flat.grad``, so one optimizer step, one copy or one
    message covers the whole model.
    """
    if params is None:
        params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    flat = torch.nn.Parameter(torch.empty(numel, dtype=torch.float32, device=device))
    flat.grad = torch.zeros(numel, dtype=torch.float32, device=device)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            view_like(flat[off:off + n], p).copy_(p)       # (in p's own layout, see view_like)
            p.data = view_like(flat.data[off:off + n], p)
            p.grad = view_like(flat.grad[off:off + n], p)
            off += n
    return flat


def write_params(flat, out=None, what="parameters"):
    """Copy ``flat`` into host array ``out`` (or a new one): the device -> host staging of a send (counted
    as ``what`` in :mod:`hopdec.ml.transfers` when it crosses)."""
    src = flat.detach()
    if out is None:
        _up(src, what)
        return src.cpu().numpy().copy()
    dst = out if torch.is_tensor(out) else torch.from_numpy(out)
    if dst.device != src.device:
        _up(src, what)
    dst.copy_(src)
    return out


def _up(t, what):
    """Count ``t`` (a tensor about to be copied to host memory) when it is on a GPU."""
    if t.device.type != "cpu":
        transfers.to_host(t.numel() * t.element_size(), what)


def _down(t, device, what):
    """``t`` on ``device``, counting the copy when it crosses from host memory to a GPU."""
    if device.type != "cpu" and t.device != device:
        transfers.to_device(t.numel() * t.element_size(), what)
    return t.to(device)


def weighted_sum_into(flat, pairs, acc, stage=None):
    """``acc <- sum(weight * params)`` over ``pairs = [(array, or None for flat itself, weight)]``.

    An array is a host numpy buffer or a tensor already on ``flat``'s device (CUDA-aware MPI). Host
    buffers are used in place on a CPU model; for a GPU model each is copied once into the preallocated
    device tensor ``stage`` (no allocation per iteration) and added from there. Summed in the given
    order, so equal inputs give bit-identical results.
    """
    with torch.no_grad():
        for i, (arr, w) in enumerate(pairs):
            if arr is None:
                src = flat
            elif torch.is_tensor(arr):
                src = arr if arr.device == flat.device else _staged(stage, arr)
            elif flat.device.type == "cpu":
                src = torch.from_numpy(arr)
            else:
                src = _staged(stage, torch.from_numpy(arr))
            if i == 0:
                torch.mul(src, w, out=acc)
            else:
                acc.add_(src, alpha=w)
        if flat.device.type == "cuda":
            torch.cuda.current_stream(flat.device).synchronize()   # the host buffers are reused after
    return acc


def _staged(stage, src):
    """``src`` (a received update in host memory) copied into the device tensor ``stage``: asynchronous from
    pinned memory, ordered before the add that reads it on the same stream (counted as parameters)."""
    transfers.to_device(src.numel() * src.element_size(), "parameters")
    return stage.copy_(src, non_blocking=True)


def _alloc(length, device, pinned=False):
    """A float32 buffer of ``length``: host numpy (pinned when asked and CUDA is there) or a device tensor."""
    if device.type != "cpu":
        return torch.zeros(length, dtype=torch.float32, device=device)
    if pinned and torch.cuda.is_available():
        return torch.zeros(length, dtype=torch.float32).pin_memory().numpy()
    return np.zeros(length, dtype=np.float32)


def _as_tensor(buf):
    return buf if torch.is_tensor(buf) else torch.from_numpy(buf)


class FlatMomentumSGD:
    """``torch.optim.SGD`` (momentum, weight decay; no dampening, no Nesterov) on one flat tensor, with the
    same arithmetic in the same order and the same ``state[param]["momentum_buffer"]`` and
    ``param_groups``, minus the optimizer machinery ``hopdec train`` does not need."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        self.param_groups = [dict(params=list(params), lr=lr, momentum=momentum, weight_decay=weight_decay,
                                  dampening=0, nesterov=False)]
        self.state = collections.defaultdict(dict)      # as torch's: state[p] exists once asked for

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad if wd == 0 else p.grad.add(p, alpha=wd)
                if momentum != 0:
                    st = self.state[p]
                    buf = st.get("momentum_buffer")
                    if buf is None:
                        buf = st["momentum_buffer"] = torch.clone(d_p).detach()
                    else:
                        buf.mul_(momentum).add_(d_p)
                    d_p = buf
                p.add_(d_p, alpha=-lr)


class FlatAdamW:
    """``torch.optim.AdamW`` (single-tensor path, no amsgrad) on one flat tensor, with the same arithmetic in
    the same order and the same ``state[param]`` keys (``step``, ``exp_avg``, ``exp_avg_sq``), for
    ``hopdec train``'s transformer preset without importing ``torch._dynamo`` (see :class:`FlatSGD`)."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.param_groups = [dict(params=list(params), lr=lr, betas=tuple(betas), eps=eps,
                                  weight_decay=weight_decay, amsgrad=False, maximize=False)]
        self.state = collections.defaultdict(dict)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0, dtype=torch.float32)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq, step_t = st["exp_avg"], st["exp_avg_sq"], st["step"]
                step_t += 1
                if wd != 0:
                    p.mul_(1 - lr * wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                bias_correction1 = 1 - beta1 ** step
                bias_correction2 = 1 - beta2 ** step
                step_size = lr / bias_correction1
                denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-step_size)


OPTIMIZER_STATE = {"momentum": "momentum_buffer", "adam/exp_avg": "exp_avg", "adam/exp_avg_sq": "exp_avg_sq",
                   "adam/step": "step"}
"""Checkpoint keys of the flat optimizers' state (``FlatSGD.state``) -> the key in ``optimizer.state[flat]``."""


def clip_flat_grad_(grad, max_norm):
    """Scale ``grad`` (every parameter's gradient, flat) to at most ``max_norm`` in L2 norm, as
    ``torch.nn.utils.clip_grad_norm_`` does over a model's parameters; returns the norm before."""
    norm = torch.linalg.vector_norm(grad)
    grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


class LRSchedule:
    """The learning-rate factor of iteration k: linear warmup over ``warmup`` iterations (from 1/warmup),
    then cosine decay from 1 to ``min_ratio`` at ``horizon`` (and ``min_ratio`` after it)."""

    def __init__(self, warmup, horizon, min_ratio=0.1):
        self.warmup, self.horizon, self.min_ratio = int(warmup), int(horizon), float(min_ratio)

    @classmethod
    def from_preset(cls, preset, iterations):
        if preset.get("schedule") != "warmup-cosine":
            return None
        horizon = int(iterations) if iterations else int(preset["horizon"])
        warmup = max(1, min(int(preset.get("warmup_min", 1)), horizon),     # a short run warms up too
                     int(round(preset.get("warmup", 0.05) * horizon)))
        return cls(warmup, horizon, preset.get("min_lr_ratio", 0.1))

    def __call__(self, k):
        if k < self.warmup:
            return (k + 1) / self.warmup
        span = max(1, self.horizon - self.warmup)
        t = min(1.0, (k - self.warmup) / span)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    def describe(self):
        return f"linear warmup {self.warmup} it, cosine to {self.min_ratio:g}x at {self.horizon}"


class FlatModel:
    """Parameters -- and, with ``buffers``, floating-point buffers (BatchNorm running statistics) -- in one
    flat float32 buffer: the part of a worker that is sent and averaged. Each parameter is a view of
    :attr:`flat` (an ``nn.Parameter`` over the parameters' part) and each ``.grad`` a view of ``flat.grad``;
    each averaged buffer is a view of the part after the parameters. :attr:`numel` counts both (what a
    message carries); :attr:`numel_params` the parameters alone.

    Reduce never copies back: the values live in one of several *stores* (the current one) and Reduce
    writes another, which becomes current. With :meth:`use_send_storage` the stores are message-sized (the
    values, then room for the transport's header), so a transport sends straight from :meth:`send_storage`
    -- host arrays on CPU, device tensors for a CUDA-aware MPI -- with no send copy; a store whose sends are
    still in flight must not be written, so the worker loop picks the store each Reduce writes
    (:meth:`spare_stores`, oldest first) and may grow the pool (:meth:`add_store`) up to a cap it works
    out from the protocol (:func:`hopdec.runtime.hop_loop.store_cap`). Two stores to begin with; a pool
    grows only where a receiver is slow. :attr:`stores` counts them (memory: ``stores`` x
    :meth:`store_bytes`).
    """

    def __init__(self, params, buffers=(), module=None):
        params, buffers = list(params), list(buffers)
        if not params:
            raise ValueError("no trainable parameters to train")
        self.model = module
        self._params = params
        self._buffers = buffers
        self.flat = flatten_parameters(params=params)
        self._layouts = [layout(t) for t in params + buffers]      # (as flattened: see view_like)
        self.device = self.flat.device
        self.numel_params = self.flat.numel()
        self.numel = self.numel_params + sum(b.numel() for b in buffers)
        self._stores = None                         # the stores (two at first), once double-buffered
        self._order = StoreOrder()                  # the values' store, and the order of the others
        self._views = None                          # what the views are on when not the values (local steps)
        self._stage = None                          # device staging for received host buffers (GPU)
        if buffers:                                 # buffers live in the second half of the stores
            self._double_buffer(self.numel)

    @property
    def nbytes(self):
        return self.numel * self.flat.element_size()

    def values(self):
        """The current parameters (and averaged buffers) as one flat tensor: what is sent and averaged."""
        if self._stores is None:
            return self.flat.detach()
        return _as_tensor(self._stores[self._cur])[:self.numel]

    def write_params(self, out=None):
        return write_params(self.values(), out)

    def digest(self):
        """A short hash of the parameters' values (not the buffers): equal on workers that start from one
        model (the optimizer's first step compares them)."""
        import hashlib
        data = self.values()[:self.numel_params].detach()
        return hashlib.blake2b(data.cpu().numpy(), digest_size=8).hexdigest()     # (no copy on CPU)

    def reduce(self, pairs, into=None):
        """Replace the values by ``sum(weight * values)`` (see :func:`weighted_sum_into`): store ``into`` (one
        of :meth:`spare_stores`; default: the one that stopped being current longest ago) receives the sum
        and becomes the parameters (and buffers)."""
        if self._stores is None:
            self._double_buffer(self.numel)
        if self._stage is None and self.device.type != "cpu" and any(
                a is not None and not (torch.is_tensor(a) and a.device == self.device) for a, _ in pairs):
            self._stage = torch.empty(self.numel, dtype=torch.float32, device=self.device)
        spare = self._order.spares[0] if into is None else self._index(into)
        weighted_sum_into(self.values(), pairs, _as_tensor(self._stores[spare])[:self.numel], self._stage)
        self._order.switch(spare)
        self._point_at()

    def load_values(self, values):
        """Overwrite the current parameters (and averaged buffers) with a flat array of :attr:`numel`."""
        with torch.no_grad():
            self.values().copy_(_down(torch.as_tensor(np.asarray(values) if not torch.is_tensor(values)
                                                      else values), self.device, "parameters"))

    # ---- the stores (two, or a pool), and zero-copy sends from them ----
    def use_send_storage(self, length, on_device=False):
        """Keep the values in the first ``numel`` floats of one of a pool of stores of ``length`` floats
        (a message: values then header; two to begin with, see :meth:`add_store`), so a transport sends
        :meth:`send_storage` as it is. Host arrays for a CPU model; device tensors when ``on_device`` (a
        CUDA-aware MPI). Returns whether on (a GPU model without a CUDA-aware MPI stages through the
        transport's pinned buffers instead)."""
        if self.device.type != "cpu" and not on_device:
            return False
        self._double_buffer(length)
        return True

    def _double_buffer(self, length):
        current = self.values().clone() if self._stores is not None else None
        self._stores = [_alloc(length, self.device) for _ in range(2)]
        self._order = StoreOrder()
        with torch.no_grad():
            dst = _as_tensor(self._stores[0])
            if current is not None:
                dst[:self.numel].copy_(current)
            else:
                dst[:self.numel_params].copy_(self.flat.detach())
                off = self.numel_params
                for b in self._buffers:
                    view_like(dst[off:off + b.numel()], b).copy_(b.detach())
                    off += b.numel()
        self._point_at()

    def send_storage(self):
        """The values' message-sized store (what SendParams sends from), or None without send storage."""
        return None if self._stores is None or len(self._stores[0]) == self.numel else self._stores[self._cur]

    def spare_stores(self):
        """The other message-sized stores, the one that stopped being current longest ago first (its sends
        are the oldest): what the next Reduce may write. None without send storage."""
        if self._stores is None or len(self._stores[0]) == self.numel:
            return None
        return [self._stores[i] for i in self._order.spares]

    def add_store(self):
        """Allocate one more store of the message size (last among :meth:`spare_stores`) and return it: the
        worker loop does so when every spare one still has sends in flight (lazily, never beyond its cap)."""
        if self._stores is None:
            raise RuntimeError("add_store() before the stores exist (use_send_storage)")
        store = _alloc(len(self._stores[0]), self.device)
        self._stores.append(store)
        self._order.add()
        return store

    @property
    def stores(self):
        """How many stores hold the values and their spares (2 until the pool grows; 0 before any)."""
        return 0 if self._stores is None else len(self._stores)

    def store_bytes(self):
        """Bytes of one store (a message with send storage)."""
        return 0 if self._stores is None else len(self._stores[0]) * 4

    def _index(self, store):
        for i, s in enumerate(self._stores):
            if s is store:
                if i == self._order.cur:
                    raise ValueError("Reduce cannot write the store it reads (the current values)")
                return i
        raise ValueError("not one of this model's stores")

    @property
    def _cur(self):
        """The index of the values' store."""
        return self._order.cur

    def _point_at(self):
        """Make the current store the values: the flat tensor, every parameter view and every buffer move
        to it."""
        self._point_views(_as_tensor(self._stores[self._cur]) if self._views is None else self._views)

    def repoint(self):
        """Point every parameter and averaged buffer back at its place (the values, or the copy local steps
        train): after the user gave one another storage (``p.data = t``, ``p.set_(t)``) or replaced it."""
        self._point_at()

    def views_on(self, work):
        """Point the parameters (and averaged buffers) at ``work`` (a tensor of :attr:`numel` on the device)
        while the values stay where they are: local steps train a copy while the values are sent
        (:class:`LocalRounds`); they stay there across :meth:`reduce` until :meth:`views_home`."""
        self._views = work
        self._point_views(work)

    def views_home(self):
        """Point the parameters back at the values (after :meth:`views_on`)."""
        if self._views is not None:
            self._views = None
            self._point_at()

    def _point_views(self, store):
        data = store[:self.numel_params]
        self.flat.data = data
        off = 0
        for t, lay in zip(self._params + self._buffers, self._layouts):   # (buffers follow the parameters)
            n = t.numel()
            t.data = view_in(store[off:off + n], lay)
            off += n

    def expected_pointers(self):
        """``[(tensor, data_ptr it must have)]`` for every parameter and averaged buffer: anything else was
        replaced, moved or cast behind this object's back (see :mod:`hopdec.optim.life`)."""
        base = self.values() if self._views is None else self._views
        ptr, size = base.data_ptr(), base.element_size()
        out, off = [], 0
        for t in self._params + self._buffers:
            out.append((t, ptr + off * size))
            off += t.numel()
        return out


class OuterStep:
    """The outer optimizer of local steps (DiLoCo): ``x <- base - lr * d``, where ``d`` is the round's
    pseudo-gradient ``delta`` under SGD momentum (``sgd``, heavy ball) or Nesterov momentum (``nesterov``),
    with ``torch.optim.SGD``'s arithmetic (dampening 0; the first step's buffer is ``delta`` itself) on one
    flat tensor. ``sgd`` with lr 1 and momentum 0 is :attr:`plain`: ``x <- base - delta``, the round's own
    result, which :class:`LocalRounds` takes without any arithmetic (so one local step is Hop's step)."""

    def __init__(self, kind="sgd", lr=1.0, momentum=0.0):
        self.kind, self.lr, self.momentum = kind, float(lr), float(momentum)
        self.buf = None                             # the momentum buffer, from the first step

    @property
    def plain(self):
        return self.kind == "sgd" and self.lr == 1.0 and self.momentum == 0.0

    def describe(self):
        return "plain (sgd, lr 1)" if self.plain else (
            f"{self.kind} lr {self.lr:g}" + (f" momentum {self.momentum:g}" if self.momentum else ""))

    @torch.no_grad()
    def step(self, base, delta, out=None):
        """``out <- base - lr * d(delta)`` (``out``: ``base`` itself by default). ``delta`` is overwritten."""
        d = delta
        if self.momentum:
            if self.buf is None:
                self.buf = delta.clone()
            else:
                self.buf.mul_(self.momentum).add_(delta)
            if self.kind == "nesterov":
                d = delta.add_(self.buf, alpha=self.momentum)
            else:
                d = self.buf
        torch.add(base, d, alpha=-self.lr, out=base if out is None else out)


class LocalRounds:
    """Rounds of local steps on a :class:`FlatModel`: Hop's iteration k is a *round* of H inner steps (the
    model's own optimizer), whose exchange and outer step replace Hop's gradient step (DiLoCo's H inner
    steps and outer step on the pseudo-gradient, on Hop's two computation graphs, sec. 3.2):

    * parallel graph -- Send(k) sends the anchor ``a`` (the parameters at the round's start) while the
      inner steps train a copy ``w`` of it (the exchange overlaps the round's compute); Reduce averages the
      neighbours' anchors into ``x_bar``; Apply: ``x <- x_bar - outer(a - w_H)``;
    * serial graph -- the inner steps train the parameters in place; Apply: ``z <- a - outer(a - w_H)``;
      Send(k) sends ``z``; Reduce: ``x <- sum_j W_ji z_j``.

    With the plain outer step (SGD, lr 1, no momentum) Apply takes the round's last inner step at
    ``x_bar + (w_{H-1} - a)`` (parallel) or in place (serial), so H = 1 is Hop's step bit for bit and
    H > 1 is gossip with H local steps. The core sees only rounds: the inner steps run inside its
    ComputeGradient (:meth:`begin`, then the caller's steps), the outer step inside its ApplyGradient
    (:meth:`end`). ``steps_of(k)``: round k's inner step indices (a range).
    """

    def __init__(self, model, steps, outer, compute_graph="parallel", steps_of=None):
        self.m, self.steps, self.outer, self.graph = model, int(steps), outer, compute_graph
        self.steps_of = steps_of or (lambda k: range(k * self.steps, (k + 1) * self.steps))
        if model._stores is None:                   # the anchor needs the values in stores of their own
            model._double_buffer(model.numel)
        self.work = None                            # parallel: the copy the inner steps train
        self.anchor = None                          # serial, outer step: the parameters at the round's start
        self.begun = None                           # the round whose inner steps are under way
        self.taken = 0                              # inner steps taken in it (the last is end()'s)
        self._anchor_store = None

    @property
    def trains_a_copy(self):
        """Whether the inner steps train a copy (parallel graph: the values are being sent meanwhile)."""
        return self.graph == "parallel" and (self.steps > 1 or not self.outer.plain)

    def begin(self, k):
        """Round k starts (its ComputeGradient): keep the anchor, point the model at what the inner steps
        train. Once per round (a resumed round has begun already)."""
        if self.begun == k:
            return
        m = self.m
        self.begun, self.taken, self._anchor_store = k, 0, m._cur
        if self.trains_a_copy:
            if self.work is None:
                self.work = torch.empty(m.numel, dtype=torch.float32, device=m.device)
            with torch.no_grad():
                self.work.copy_(m.values())
            m.views_on(self.work)
        elif self.graph == "serial" and not self.outer.plain:
            if self.anchor is None:
                self.anchor = torch.empty(m.numel, dtype=torch.float32, device=m.device)
            with torch.no_grad():
                self.anchor.copy_(m.values())

    def resume(self, k, taken, anchor=None):
        """Continue round k after ``taken`` inner steps (a checkpoint saved mid-round): the values hold the
        model as trained so far, ``anchor`` the parameters at the round's start (the parallel graph sends
        it again; the serial graph's outer step starts from it)."""
        m = self.m
        self.begin(k)
        self.taken = int(taken)
        if not taken or anchor is None:
            return
        with torch.no_grad():
            if self.trains_a_copy:                  # begin() copied the trained model into the copy
                m.values().copy_(anchor.to(m.device))
            elif self.anchor is not None:
                self.anchor.copy_(anchor.to(m.device))

    def mid_round_anchor(self):
        """The anchor a checkpoint saved mid-round needs (None where the round needs none)."""
        if self.begun is None or not self.taken:
            return None
        if self.trains_a_copy:
            return self._anchor().clone()
        return None if self.anchor is None else self.anchor.clone()

    def _anchor(self):
        return _as_tensor(self.m._stores[self._anchor_store])[:self.m.numel]

    @torch.no_grad()
    def end(self, k, last_step=None):
        """Round k's ApplyGradient: the last inner step ``last_step()`` (None: the round ends without one,
        e.g. a rank that stops mid-round) and the outer step. Parallel: after Reduce (the values are
        ``x_bar``); serial: before Send."""
        m, plain = self.m, self.outer.plain
        if self.begun != k:                         # (no ComputeGradient began it: a plain step)
            if last_step is not None:
                last_step()
            return
        self.begun = None
        if last_step is None and self.taken == 0:   # nothing trained (mixing without a gradient): no
            m.views_home()                          # outer step either, or its momentum would move on
            return
        if self.graph == "serial":
            if last_step is not None:
                last_step()
            if not plain:                           # z <- a - outer(a - w_H), into the values
                delta = torch.sub(self.anchor, m.values(), out=m.values())
                self.outer.step(self.anchor, delta, out=m.values())
            return
        x_bar = m.values()
        if not self.trains_a_copy:                  # one plain step: Hop's Apply, on x_bar
            if last_step is not None:
                last_step()
            return
        a = self._anchor()
        if plain:                                   # x <- step(x_bar + (w - a))
            self.work.sub_(a)
            x_bar.add_(self.work)
            m.views_home()
            if last_step is not None:
                last_step()
            return
        if last_step is not None:                   # w_H, then x <- x_bar - outer(a - w_H)
            last_step()
        m.views_home()
        torch.sub(a, self.work, out=self.work)
        self.outer.step(x_bar, self.work)


class FlatSGD(FlatModel):
    """A module whose trainable parameters live in one flat buffer, and SGD on that buffer: the part of a
    worker that is sent, averaged and stepped. Used by :class:`LocalTrainer` (``hopdec train``, the
    parameter-server mode and the simulator)."""

    def __init__(self, module, lr, momentum=0.0, weight_decay=0.0, torch_optimizer=True, optimizer="sgd",
                 betas=(0.9, 0.999), eps=1e-8):
        """``torch_optimizer``: step with ``torch.optim.SGD``; else with :class:`FlatMomentumSGD`, the same
        update without importing ``torch._dynamo`` (its first ``Optimizer.__init__`` costs ~1 s of CPU per
        process -- every rank of every run pays it). ``optimizer="adamw"``: :class:`FlatAdamW` (``momentum``
        is beta1 then, ``betas[1]`` beta2)."""
        super().__init__([p for p in module.parameters() if p.requires_grad], module=module)
        if optimizer == "adamw":
            self.optimizer = FlatAdamW([self.flat], lr=lr, betas=(momentum, betas[1]), eps=eps,
                                       weight_decay=weight_decay)
        else:
            sgd = torch.optim.SGD if torch_optimizer else FlatMomentumSGD
            self.optimizer = sgd([self.flat], lr=lr, momentum=momentum, weight_decay=weight_decay)

    def stepped_state(self):
        """The checkpoint keys of the optimizer state that exists once this optimizer has stepped (SGD with
        momentum: ``momentum``; AdamW: its moments and step): a checkpoint of a rank that stepped has them."""
        if isinstance(self.optimizer, FlatAdamW):
            return ("adam/exp_avg", "adam/exp_avg_sq", "adam/step")
        return ("momentum",) if self.optimizer.param_groups[0].get("momentum") else ()

    def apply(self, iteration=None):
        """Apply the stored gradient with the optimizer (momentum and weight decay act on the flat tensor)."""
        self.optimizer.step()

    # ---- checkpoints: everything that determines what comes next, as numpy arrays ----
    def state(self):
        """Parameters, the optimizer's state (SGD's momentum; AdamW's moments and step) and the module's
        buffers (BatchNorm statistics) as host numpy arrays, keyed ``params``, ``momentum``,
        ``adam/...``, ``buffer/<name>`` (see :mod:`hopdec.runtime.checkpoint`)."""
        out = {"params": write_params(self.values(), what="state")}
        st = self.optimizer.state.get(self.flat, {})
        for key, name in OPTIMIZER_STATE.items():
            if st.get(name) is not None:
                _up(st[name], "state")
                out[key] = st[name].detach().cpu().numpy().reshape(-1).copy()
        for name, buf in self.model.named_buffers():
            _up(buf, "state")
            out[f"buffer/{name}"] = buf.detach().cpu().numpy().copy()
        return out

    def load_state(self, state):
        """Put back what :meth:`state` gave (shapes checked: a ConfigError names what does not fit)."""
        from hopdec.errors import ConfigError

        def arr(key, shape):
            a = np.asarray(state[key])
            if tuple(a.shape) != tuple(shape):
                raise ConfigError(f"the checkpoint's {key} has shape {tuple(a.shape)}, this model needs "
                                  f"{tuple(shape)} (a different --model or dataset?)")
            return torch.from_numpy(a.copy())
        with torch.no_grad():
            self.flat.data.copy_(_down(arr("params", (self.numel,)), self.device, "state"))
            st = {}
            for key, name in OPTIMIZER_STATE.items():
                if key in state:
                    st[name] = _down(arr(key, (1,) if key == "adam/step" else (self.numel,)), self.device, "state")
            if "adam/step" in st:
                st["step"] = st["step"].reshape(())
            if st:
                self.optimizer.state[self.flat] = st
            else:
                self.optimizer.state.pop(self.flat, None)
            for name, buf in self.model.named_buffers():
                if f"buffer/{name}" in state:
                    buf.copy_(_down(arr(f"buffer/{name}", buf.shape), buf.device, "state"))


class LocalTrainer(FlatSGD):
    """One worker's model, data shard and optimizer, with all parameters in the flat tensor ``self.flat``.

    The optimizer, its schedule and gradient clipping come from the model's preset
    (:data:`hopdec.ml.models.PRESETS`): SGD with a constant ``lr`` by default; the transformer's AdamW
    (``momentum`` is beta1) with linear warmup and cosine decay over ``iterations`` and clipping.
    """

    def __init__(self, model_name, dataset, indices, lr, momentum=0.9, weight_decay=0.0, batch_size=32,
                 device="cpu", seed=0, data_seed=None, norm="batch", iterations=None, model=None):
        """``model``: the module ``model_name`` names, built already (by
        :meth:`hopdec.modes.work.Workload.initial_model`, once per process); None: seeded and built here."""
        from hopdec.ml.models import PRESETS
        self.model_name = model_name
        preset = PRESETS.get(model_name, {})
        if model is None:
            torch.manual_seed(seed)                 # same seed on every rank: identical initial model
            model = build_model(model_name, dataset.input_shape, dataset.num_classes, norm=norm)
        model.to(torch.device(device))
        if is_entry_point(model_name):              # (yours: its output, checked before any training)
            from hopdec.ml.user import check_output
            check_output(model_name, model, dataset, device)
        super().__init__(model, lr=lr, momentum=momentum, weight_decay=weight_decay, torch_optimizer=False,
                         optimizer=preset.get("optimizer", "sgd"), betas=(momentum, preset.get("beta2", 0.999)))
        self.base_lr = lr
        self.schedule = LRSchedule.from_preset(preset, iterations)
        self.clip = preset.get("clip")
        self.applied = 0
        self.criterion = loss_fn(model_name, model)
        self.dataset = dataset
        self.stream = batches(dataset.train_x, dataset.train_y, indices, batch_size,
                              seed=seed if data_seed is None else data_seed)
        self.loss = None
        self.norm_stats_from_training = False       # a PS server's model (evaluate: recompute_norm_stats)
        self.local = None                           # LocalRounds: rounds of local steps (use_local_steps)
        self._last_step = None

    def compute(self):
        """Gradient of the next mini-batch at the current parameters, into ``self.flat.grad`` (clipped to the
        preset's norm, as ``torch.nn.utils.clip_grad_norm_`` over all parameters does)."""
        xb, yb = next(self.stream)
        xb, yb = _down(xb, self.device, "data"), _down(yb, self.device, "data")
        self.model.train()
        self.flat.grad.zero_()
        loss = self.criterion(self.model(xb), yb)
        loss.backward()
        if self.clip:
            clip_flat_grad_(self.flat.grad, self.clip)
        self.loss = float(loss.detach())
        _up(loss, "loss")
        return self.loss

    def use_local_steps(self, steps, outer, compute_graph="parallel", steps_of=None):
        """Train in rounds of ``steps`` inner steps with the outer step ``outer`` (:class:`OuterStep`)
        (:class:`LocalRounds`): the worker loop's iteration k is then round k, :meth:`compute_round` its
        inner steps and :meth:`apply` its end. ``steps_of(k)``: round k's inner step indices (the last
        round may be shorter); the schedule's learning rate follows the inner step."""
        self.local = LocalRounds(self, steps, outer, compute_graph, steps_of)
        return self

    def compute_round(self, k):
        """Round k's inner steps, a generator: yields ``(inner step, loss)`` after each mini-batch's gradient;
        every step but the last is applied here (the last is :meth:`apply`'s, with the outer step)."""
        r = self.local
        steps = r.steps_of(k)
        r.begin(k)
        for n, s in enumerate(steps):
            loss = self.compute()
            if n < len(steps) - 1:
                self._step(s)
                r.taken += 1
            yield s, loss
        self._last_step = steps[-1]

    def apply(self, iteration=None):
        """The optimizer step at the schedule's learning rate for ``iteration`` (default: the number of steps
        applied so far, e.g. a parameter server's); with local steps, round ``iteration``'s last inner step
        and its outer step (:meth:`LocalRounds.end`)."""
        if self.local is not None and iteration is not None:
            last = self._last_step
            self.local.end(iteration, lambda: self._step(last))
            return
        self._step(iteration)

    def _step(self, iteration=None):
        k = self.applied if iteration is None else iteration
        if self.schedule is not None:
            for g in self.optimizer.param_groups:
                g["lr"] = self.base_lr * self.schedule(k)
        self.optimizer.step()
        self.applied += 1

    def state(self):
        """:meth:`FlatSGD.state` plus the data stream's position (``stream/*``) and the torch RNG states
        (``rng/torch``, ``rng/cuda``: dropout draws), so a restored trainer continues exactly."""
        out = super().state()
        out.update({f"stream/{k}": v for k, v in self.stream.state().items()})
        if self.local is not None and self.local.outer.buf is not None:
            _up(self.local.outer.buf, "state")
            out["outer/momentum"] = self.local.outer.buf.detach().cpu().numpy().copy()
        out["rng/torch"] = torch.get_rng_state().numpy().copy()
        if self.device.type == "cuda":
            out["rng/cuda"] = torch.cuda.get_rng_state(self.device).numpy().copy()
        return out

    def load_state(self, state):
        super().load_state(state)
        self.stream.load_state({k[len("stream/"):]: v for k, v in state.items() if k.startswith("stream/")})
        if self.local is not None:
            buf = state.get("outer/momentum")
            if buf is not None and np.shape(buf) != (self.numel,):
                from hopdec.errors import ConfigError
                raise ConfigError(f"the checkpoint's outer/momentum has shape {np.shape(buf)}, this model needs "
                                  f"({self.numel},)")
            self.local.outer.buf = None if buf is None else _down(torch.from_numpy(
                np.asarray(buf, dtype=np.float32).copy()), self.device, "state")
        torch.set_rng_state(torch.from_numpy(np.asarray(state["rng/torch"], dtype=np.uint8).copy()))
        if self.device.type == "cuda" and "rng/cuda" in state:
            torch.cuda.set_rng_state(torch.from_numpy(np.asarray(state["rng/cuda"], dtype=np.uint8).copy()),
                                     self.device)

    def load_params(self, arr, what="parameters"):
        with torch.no_grad():
            self.flat.copy_(_down(torch.from_numpy(np.asarray(arr)), self.device, what))

    def _replica_tensors(self):
        return [p for p in self.model.parameters()] + [b for b in self.model.buffers() if b.is_floating_point()]

    def replica_state(self):
        """The model's parameters and floating-point buffers (BatchNorm statistics) in one float64 array:
        what an all-reduce run copies from rank 0 to every replica at the start (PyTorch DDP broadcasts
        them so too), so a factory that seeds by rank still starts every replica from the same model."""
        return torch.cat([t.detach().reshape(-1).to("cpu", torch.float64)
                          for t in self._replica_tensors()]).numpy()

    @torch.no_grad()
    def load_replica_state(self, arr):
        """Copy :meth:`replica_state`'s array into the model's parameters and buffers (in place: the flat
        views stay)."""
        src, at = torch.from_numpy(np.asarray(arr)), 0
        for t in self._replica_tensors():
            t.copy_(src[at:at + t.numel()].reshape(t.shape))
            at += t.numel()

    NORM_STATS_SAMPLES = 2048
    """Training samples a model whose BatchNorm statistics nobody trains (a parameter server's) runs in
    training mode before it is evaluated (:meth:`recompute_norm_stats`)."""

    def recompute_norm_stats(self, batch_size=256):
        """BatchNorm running statistics recomputed for the current weights from the first
        :attr:`NORM_STATS_SAMPLES` training samples (``torch.optim.swa_utils.update_bn``, as SWA does for
        averaged weights). A parameter server applies gradients but never runs a forward pass in training
        mode, so its model kept the initial statistics (mean 0, variance 1) and its test accuracy was that of
        a model with the wrong normalisation (9% where the workers' reached 86%). No-op without BatchNorm."""
        from torch.nn.modules.batchnorm import _BatchNorm
        from torch.optim.swa_utils import update_bn
        if not any(isinstance(m, _BatchNorm) and m.track_running_stats for m in self.model.modules()):
            return
        x = self.dataset.train_x[:self.NORM_STATS_SAMPLES]
        update_bn([_down(x[s:s + batch_size], self.device, "evaluation") for s in range(0, len(x), batch_size)],
                  self.model)

    @torch.no_grad()
    def evaluate(self, flat=None, batch_size=1024):
        """(loss, accuracy) on the held-out split, for the current or the given flat parameters (a
        parameter server's model first recomputes its BatchNorm statistics: ``norm_stats_from_training``)."""
        saved = None
        if flat is not None:
            saved = self.flat.detach().clone()
            self.load_params(flat, "evaluation")
        if self.norm_stats_from_training:
            self.recompute_norm_stats()
        self.model.eval()
        total, correct, loss_sum = 0, 0, 0.0
        x, y = self.dataset.test_x, self.dataset.test_y
        for s in range(0, len(y), batch_size):
            xb, yb = _down(x[s:s + batch_size], self.device, "evaluation"), _down(y[s:s + batch_size],
                                                                                  self.device, "evaluation")
            out = self.model(xb)
            loss_sum += float(self.criterion(out, yb)) * yb.numel()    # a language model: every position
            correct += int((predict(self.model_name, out) == yb).sum())
            total += yb.numel()
        if saved is not None:
            self.flat.copy_(saved)
        return loss_sum / max(total, 1), correct / max(total, 1)
