"""Actions from uniform noise: the one place every policy (``TorchPolicy``, the SB3 and RLlib
adapters) turns an env's pre-drawn uniform numbers into a sample.

The executor draws noise per env and per step from a seeded stream (``docs/architecture.md``),
so which random numbers an env sees never depends on batching; a policy then samples by
inverting the distribution's CDF at those numbers. Keeping the inversion in one module keeps
one clamp, so every face samples a Gaussian the same way.

Example:
    >>> import torch
    >>> categorical_from_uniform(torch.tensor([[0.2, 0.5, 0.3]]), torch.tensor([0.6])).tolist()
    [1]
    >>> float(normal_from_uniform(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([0.5]))[0])
    1.0
"""
from __future__ import annotations

from typing import Any

UNIFORM_CLAMP = 1e-7
"""Noise is kept in ``[UNIFORM_CLAMP, 1 - UNIFORM_CLAMP]`` before a Gaussian's inverse CDF, whose
value at 0 or 1 is infinite; at 1e-7 a sample lies within about 5.2 standard deviations, and
1 - 1e-7 still rounds below 1 in float32."""


def categorical_from_uniform(probs: Any, u: Any) -> Any:
    """Index of the category whose CDF interval holds ``u``: ``probs`` is ``(batch, n)``, ``u``
    is ``(batch,)``; a ``u`` past the last CDF value (rounding) gives the last category."""
    cdf = probs.cumsum(dim=-1)
    return (cdf < u.unsqueeze(-1).to(cdf.dtype)).sum(dim=-1).clamp_(max=probs.shape[-1] - 1)


def normal_from_uniform(mean: Any, std: Any, u: Any) -> Any:
    """``mean + std * ndtri(u)`` with ``u`` clamped (:data:`UNIFORM_CLAMP`) and reshaped to ``mean``."""
    import torch

    z = torch.special.ndtri(u.clamp(UNIFORM_CLAMP, 1 - UNIFORM_CLAMP).to(mean.dtype)).reshape(mean.shape)
    return mean + std * z
