"""``auturi.tune``'s checks of what it is given, before anything starts."""
from __future__ import annotations

import gymnasium as gym
import pytest

import auturi


def _cartpole():
    return gym.make("CartPole-v1")


def test_a_list_of_factories_that_does_not_match_num_envs_names_both_counts():
    with pytest.raises(ValueError, match="num_envs=2 but 3 env factories were given"):
        auturi.tune([_cartpole] * 3, num_envs=2, budget_seconds=1)
