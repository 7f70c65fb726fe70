"""The layout of a parameter message: float32 parameters, padding, then int64 header fields.

One buffer per message, so a model travels in one MPI call; step numbers ride in the header instead of
the tag (MPI only promises tags up to 32767). Shared by the decentralized and the parameter-server
transports; no MPI here.
"""

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
