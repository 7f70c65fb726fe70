"""The layout of a parameter message: float32 parameters, padding, then int64 header fields.

One buffer per message, so a model travels in one MPI call; step numbers ride in the header instead of
the tag (MPI only promises tags up to 32767). Shared by the decentralized and the parameter-server
transports; no MPI here. A decentralized update's header may also carry a token grant
(:func:`split_grants`).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def header_offset(numel):
    """Where the int64 header starts in a message of ``numel`` float32 parameters (8-byte aligned)."""
    return numel + numel % 2


def message_floats(numel, fields=1):
    """Length in float32s of a message: the parameters, padding, ``fields`` int64 header fields."""
    return header_offset(numel) + 2 * fields


def header(buf, numel):
    """The int64 header fields stored after the parameters (numpy array or torch tensor view)."""
    tail = buf[header_offset(numel):]
    if isinstance(buf, np.ndarray):
        return tail.view(np.int64)
    import torch
    return tail.view(torch.int64)


NO_GRANT: int = -1
"""The grant field of an update header that carries no grant (cumulative counts are >= 0)."""


def split_grants(dests: Any, grants: Any, grantees: Any) -> tuple[int, list[tuple[int, int]]]:
    """Which of ``grants`` (``[(worker, cumulative count)]``, due now) one update to ``dests`` can carry.

    Returns ``(carried, rest)``: the count to write into the update's header (:data:`NO_GRANT` for
    none) and the grants that must go as grant messages. The header is one for all destinations, so it
    carries a count only when every destination among ``grantees`` (the workers this one grants tokens
    to) has that very count in ``grants``; normally all counts are equal, every token queue getting one
    token per iteration. A destination this worker does not grant to ignores the count (its sender is
    not one of its out-neighbours), so it may receive the update all the same.

    >>> split_grants((1, 2), [(1, 5), (2, 5), (3, 5)], grantees={1, 2, 3})
    (5, [(3, 5)])
    >>> split_grants((1, 2), [(1, 5)], grantees={1, 2})          # 2 must not read 5
    (-1, [(1, 5)])
    >>> split_grants((1, 4), [(1, 5)], grantees={1})              # 4 ignores it
    (5, [])
    """
    if not grants:
        return NO_GRANT, []
    if len(grants) == len(dests):       # the usual case: one count, to exactly the update's destinations
        carried = grants[0][1]
        for (i, c), d in zip(grants, dests):
            if i != d or c != carried:
                break
        else:
            return carried, []
    want = dict(grants)
    carried = NO_GRANT
    for d in dests:
        c = want.get(d)
        if c is None:
            if d in grantees:
                return NO_GRANT, list(grants)
        elif carried == NO_GRANT:
            carried = c
        elif c != carried:
            return NO_GRANT, list(grants)
    if carried == NO_GRANT:
        return NO_GRANT, list(grants)
    return carried, [(i, c) for i, c in grants if i not in dests]
