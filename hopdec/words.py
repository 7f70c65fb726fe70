"""Counts in the words users read: ``1 worker``, ``2 workers`` (a summary line of a one-worker run read
"1 server + 1 workers")."""

from __future__ import annotations


def count(n: int, noun: str, plural: str = "") -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural`` when ``noun + "s"`` is not it).

    >>> count(1, "worker"), count(3, "worker"), count(0, "update"), count(1, "gradient dropped", "gradients dropped")
    ('1 worker', '3 workers', '0 updates', '1 gradient dropped')
    >>> count(1234, "event")
    '1,234 events'
    """
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
