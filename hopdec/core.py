"""The shape every protocol core shares (the Hop worker, the PS server, the PS worker).

A core is a plain Python state machine with no MPI, no torch and no clock (sans-I/O, like h11). A driver
feeds it *events* through its ``on_*`` methods (a message arrived, with the time it arrived where the
protocol needs one) and asks :meth:`next_action` what to do; the core answers with an *action* -- a
frozen dataclass naming what the driver must carry out -- or :class:`Wait` when nothing can happen until
an event arrives, or :class:`Finished`. Drivers (MPI runners, the in-process schedulers, the simulator)
only carry out actions; no protocol decision is ever taken outside a core.

Actions that mean the same thing on every side are defined here once.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Wait:
    """Nothing to do until an event arrives; ``on`` names whom the core waits for (ranks), ``what`` for what."""

    on: tuple
    what: str


@dataclass(frozen=True)
class Finished:
    """The core has nothing more to do."""


class Deadlock(RuntimeError):
    """An in-process driver (the seeded scheduler, the simulator) found every unfinished core waiting and
    no message left to deliver: the cores cannot finish. The message says where each one is."""


@dataclass(frozen=True)
class ComputeGradient:
    """Compute the gradient of the next mini-batch at the current parameters (keep it for later)."""

    iteration: int


@dataclass(frozen=True)
class ApplyGradient:
    """Apply the computed gradient to the local parameters with the local optimizer (SGD)."""

    iteration: int
