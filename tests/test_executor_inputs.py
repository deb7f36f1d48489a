"""The executor refuses a policy that cannot act before any env or worker starts."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import auturi
from auturi.errors import ConfigError


def test_no_policy_is_a_type_error_naming_what_to_pass():
    with pytest.raises(TypeError, match="policy must be an auturi Policy.*got NoneType.*TorchPolicy"):
        auturi.make_executor("CartPole-v1", None, num_envs=2, backend="serial")


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
def test_a_policy_on_a_device_this_machine_lacks_is_a_config_error():
    policy = auturi.TorchPolicy(lambda: torch.nn.Linear(4, 2), gym.spaces.Discrete(2), device="cuda:3")
    with pytest.raises(ConfigError, match="cuda:3.*TorchPolicy\\(\\.\\.\\., device='cpu'\\)"):
        auturi.make_executor("CartPole-v1", policy, num_envs=2, backend="serial")
