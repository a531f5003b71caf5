"""Non-negative least squares for the handful of columns our cost fits have.

Step-cost constants (overheads, per-token and per-pair costs, efficiencies) are physical and cannot be negative;
an unconstrained fit on noisy steps happily trades a negative overhead for a larger slope. With at most ~5
columns, trying every subset of columns and keeping the best non-negative solution is exact and instant, and
needs nothing beyond numpy.
"""

from __future__ import annotations

import itertools

import numpy as np


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x >= 0`` minimising ``||a x - y||``: the best unconstrained fit over every subset of columns."""
    if a.ndim != 2 or a.shape[0] != y.shape[0]:
        raise ValueError(f"nnls needs a (rows, columns) matrix and rows values, got {a.shape} and {y.shape}")
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y ** 2))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sub = a[:, cols]
            if not np.any(sub):
                continue
            x, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(x < 0):
                continue
            err = float(np.sum((sub @ x - y) ** 2))
            if err < best_err:
                best_err, best = err, np.zeros(a.shape[1])
                best[list(cols)] = x
    return best
