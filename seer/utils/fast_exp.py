"""``exp`` over vocabulary-wide rows of shifted logits or log-probabilities, without torch's slow path.

Why: ``torch.exp`` on CPU leaves its vector path for arguments below about -87 (where the result is
subnormal or zero) and then runs 6-15x slower per element. Shifted logits reach there at low temperatures
(logits / 0.3 spread 3.3x wider) and log-probabilities of unlikely tokens do at any temperature. Measured on
110 x 49,152 float32 values, 2 threads: 3.7 ms with every argument near -1, 58 ms at -90, 22 ms at -200.
``torch.exp2`` has no such path (0.7-1.7 ms at any argument), so ``exp(x) = exp2(x * log2(e))`` costs one
multiply pass and a relative error of about 1e-5 at x = -100 (the rounding of the product), far below what
sampling or a float32 logprob resolves.
"""

from __future__ import annotations

import math

import torch

LOG2E = 1.0 / math.log(2.0)


def fast_exp(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` as a new tensor (one allocation), via ``exp2``; meant for x <= 0."""
    return (x * LOG2E).exp2_()
