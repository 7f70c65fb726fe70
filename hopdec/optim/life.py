"""The model's life under a Hop optimizer: what changed since it was built, found between steps.

The optimizer keeps every parameter (and every averaged buffer) as a view of one flat float32 buffer, so
that sends and averages are single-tensor operations. A user's code can take a tensor out of it without
knowing: ``model.load_state_dict(sd, assign=True)`` or ``module.weight = nn.Parameter(...)`` put new
tensors into the model; ``model.to(device)``, ``model.double()`` or ``p.data = t`` give a parameter other
storage. Training would then go on without changing the model, or fail far away. :func:`changes` finds
each such change before a step (a loop over the tensors, microseconds); :class:`Change` says what it is
and whether the optimizer can follow it: a new tensor of the same shape, dtype and device is adopted (its
values are copied into the buffer and it becomes a view of it); a cast or a move is refused with a line
naming the tensor. No MPI here.
"""

from dataclasses import dataclass

import torch

DTYPE = torch.float32


@dataclass
class Change:
    """``kind``: ``replaced`` (the model holds another tensor under this name), ``storage`` (the same
    tensor, other storage: ``p.data = ...``), ``cast``, ``moved`` or ``reshaped``. ``new``: the tensor to
    adopt (replaced/storage), ``slot``: the index of the tracked tensor it takes the place of."""

    kind: str
    name: str
    slot: int
    new: object = None
    detail: str = ""

    @property
    def can_follow(self):
        return self.kind in ("replaced", "storage")

    def message(self):
        what = {"cast": f"was cast to {self.detail} after the optimizer was built (model.double() or .half()?): "
                         f"the Hop optimizer averages float32 parameters in one float32 buffer; keep the model "
                         f"float32 (torch.autocast gives mixed precision with float32 parameters)",
                "moved": f"was moved to {self.detail} after the optimizer was built (model.to(...)?): move the "
                          f"model first, then build the optimizer",
                "reshaped": f"was replaced by a tensor of another shape {self.detail}: the optimizer's buffer "
                            f"has a fixed layout; build a new optimizer for a new model"}
        return f"HopOptimizer: {self.name} {what.get(self.kind, self.kind)}"


def owners(model, tracked):
    """``[(module, key, slot, name, kind)]``: where the model holds each tracked tensor (``kind``:
    ``_parameters`` or ``_buffers``); a tied weight has several owners."""
    index = {id(t): i for i, t in enumerate(tracked)}
    out = []
    for mname, module in model.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for key, t in getattr(module, kind).items():
                if t is not None and id(t) in index:
                    out.append((module, key, index[id(t)], f"{mname}.{key}" if mname else key, kind))
    return out


def changes(tracked, expected_ptrs, names, device, owned=()):
    """Every change to the tracked tensors (see :class:`Change`): ``tracked[i]`` must still be held by each
    owner and point at ``expected_ptrs[i]`` with dtype float32 on ``device``."""
    found = []
    seen = set()
    for module, key, slot, name, kind in owned:
        now = getattr(module, kind).get(key)
        if now is tracked[slot] or slot in seen:
            continue
        seen.add(slot)
        found.append(_classify(now, tracked[slot], name, slot, "replaced", device))
    for slot, (t, ptr) in enumerate(zip(tracked, expected_ptrs)):
        if slot in seen:
            continue
        if t.data_ptr() != ptr or t.dtype != DTYPE:
            found.append(_classify(t, None, names[slot], slot, "storage", device))
    return found


def _classify(now, old, name, slot, kind, device):
    if now is None:
        return Change("reshaped", name, slot, detail="(it was removed)")
    if now.dtype != DTYPE:
        return Change("cast", name, slot, detail=str(now.dtype))
    if old is not None and now.shape != old.shape:
        return Change("reshaped", name, slot, detail=f"{tuple(now.shape)} (was {tuple(old.shape)})")
    if now.device != device:
        return Change("moved", name, slot, detail=str(now.device))
    return Change(kind, name, slot, new=now, detail=str(device))


def plan_of(graph, cfg):
    """What every rank's optimizer must agree on besides its tensors (JSON-ready): the topology as used (its
    sha256) and the protocol settings (but the steps, which may differ per rank)."""
    import dataclasses

    from hopdec.modes.fingerprint import topology_fingerprint
    return {"topology": topology_fingerprint(graph)["sha256"],
            **{k: v for k, v in dataclasses.asdict(cfg).items() if k != "iterations"}}


def check_same_plan(plans):
    """Raise one line, the same on every rank, naming the first rank whose :func:`plan_of` differs from rank
    0's: a topology file that differs between hosts ran another graph there and hung until the peer
    timeout; settings computed per rank gave each rank other bounds."""
    from hopdec.errors import ConfigError
    from hopdec.transport.collectives import first_difference
    found = first_difference(plans)
    if found is None:
        return
    r, key = found
    mine, ref = plans[r].get(key), plans[0].get(key)
    if key == "topology":
        raise ConfigError(f"HopOptimizer: rank {r} and rank 0 read different topologies (sha256 {mine} on "
                          f"rank {r}, {ref} on rank 0): every rank must read the same file (one that differs "
                          f"between hosts?)")
    raise ConfigError(f"HopOptimizer: rank {r} and rank 0 were given different settings: {key} {mine!r} on rank "
                      f"{r}, {ref!r} on rank 0")


def check_same_layout(comm, tensors, names, timeout):
    """Every rank's averaged tensors have the same shapes and memory layouts, under the same names in the
    same order (collective, bounded by ``timeout``): the same line on every rank, naming two ranks that
    differ (:func:`hopdec.ml.models.layout_difference`, what ``hopdec train`` says too). Names: groups
    listed in another order per rank (built from a set) with equal shapes were averaged crosswise."""
    import zlib

    from hopdec.errors import ConfigError
    from hopdec.ml.models import layout_difference, tensor_layout
    from hopdec.transport.collectives import allgather_json, first_difference
    what = "HopOptimizer(): comparing the ranks' models"
    names = [_unwrapped(n) for n in names]
    every = allgather_json(comm, [tensor_layout(tensors), zlib.crc32("\n".join(names).encode())], timeout, what)
    layouts = [layout for layout, _ in every]
    found = first_difference(layouts)
    if found is not None:
        raise ConfigError(f"HopOptimizer: {layout_difference(found[0], layouts[found[0]], layouts[0])}")
    if len({crc for _, crc in every}) == 1:
        return
    # (every rank saw the same difference: all take part in this second exchange, of the names themselves)
    lists = allgather_json(comm, list(names), timeout, what)
    r = next(r for r, got in enumerate(lists) if got != lists[0])
    i = next(i for i, (a, b) in enumerate(zip(lists[0], lists[r])) if a != b)
    raise ConfigError(f"HopOptimizer: the ranks list their parameters in different orders: tensor {i} (from 0) "
                      f"is {lists[0][i]} on rank 0, {lists[r][i]} on rank {r}; every rank must pass the same "
                      f"parameters in the same order (param groups built from a set or dict of per-rank "
                      f"order?), else their buffers are averaged crosswise")


def _unwrapped(name):
    """A tensor's name without the prefixes of wrappers that leave the model as it is (``torch.compile``'s
    ``_orig_mod.``, DDP's ``module.``): one rank compiled and another not hold the same tensors."""
    for prefix in ("_orig_mod.", "module."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


def check_dtypes(tensors, names, buffers=0):
    """The Hop optimizer averages float32 tensors: one line naming the first that is not (or that is not
    on the first one's device). ``buffers``: how many of the last tensors are buffers ``average_buffers``
    put there (their line says how to keep such a buffer out)."""
    from hopdec.errors import ConfigError
    from torch.nn.parameter import UninitializedTensorMixin
    for t, name in zip(tensors, names):
        if isinstance(t, UninitializedTensorMixin):
            raise ConfigError(f"HopOptimizer: {name} is not initialized yet (a lazy module such as LazyLinear): "
                              f"run one forward pass before building the optimizer, which lays every "
                              f"parameter out in one buffer")
    device = tensors[0].device
    for i, (t, name) in enumerate(zip(tensors, names)):
        if t.dtype != DTYPE and i >= len(tensors) - buffers:
            raise ConfigError(f"HopOptimizer: buffer {name} is {t.dtype}: average_buffers=True averages float32 "
                              f"buffers (in the parameters' float32 buffer); keep it float32, or average_buffers="
                              f"False (each worker keeps its own; consensus_model() still averages it)")
        if t.dtype != DTYPE:
            raise ConfigError(f"HopOptimizer: {name} is {t.dtype}: the Hop optimizer averages float32 "
                              f"parameters in one float32 buffer (messages are float32); build the model in "
                              f"float32 (torch.autocast gives mixed precision with float32 parameters)")
        if t.device != device:
            raise ConfigError(f"HopOptimizer: {name} is on {t.device}, {names[0]} on {device}: every parameter "
                              f"must be on one device")
        if t.is_sparse or not t.is_leaf:
            raise ConfigError(f"HopOptimizer: {name} is not a dense leaf tensor")
