"""One worker's model whose parameters live in one flat buffer, with SGD on it (and its data shard).

:class:`FlatSGD` -- a module's trainable parameters in ONE contiguous flat tensor (every ``nn.Parameter``
is a view into it, and so is every ``.grad``) with SGD (momentum, weight decay) on it: sending, averaging
and the optimizer step are single-tensor operations, with no per-parameter messages or loops.
:class:`LocalTrainer` adds a model, a data shard and evaluation: ``t.compute(); t.reduce([...]);
t.apply()``. :class:`hopdec.optim.HopSGD` wraps a user's own model in a :class:`FlatSGD`. No MPI here.
"""

import collections

import numpy as np
import torch

from hopdec.ml.data import batches
from hopdec.ml.models import build_model, loss_fn, predict


def flatten_parameters(module):
    """Move every trainable parameter of ``module`` into one contiguous tensor; return it.

    The returned ``nn.Parameter`` (on the module's device) owns the storage: each parameter becomes a
    view into it and each ``.grad`` a view into ``flat.grad``, so one optimizer step, one copy or one
    message covers the whole model.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else torch.device("cpu")
    flat = torch.nn.Parameter(torch.empty(numel, device=device))
    flat.grad = torch.zeros(numel, device=device)
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[off:off + n].copy_(p.reshape(-1))
            p.data = flat.data[off:off + n].view_as(p)
            p.grad = flat.grad[off:off + n].view_as(p)
            off += n
    return flat


def regather_grads(module, flat):
    """Put gradients back into ``flat.grad`` if something replaced them (``model.zero_grad()`` sets
    ``.grad = None`` by default, after which backward allocates new tensors). Cheap when nothing did."""
    off = 0
    base = flat.grad.data_ptr()
    for p in (p for p in module.parameters() if p.requires_grad):
        n = p.numel()
        view = flat.grad[off:off + n]
        if p.grad is None or p.grad.data_ptr() != base + off * flat.grad.element_size():
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)
        off += n


def write_params(flat, out=None):
    """Copy ``flat`` into host array ``out`` (or a new one): the device -> host staging of a send."""
    src = flat.detach()
    if out is None:
        return src.cpu().numpy().copy()
    (out if torch.is_tensor(out) else torch.from_numpy(out)).copy_(src)
    return out


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
                src = arr if arr.device == flat.device else stage.copy_(arr, non_blocking=True)
            elif flat.device.type == "cpu":
                src = torch.from_numpy(arr)
            else:
                src = stage.copy_(torch.from_numpy(arr), non_blocking=True)
            if i == 0:
                torch.mul(src, w, out=acc)
            else:
                acc.add_(src, alpha=w)
        if flat.device.type == "cuda":
            torch.cuda.current_stream(flat.device).synchronize()   # the host buffers are reused after
    return acc


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


class FlatSGD:
    """A module whose trainable parameters live in one flat buffer, and SGD on that buffer: the part of a
    worker that is sent, averaged and stepped. Used by :class:`LocalTrainer` and by
    :class:`hopdec.optim.HopSGD` alike.

    Reduce never copies back: the parameters alternate between two buffers (the current one and a spare
    that Reduce writes, then they swap). With :meth:`use_send_storage` those buffers are message-sized
    (parameters, then room for the transport's header), so a transport sends straight from
    :meth:`send_storage` -- host arrays on CPU, device tensors for a CUDA-aware MPI -- with no send copy.
    """

    def __init__(self, module, lr, momentum=0.0, weight_decay=0.0, torch_optimizer=True):
        """``torch_optimizer``: step with ``torch.optim.SGD`` (what :class:`hopdec.optim.HopSGD` hands its
        users, e.g. for a learning-rate scheduler); else with :class:`FlatMomentumSGD`, the same update
        without importing ``torch._dynamo`` (its first ``Optimizer.__init__`` costs ~1.5 s of CPU per
        process -- every rank of every run pays it)."""
        self.model = module
        self.flat = flatten_parameters(module)
        self.device = self.flat.device
        self.numel = self.flat.numel()
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._stores = None                         # the two parameter buffers, once double-buffered
        self._cur = 0
        self._stage = None                          # device staging for received host buffers (GPU)
        sgd = torch.optim.SGD if torch_optimizer else FlatMomentumSGD
        self.optimizer = sgd([self.flat], lr=lr, momentum=momentum, weight_decay=weight_decay)

    @property
    def nbytes(self):
        return self.numel * self.flat.element_size()

    def apply(self):
        """Apply the stored gradient with SGD (momentum and weight decay act on the flat tensor)."""
        self.optimizer.step()

    def write_params(self, out=None):
        return write_params(self.flat, out)

    def reduce(self, pairs):
        """Replace the parameters by ``sum(weight * params)`` (see :func:`weighted_sum_into`): the spare
        buffer receives the sum and becomes the parameters."""
        if self._stores is None:
            self._double_buffer(self.numel)
        if self._stage is None and self.device.type != "cpu" and any(
                a is not None and not (torch.is_tensor(a) and a.device == self.device) for a, _ in pairs):
            self._stage = torch.empty(self.numel, dtype=torch.float32, device=self.device)
        spare = 1 - self._cur
        weighted_sum_into(self.flat.data, pairs, _as_tensor(self._stores[spare])[:self.numel], self._stage)
        self._point_at(spare)

    # ---- checkpoints: everything that determines what comes next, as numpy arrays ----
    def state(self):
        """Parameters, the optimizer's momentum and the module's buffers (BatchNorm statistics) as host
        numpy arrays, keyed ``params``, ``momentum``, ``buffer/<name>`` (see :mod:`hopdec.runtime.checkpoint`)."""
        out = {"params": self.write_params()}
        mom = self.optimizer.state.get(self.flat, {}).get("momentum_buffer")
        if mom is not None:
            out["momentum"] = mom.detach().cpu().numpy().copy()
        for name, buf in self.model.named_buffers():
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
            self.flat.data.copy_(arr("params", (self.numel,)).to(self.device))
            if "momentum" in state:
                self.optimizer.state[self.flat]["momentum_buffer"] = arr("momentum", (self.numel,)).to(self.device)
            else:
                self.optimizer.state.pop(self.flat, None)
            for name, buf in self.model.named_buffers():
                if f"buffer/{name}" in state:
                    buf.copy_(arr(f"buffer/{name}", buf.shape).to(buf.device))

    # ---- double buffering, and zero-copy sends from it ----
    def use_send_storage(self, length, on_device=False):
        """Keep the parameters in the first ``numel`` floats of one of two buffers of ``length`` floats
        (a message: parameters then header), so a transport sends :meth:`send_storage` as it is. Host
        arrays for a CPU model; device tensors when ``on_device`` (a CUDA-aware MPI). Returns whether on
        (a GPU model without a CUDA-aware MPI stages through the transport's pinned buffers instead)."""
        if self.device.type != "cpu" and not on_device:
            return False
        self._double_buffer(length)
        return True

    def _double_buffer(self, length):
        self._stores = [_alloc(length, self.device) for _ in range(2)]
        with torch.no_grad():
            _as_tensor(self._stores[0])[:self.numel].copy_(self.flat.detach())
        self._point_at(0)

    def send_storage(self):
        return None if self._stores is None or len(self._stores[0]) == self.numel else self._stores[self._cur]

    def spare_storage(self):
        return None if self._stores is None or len(self._stores[0]) == self.numel else self._stores[1 - self._cur]

    def _point_at(self, i):
        """Make store ``i`` the parameters: the flat tensor and every parameter view move to it."""
        self._cur = i
        data = _as_tensor(self._stores[i])[:self.numel]
        self.flat.data = data
        off = 0
        for p in self._params:
            n = p.numel()
            p.data = data[off:off + n].view_as(p)
            off += n


class LocalTrainer(FlatSGD):
    """One worker's model, data shard and optimizer, with all parameters in the flat tensor ``self.flat``."""

    def __init__(self, model_name, dataset, indices, lr, momentum=0.9, weight_decay=0.0, batch_size=32,
                 device="cpu", seed=0, data_seed=None, norm="batch"):
        torch.manual_seed(seed)                     # same seed on every rank: identical initial model
        self.model_name = model_name
        model = build_model(model_name, dataset.input_shape, dataset.num_classes, norm=norm)
        model.to(torch.device(device))
        super().__init__(model, lr=lr, momentum=momentum, weight_decay=weight_decay, torch_optimizer=False)
        self.criterion = loss_fn(model_name)
        self.dataset = dataset
        self.stream = batches(dataset.train_x, dataset.train_y, indices, batch_size,
                              seed=seed if data_seed is None else data_seed)
        self.loss = None

    def compute(self):
        """Gradient of the next mini-batch at the current parameters, into ``self.flat.grad``."""
        xb, yb = next(self.stream)
        xb, yb = xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
        self.model.train()
        self.flat.grad.zero_()
        loss = self.criterion(self.model(xb), yb)
        loss.backward()
        self.loss = float(loss.detach())
        return self.loss

    def state(self):
        """:meth:`FlatSGD.state` plus the data stream's position (``stream/*``) and the torch RNG states
        (``rng/torch``, ``rng/cuda``: dropout draws), so a restored trainer continues exactly."""
        out = super().state()
        out.update({f"stream/{k}": v for k, v in self.stream.state().items()})
        out["rng/torch"] = torch.get_rng_state().numpy().copy()
        if self.device.type == "cuda":
            out["rng/cuda"] = torch.cuda.get_rng_state(self.device).numpy().copy()
        return out

    def load_state(self, state):
        super().load_state(state)
        self.stream.load_state({k[len("stream/"):]: v for k, v in state.items() if k.startswith("stream/")})
        torch.set_rng_state(torch.from_numpy(np.asarray(state["rng/torch"], dtype=np.uint8).copy()))
        if self.device.type == "cuda" and "rng/cuda" in state:
            torch.cuda.set_rng_state(torch.from_numpy(np.asarray(state["rng/cuda"], dtype=np.uint8).copy()),
                                     self.device)

    def load_params(self, arr):
        with torch.no_grad():
            self.flat.copy_(torch.from_numpy(np.asarray(arr)).to(self.device))

    @torch.no_grad()
    def evaluate(self, flat=None, batch_size=1024):
        """(loss, accuracy) on the held-out split, for the current or the given flat parameters."""
        saved = None
        if flat is not None:
            saved = self.flat.detach().clone()
            self.load_params(flat)
        self.model.eval()
        total, correct, loss_sum = 0, 0, 0.0
        x, y = self.dataset.test_x, self.dataset.test_y
        for s in range(0, len(y), batch_size):
            xb, yb = x[s:s + batch_size].to(self.device), y[s:s + batch_size].to(self.device)
            out = self.model(xb)
            loss_sum += float(self.criterion(out, yb)) * len(yb)
            correct += int((predict(self.model_name, out) == yb).sum())
            total += len(yb)
        if saved is not None:
            self.flat.copy_(saved)
        return loss_sum / max(total, 1), correct / max(total, 1)
