"""Small torch networks for the built-in workloads (imports torch)."""
from __future__ import annotations

import torch
from torch import nn


class MLPActorCritic(nn.Module):
    """Separate 64x64 tanh MLPs for policy and value, as SB3's default MlpPolicy."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 64, continuous: bool = False):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, act_dim))
        self.vf = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, 1))
        if continuous:
            self.log_std = nn.Parameter(torch.zeros(act_dim))

    def forward(self, obs: torch.Tensor):
        x = obs.reshape(obs.shape[0], -1).float()
        return self.pi(x), self.vf(x)


class NatureCNNActorCritic(nn.Module):
    """The Nature DQN trunk (84x84 frames, channels first) with policy and value heads."""

    def __init__(self, in_channels: int, act_dim: int):
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(),
        )
        self.pi = nn.Linear(512, act_dim)
        self.vf = nn.Linear(512, 1)

    def forward(self, obs: torch.Tensor):
        h = self.trunk(obs.float() / 255.0)
        return self.pi(h), self.vf(h)
