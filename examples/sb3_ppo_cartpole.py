"""Train SB3's PPO on CartPole-v1 with Auturi collecting the experience.

One line changes: ``auturi.adapters.sb3.wrap_sb3(model)`` (``auturi.wrap(model)``). The
model is the same object: ``learn``, callbacks, the logger, ``save`` and ``predict`` work
as before. With ``tune=True`` the online tuner measures a few layouts on the first rollouts
(their data is used for training, nothing is wasted) and locks in the fastest; its choice
shows in the log under ``auturi/``.

Run: ``python examples/sb3_ppo_cartpole.py`` (15-30 s on 2 cores).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from auturi.adapters.sb3 import unwrap_sb3, wrap_sb3


def main() -> None:
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=10,
                learning_rate=1e-3, ent_coef=0.0, seed=0, device="cpu", verbose=0)
    # The one line (auturi.wrap(model, ...)). The budget keeps this demo short: measure two
    # layouts (the serial one and the tuner's best guess), and if throughput later drops,
    # re-measure the chosen one only. Plain auturi.wrap(model) searches more.
    model = wrap_sb3(model, tune=True, budget_trials=2, tuner_options={"max_research_trials": 1})
    try:
        model.learn(10_000)
        tuner = model.auturi.tuner
        if tuner is not None and tuner.locked is not None:
            print(f"tuner locked in: {tuner.locked.config} at {tuner.locked.mean:,.0f} steps/s")
        print(f"collection ran on: {model.auturi.config}")
        print(f"mean return of the last 20 episodes: {np.mean([e['r'] for e in model.ep_info_buffer][-20:]):.1f}")
        with tempfile.TemporaryDirectory() as d:
            model.save(Path(d) / "ppo_cartpole")          # saves as usual
            loaded = PPO.load(Path(d) / "ppo_cartpole")    # a plain SB3 model
            obs = env.reset()
            print("predict:", loaded.predict(obs, deterministic=True)[0])
    finally:
        unwrap_sb3(model)   # ends the workers now (they also end at exit)


if __name__ == "__main__":   # good practice; Auturi's workers never re-run this script
    main()
