"""Spectral measures of a mixing matrix: how fast averaging spreads information (Hop footnote 2, Fig. 21).

>>> from hopdec.topology.generators import ring
>>> round(spectral_gap(ring(8)), 4)
0.1953
"""

import numpy as np

from hopdec.topology.weights import _matrix


def eigenvalue_moduli(G_or_W):
    """Moduli of the eigenvalues of W, largest first."""
    return np.sort(np.abs(np.linalg.eigvals(_matrix(G_or_W))))[::-1]


def spectral_gap(G_or_W):
    """``|lambda_1(W)| - |lambda_2(W)|``, eigenvalues sorted by modulus (Hop footnote 2).

    Bigger means information spreads faster. For a ring of n with self-loops and eq. (1) weights
    the eigenvalues are ``(1 + 2 cos(2 pi k / n)) / 3``:

    >>> round(spectral_gap(ring(5)), 4), round(spectral_gap(complete(6)), 4)
    (0.4607, 1.0)
    """
    m = eigenvalue_moduli(G_or_W)
    if len(m) == 1:
        return float(m[0])
    return float(max(m[0] - m[1], 0.0))


def normalized_laplacian_gap(G_or_W):
    """``1 - Re(lambda_2)`` of W with self-loops removed and columns renormalised.

    For an undirected graph this is the algebraic connectivity of the normalized Laplacian. It
    is the quantity that reproduces the spectral gaps Hop quotes for Fig. 21 (0.6667 for the
    ring-based graph of 8, 0.2682 and 0.2688 for :func:`hierarchical` variants ``a`` and ``b``);
    footnote 2's definition (:func:`spectral_gap`) gives different numbers for those graphs.

    >>> round(normalized_laplacian_gap(ring_based(8)), 4), round(spectral_gap(ring_based(8)), 4)
    (0.6667, 0.5)
    """
    W = _matrix(G_or_W).copy()
    n = len(W)
    if n == 1:
        return 1.0
    np.fill_diagonal(W, 0.0)
    col = W.sum(axis=0, keepdims=True)
    W = np.divide(W, col, out=np.zeros_like(W), where=col > 0)
    re = np.sort(np.linalg.eigvals(W).real)[::-1]
    return float(re[0] - re[1])
