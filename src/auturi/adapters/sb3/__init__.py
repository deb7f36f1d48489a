"""One line around a Stable-Baselines3 model: :func:`wrap_sb3` (``auturi.wrap(model)``).

``wrap_sb3(model)`` returns the same ``PPO`` / ``A2C`` / ``SAC`` / ``TD3`` / ``DDPG`` / ``DQN``
object; ``model.learn()``, ``save``, ``predict`` and the logger keep working, but every
rollout is collected by an Auturi executor (and, with ``tune=True``, on a layout the online
tuner picks by measurement).

The package, by role:

- :mod:`.envs`: the envs are rebuilt in the workers from what the user passed (an env id,
  ``make_vec_env``, ``make_atari_env``, a custom env or wrapper instance that cloudpickles),
  or from ``env_fn=``; SB3's ``Monitor`` is re-created (a torch-free copy,
  :class:`EpisodeMonitor`, unless it writes a file); ``VecFrameStack`` and
  ``VecTransposeImage`` become per-env wrappers with SB3's layout, ``VecMonitor`` a per-env
  monitor; ``VecNormalize`` is applied in the policy replicas with the statistics of the
  start of the rollout (shipped with the weights).
- :mod:`.policy` (PPO/A2C) and :mod:`.off_policy` (SAC/TD3/DDPG/DQN): the policy adapters
  the replicas run, sampling every random number from the executor's per-env seeded noise.
- :mod:`.on_policy` / :mod:`.off_policy`: the instance's ``collect_rollouts`` is replaced
  (``types.MethodType``); each call publishes the weights once, runs one executor collect,
  then *replays* the rollout step by step exactly where SB3's loop would into the rollout
  buffer or the replay buffer.
- :mod:`.handle`: ``model.auturi``; :mod:`.wrap`: :func:`wrap_sb3`, :func:`unwrap_sb3`.

Nothing here imports torch or SB3 at import time: env workers unpickle the env factories
and must stay torch-free.

Example::

    from stable_baselines3 import PPO
    from auturi.adapters.sb3 import wrap_sb3

    model = wrap_sb3(PPO("MlpPolicy", "CartPole-v1", n_steps=128, seed=0))
    model.learn(20_000)
"""
from __future__ import annotations

from auturi.adapters.sb3.envs import EnvFactory, EnvRebuildError, EpisodeMonitor, FrameStack, TransposeImage
from auturi.adapters.sb3.handle import SB3Handle
from auturi.adapters.sb3.policy import DISTRIBUTIONS, SB3PolicyAdapter
from auturi.adapters.sb3.wrap import unwrap_sb3, wrap_sb3


__all__ = [
    "DISTRIBUTIONS",
    "EnvFactory",
    "EnvRebuildError",
    "EpisodeMonitor",
    "FrameStack",
    "SB3Handle",
    "SB3PolicyAdapter",
    "TransposeImage",
    "unwrap_sb3",
    "wrap_sb3",
]
