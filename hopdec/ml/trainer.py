"""One worker's model whose parameters live in one flat buffer, with its data shard and SGD.

:class:`LocalTrainer` -- model + data shard + SGD (momentum, weight decay) on ONE contiguous flat
parameter tensor: every ``nn.Parameter`` of the model is a view into it, and so is every ``.grad``.
Sending, averaging and the optimizer step are then single-tensor operations, with no per-parameter
messages or loops. It works as an optimizer-like object in any training loop:
``loss = t.compute(); t.reduce([...]); t.apply()``. No MPI here.
"""

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


def weighted_sum_into(flat, pairs, acc=None, copy_back=True):
    """``flat <- sum(weight * params)`` over ``pairs = [(array, or None for flat itself, weight)]``;
    an array is a host numpy buffer (staged) or a tensor already on a device (CUDA-aware MPI).

    Summed in the given order into ``acc`` (pass a preallocated tensor like ``flat`` to avoid a fresh
    allocation, and its page faults, every iteration), so equal inputs give bit-identical results.
    With ``copy_back=False`` the result stays in ``acc`` (the caller makes it the parameters).
    """
    with torch.no_grad():
        acc = torch.empty_like(flat) if acc is None else acc
        for i, (arr, w) in enumerate(pairs):
            if arr is None:
                src = flat
            else:
                src = (arr if torch.is_tensor(arr) else torch.from_numpy(arr)).to(flat.device,
                                                                                non_blocking=True)
            if i == 0:
                torch.mul(src, w, out=acc)
            else:
                acc.add_(src, alpha=w)
        if copy_back:
            flat.copy_(acc)


class LocalTrainer:
    """One worker's model, shard and optimizer, with all parameters in the flat tensor ``self.flat``."""

    def __init__(self, model_name, dataset, indices, lr, momentum=0.9, weight_decay=0.0, batch_size=32,
                 device="cpu", seed=0, data_seed=None, norm="batch"):
        torch.manual_seed(seed)                     # same seed on every rank: identical initial model
        self.model_name = model_name
        self.device = torch.device(device)
        self.model = build_model(model_name, dataset.input_shape, dataset.num_classes, norm=norm)
        self.model.to(self.device)
        self.flat = flatten_parameters(self.model)
        self.numel = self.flat.numel()
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._acc = None                            # Reduce's accumulator, allocated once
        self._stores = None                         # two host arrays when sends go without a copy
        self._cur = 0
        self.optimizer = torch.optim.SGD([self.flat], lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.criterion = loss_fn(model_name)
        self.dataset = dataset
        self.stream = batches(dataset.train_x, dataset.train_y, indices, batch_size,
                              seed=seed if data_seed is None else data_seed)
        self.loss = None

    @property
    def nbytes(self):
        return self.numel * self.flat.element_size()

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

    def apply(self):
        """Apply the stored gradient with SGD (momentum and weight decay act on the flat tensor)."""
        self.optimizer.step()

    def write_params(self, out=None):
        return write_params(self.flat, out)

    def reduce(self, pairs):
        if self._stores is not None:              # write the other store, then make it the parameters
            spare = 1 - self._cur
            weighted_sum_into(self.flat.data, pairs, torch.from_numpy(self._stores[spare])[:self.numel],
                              copy_back=False)
            self._point_at(spare)
            return
        if self._acc is None:
            self._acc = torch.empty_like(self.flat.data)
        weighted_sum_into(self.flat.data, pairs, self._acc)

    # ---- zero-copy sends: parameters alternate between two message-sized host arrays ----
    def use_send_storage(self, length):
        """Keep the parameters in the first ``numel`` floats of one of two host arrays of ``length``
        floats; Reduce writes the other one and swaps. A transport then sends straight from
        :meth:`send_storage` (no send copy, and Reduce has no copy-back) while the spare is free to be
        overwritten once its sends completed. CPU only (a GPU model is staged anyway). Returns whether on.
        """
        if self.device.type != "cpu":
            return False
        self._stores = [np.zeros(length, dtype=np.float32) for _ in range(2)]
        self._stores[0][:self.numel] = self.write_params()
        self._point_at(0)
        return True

    def send_storage(self):
        return None if self._stores is None else self._stores[self._cur]

    def spare_storage(self):
        return None if self._stores is None else self._stores[1 - self._cur]

    def _point_at(self, i):
        """Make store ``i`` the parameters: the flat tensor and every parameter view move to it."""
        self._cur = i
        data = torch.from_numpy(self._stores[i])[:self.numel]
        self.flat.data = data
        off = 0
        for p in self._params:
            n = p.numel()
            p.data = data[off:off + n].view_as(p)
            off += n

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
