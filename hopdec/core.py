"""The shape every protocol core shares (the Hop worker, the PS server, the PS worker).

A core is a plain Python state machine with no MPI, no torch and no clock (sans-I/O, like h11). A driver
feeds it *events* through its ``on_*`` methods (a message arrived, with the time it arrived where the
protocol needs one) and asks :meth:`next_action` what to do; the core answers with an *action* -- a
frozen dataclass naming what the driver must carry out -- or :class:`Wait` when nothing can happen until
an event arrives, or :class:`Finished`. Drivers (MPI runners, the in-process schedulers, the simulator)
only carry out actions; no protocol decision is ever taken outside a core.

Actions that mean the same thing on every side are defined here once.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:                           # tells type checkers (and mypyc) that @action makes dataclasses
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**kwargs):
        return lambda f: f


@dataclass_transform(frozen_default=True)
def action(cls):
    """``@dataclass(frozen=True)`` -- the same class, fields, equality, hash and immutability -- whose
    ``__init__`` writes the fields straight into the instance's ``__dict__``. The generated one calls
    ``object.__setattr__`` for every field (the frozen class's own ``__setattr__`` refuses), which makes a
    frozen instance about twice as slow to build as a plain one; the simulator builds some 15 actions and
    queue entries per worker-iteration. Assigning an attribute afterwards still raises."""
    cls = dataclass(frozen=True)(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    if (any(f.default_factory is not dataclasses.MISSING for f in fields) or hasattr(cls, "__post_init__")
            or "__slots__" in cls.__dict__):
        return cls                          # (not needed by any action; keep the generated one)
    ns = {}
    params = []
    for f in fields:
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
    body = ("    d = self.__dict__\n" + "".join(f"    d[{f.name!r}] = {f.name}\n" for f in fields)
            if fields else "    pass\n")
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


@action
class Wait:
    """Nothing to do until an event arrives; ``on`` names whom the core waits for (ranks: a tuple, or a
    :class:`RankView`), ``what`` for what."""

    on: tuple
    what: str


class RankView(Sequence):
    """Ranks computed when read, for a Wait on many of them (every other worker of an all-reduce, the
    running workers of a PS server): no tuple of n ranks built per wait. Subclasses give ``__iter__``;
    a view equals the tuple of its ranks."""

    __slots__ = ()

    def __len__(self):
        return sum(1 for _ in self)

    def __getitem__(self, i):
        return tuple(self)[i]

    def __eq__(self, other):
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __hash__(self):
        return hash(tuple(self))


@action
class Finished:
    """The core has nothing more to do."""


class Deadlock(RuntimeError):
    """An in-process driver (the seeded scheduler, the simulator) found every unfinished core waiting and
    no message left to deliver: the cores cannot finish. The message says where each one is."""


@action
class ComputeGradient:
    """Compute the gradient of the next mini-batch at the current parameters (keep it for later)."""

    iteration: int


@action
class ApplyGradient:
    """Apply the computed gradient to the local parameters with the local optimizer (SGD)."""

    iteration: int
