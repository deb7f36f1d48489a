"""What every env-source module shares: the EnvPool id prefix and the seed of env ``i``.

Below :mod:`auturi.envs` and :mod:`auturi.envs.envpool`, which both read it, so neither
imports the other back. This module must not import torch: env workers import it.
"""
from __future__ import annotations

import numpy as np

ENVPOOL_PREFIX = "envpool:"


def env_seed(seed: int, env_index: int, generation: int) -> int:
    """Seed of env ``env_index``: ``seed + i`` the first time it is made; a fresh, distinct
    seed each time it is recreated (after a reconfigure moves it) so episodes do not repeat."""
    if generation == 0:
        return seed + env_index
    return int(np.random.SeedSequence([seed, env_index, generation]).generate_state(1)[0])
