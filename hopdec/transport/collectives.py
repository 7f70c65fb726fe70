"""Collectives that cannot hang: nonblocking MPI collectives waited for with the peer timeout.

A rank that died or hung during setup, evaluation or shutdown must not leave the others blocked in a
Barrier, Allreduce or gather forever: each call here posts the nonblocking variant and waits with
:func:`hopdec.transport.waiting.poll_until`, which raises :class:`~hopdec.transport.waiting.PeerTimeout`
after ``timeout`` seconds. Objects travel as JSON in byte buffers, never pickled.
"""

import json

import numpy as np

from hopdec.transport.waiting import PeerTimeout, poll_until


def _wait(comm, req, timeout, what):
    """Wait for ``req``; its timeout's line names the ranks that did not time out too (hung there)."""
    wait_for_all(comm, req.Test, timeout, lambda: (
        f"rank {comm.Get_rank()}: {what}: not every rank got there within {timeout:.0f} s; "
        f"a peer may have died or hung"))


def wait_for_all(comm, poll, timeout, message):
    """:func:`~hopdec.transport.waiting.poll_until` for a wait on every other living rank of ``comm`` (a
    collective, an agreement): its PeerTimeout names them as waited for, and its line the ones that did
    not time out too (``name_silent``: stopped or hung there)."""
    try:
        return poll_until(poll, timeout, message, name_silent=True)
    except PeerTimeout as err:
        err.on, err.on_comm = tuple(living_others(comm)), comm
        raise


def living_others(comm):
    """``comm``'s other ranks not known to have failed (ULFM's knowledge; without ULFM, all of them)."""
    from hopdec.transport.ulfm import failed_ranks
    failed = set(failed_ranks(comm))
    return [r for r in range(comm.Get_size()) if r != comm.Get_rank() and r not in failed]


def barrier(comm, timeout, what="barrier"):
    """Every rank reached this point (or PeerTimeout)."""
    _wait(comm, comm.Ibarrier(), timeout, what)


def allreduce_sum(comm, values, timeout, what="allreduce"):
    """Elementwise sum of ``values`` (a numpy array) over every rank."""
    from mpi4py import MPI
    out = np.empty_like(values)
    _wait(comm, comm.Iallreduce(values, out, op=MPI.SUM), timeout, what)
    return out


def broadcast(comm, values, timeout, what="broadcast", root=0):
    """``values`` (a numpy array, the same size on every rank) overwritten with ``root``'s."""
    _wait(comm, comm.Ibcast(values, root=root), timeout, what)
    return values


def first_difference(values):
    """``(rank, key)`` of the lowest rank whose value (one per rank, as :func:`allgather_json` returns them)
    differs from rank 0's, ``key`` the first key (sorted) where two dicts differ (None for other values);
    None when every rank agrees. What the ranks must agree on before exchanging (a model's layout, the
    topology, the settings) is compared this way, and the caller names what differs."""
    ref = values[0]
    for r, mine in enumerate(values):
        if mine != ref:
            if isinstance(mine, dict) and isinstance(ref, dict):
                return r, next(k for k in sorted(set(mine) | set(ref))
                               if k not in mine or k not in ref or mine[k] != ref[k])
            return r, None
    return None


def _encode(obj):
    return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8)


def _decode(buf, counts):
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [json.loads(buf[a:b].tobytes().decode("utf-8")) for a, b in zip(offsets[:-1], offsets[1:])]


def allgather_json(comm, obj, timeout, what="allgather"):
    """Every rank's ``obj`` (JSON-serialisable), on every rank, in rank order."""
    from mpi4py import MPI
    data = _encode(obj)
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    _wait(comm, comm.Iallgather(np.array([len(data)], dtype=np.int64), counts), timeout, what)
    out = np.empty(int(counts.sum()), dtype=np.uint8)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    _wait(comm, comm.Iallgatherv(data, [out, counts.tolist(), displs, MPI.BYTE]), timeout, what)
    return _decode(out, counts)


def gather_json(comm, obj, timeout, what="gather", root=0):
    """Every rank's ``obj`` on ``root`` (a list in rank order); None elsewhere."""
    from mpi4py import MPI
    data = _encode(obj)
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    _wait(comm, comm.Iallgather(np.array([len(data)], dtype=np.int64), counts), timeout, what)
    mine = comm.Get_rank() == root
    out = np.empty(int(counts.sum()) if mine else 0, dtype=np.uint8)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    spec = [out, counts.tolist(), displs, MPI.BYTE] if mine else None
    _wait(comm, comm.Igatherv(data, spec, root=root), timeout, what)
    return _decode(out, counts) if mine else None
