"""Bytes hopdec copies between host memory and a GPU (over PCIe on a discrete GPU), counted at each copy.

A GPU model whose MPI is not CUDA-aware is staged through pinned host buffers: its parameters go to the
host once per send and every received update comes back to the device before a Reduce; a parameter
server's worker sends its gradient up and loads the server's weights down; mini-batches, evaluation
batches, checkpoints and the loss scalar cross too. Each site that copies calls :func:`to_device` or
:func:`to_host` with the bytes and what they were; a run's summary divides the totals by its iterations
(:func:`per_iteration_line`) and each rank logs them (event ``device_copies``). Nothing is counted for a
CPU model: no copy crosses.
"""

KINDS = ("parameters", "gradient", "data", "loss", "state", "evaluation")
"""What crosses: parameters (sends staged to the host, received updates and loaded weights to the device),
a gradient or model difference (parameter server, all-reduce), mini-batches, the loss scalar, checkpoint
state, evaluation batches and parameters."""

_counts = {"to_device": dict.fromkeys(KINDS, 0), "to_host": dict.fromkeys(KINDS, 0)}


def to_device(nbytes, what):
    """Count ``nbytes`` copied from host memory to the device as ``what`` (one of :data:`KINDS`)."""
    _counts["to_device"][what] += int(nbytes)


def to_host(nbytes, what):
    """Count ``nbytes`` copied from the device to host memory as ``what`` (one of :data:`KINDS`)."""
    _counts["to_host"][what] += int(nbytes)


def counts():
    """A copy of the totals so far: ``{"to_device": {kind: bytes}, "to_host": {kind: bytes}}``."""
    return {d: dict(c) for d, c in _counts.items()}


def reset():
    """Zero the totals (a new run in the same process: tests, a user's second loop)."""
    for c in _counts.values():
        for k in c:
            c[k] = 0


def since(before, now=None):
    """The bytes counted between two :func:`counts` (``now``: the current totals)."""
    now = counts() if now is None else now
    return {d: {k: now[d][k] - before[d].get(k, 0) for k in now[d]} for d in now}


def log_to(logger, device, mpi_buffers="host"):
    """Log the totals so far as the event ``device_copies`` (a model on a GPU only; before the log closes)."""
    if device is not None and str(device) != "cpu":
        logger.event("device_copies", device=str(device), mpi_buffers=mpi_buffers, **counts())


def _mb(n):
    """MiB (2^20 bytes), hopdec's unit for sizes (``--message-mb``, the report's counters); small figures
    in bytes. (It was 10^6 bytes as "MB", 4.9% from the simulator's and the report's figures.)"""
    return f"{n / 2 ** 20:.3g} MiB" if n >= 1e5 else f"{n:,.0f} bytes"


def _span(values):
    """``0.114-0.229 MiB`` (or one figure when every value is the same)."""
    lo, hi = _mb(min(values)), _mb(max(values))
    if lo == hi:
        return lo
    return f"{lo.split()[0]}-{hi}" if lo.split()[1:] == hi.split()[1:] else f"{lo}-{hi}"


def per_iteration_line(rows, mpi_buffers):
    """The summary's line on host-device copies: ``rows`` are ranks' ``(rank, device, copies, iterations)``
    with ``copies`` as :func:`counts` gives them (training only); ``mpi_buffers``: "host" (staged) or
    "device" (CUDA-aware MPI). None when no rank's model is on a GPU."""
    gpu = [r for r in rows if r[1] is not None and not str(r[1]).startswith("cpu")]
    if not gpu:
        return None

    def per_it(r, d):
        return sum(r[2][d].values()) / max(r[3], 1)

    down = [per_it(r, "to_device") for r in gpu]
    up = [per_it(r, "to_host") for r in gpu]
    first = gpu[0]
    parts = ", ".join(f"{k} {_mb(v / max(first[3], 1))}" for k, v in
                      ((k, first[2]["to_device"][k] + first[2]["to_host"][k]) for k in KINDS) if v)
    how = ("MPI takes device buffers (CUDA-aware)" if mpi_buffers == "device"
           else "MPI buffers staged through pinned host memory")
    spread = "" if len(gpu) == 1 else (f"; every GPU rank: {_span(down)} to the device, "
                                       f"{_span(up)} to the host")
    return (f"PCIe: rank {first[0]} ({first[1]}) copied {_mb(down[0])} to the device and {_mb(up[0])} to the "
            f"host per iteration ({parts or 'nothing'}; {how}){spread}")
