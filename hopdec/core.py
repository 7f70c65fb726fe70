"""The shape every protocol core shares (the Hop worker, the PS server, the PS worker).

A core is a plain Python state machine with no MPI, no torch and no clock (sans-I/O, like h11). A driver
feeds it *events* through its ``on_*`` methods (a message arrived, with the time it arrived where the
protocol needs one) and asks :meth:`next_action` what to do; the core answers with an *action* -- a
immutable record (:func:`action`) naming what the driver must carry out -- or :class:`Wait` when nothing can happen until
an event arrives, or :class:`Finished`. Drivers (MPI runners, the in-process schedulers, the simulator)
only carry out actions; no protocol decision is ever taken outside a core.

Actions that mean the same thing on every side are defined here once.
"""

from collections import namedtuple
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:                           # tells type checkers (and mypyc) that @action makes dataclasses
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**kwargs):
        return lambda f: f

_R = TypeVar("_R", bound="Record")


class Record:
    """The base of every :func:`action` class: what type checkers know of ``Cls.make`` (each class has its
    own, set by :func:`action`)."""

    __slots__ = ()

    @classmethod
    def make(cls: type[_R], fields: tuple) -> _R:       # pragma: no cover - replaced on every action class
        """An instance from a tuple of all its fields, without a Python frame (see :func:`action`)."""
        return tuple.__new__(cls, fields)               # type: ignore[type-var,return-value]


@dataclass_transform(frozen_default=True)
def action(cls):
    """An immutable record of the class's annotated fields (defaults allowed, last), built as a tuple.

    Like ``@dataclass(frozen=True)``: the fields are keyword or positional arguments and attributes, an
    instance equals another of the same class with equal fields (never one of another class, nor a plain
    tuple), hashes, copies, pickles and prints as ``Name(field=value, ...)``, and assigning a field raises
    (an ``AttributeError``); ``_replace(**changes)`` gives a changed copy. Unlike a dataclass it is a tuple
    (no ``__dict__``): a frozen dataclass took 440 ns to build and some 200 bytes, this 100-200 ns and 72,
    and the simulator builds some 13 actions, queue entries and Reduce terms per worker-iteration, millions
    per run. ``Cls.make((f1, f2, ...))`` builds one from a tuple of all its fields without a Python frame
    (the hot paths' way); ``Cls(f1, ...)`` checks and fills in defaults. Always true, as an object is."""
    names = list(cls.__dict__.get("__annotations__", {}))
    defaults = [cls.__dict__[n] for n in names if n in cls.__dict__]
    if any(n in cls.__dict__ for n in names[:len(names) - len(defaults)]):
        raise TypeError(f"{cls.__name__}: fields with defaults must come last")
    base = namedtuple(cls.__name__, names, defaults=defaults, module=cls.__module__)
    ns = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    ns.update(__slots__=(), __eq__=_same, __ne__=_other, __hash__=tuple.__hash__, __bool__=_true)
    rec = type(cls.__name__, (base, Record), ns)
    rec.__qualname__ = cls.__qualname__
    rec.make = partial(tuple.__new__, rec)
    return rec


def _same(a, b):
    return type(b) is type(a) and tuple.__eq__(a, b)


def _other(a, b):
    return type(b) is not type(a) or tuple.__ne__(a, b)


def _true(_):
    return True


@action
class Wait(Record):
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
class Finished(Record):
    """The core has nothing more to do."""


class Deadlock(RuntimeError):
    """An in-process driver (the seeded scheduler, the simulator) found every unfinished core waiting and
    no message left to deliver: the cores cannot finish. The message says where each one is."""


@action
class ComputeGradient(Record):
    """Compute the gradient of the next mini-batch at the current parameters (keep it for later)."""

    iteration: int


@action
class ApplyGradient(Record):
    """Apply the computed gradient to the local parameters with the local optimizer (SGD)."""

    iteration: int
