"""SB3's Atari recipe through ``auturi.wrap`` with what ``pip install auturi[atari,sb3]``
installs (issue 34, item 2): ``AtariWrapper`` (OpenCV resizes its frames) and
``tensorboard_log=`` (tensorboard). An ``env_fn`` making an ALE id in a worker process is
tested without SB3 in ``tests/test_env_process_tree.py`` (here the envs step in the caller:
a worker making SB3's wrappers imports SB3 and torch, 10 s on the 2-core machine)."""
from __future__ import annotations

import pytest

pytest.importorskip("stable_baselines3")
ale_py = pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
pytest.importorskip("cv2", reason="the [atari] extra's opencv-python-headless is not installed")
pytest.importorskip("tensorboard", reason="the [sb3] extra's tensorboard is not installed")

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import VecFrameStack

import auturi


def make_pong() -> gym.Env:
    return AtariWrapper(gym.make("ALE/Pong-v5"))


class LastRollout(BaseCallback):
    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.observations = self.model.rollout_buffer.observations.copy()  # (steps, envs, ...), before train()


def test_atari_recipe_with_an_env_fn_and_tensorboard(tmp_path):
    gym.register_envs(ale_py)
    venv = VecFrameStack(make_vec_env(make_pong, n_envs=2, seed=0), n_stack=4)
    model = PPO("CnnPolicy", venv, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu",
                tensorboard_log=str(tmp_path))
    model = auturi.wrap(model, config=auturi.Config.serial(2), backend="serial",
                        env_fn=lambda: Monitor(AtariWrapper(gym.make("ALE/Pong-v5"))))
    last = LastRollout()
    try:
        model.learn(32, callback=last, tb_log_name="pong")
    finally:
        model.auturi.close()
        venv.close()
    assert last.observations.shape == (8, 2, 4, 84, 84)  # 84x84 frames (OpenCV), 4 stacked, channels first
    assert len(set(last.observations[-1, 1].ravel().tolist())) > 1  # env 1 shows the game, not zeros
    assert list(tmp_path.glob("pong_1/events.out.tfevents.*"))
