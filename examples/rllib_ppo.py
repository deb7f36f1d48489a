"""Train RLlib's PPO (new API stack) on CartPole-v1 with Auturi sampling the experience.

One line changes: ``auturi.wrap(config)``. The config is the same object; ``build_algo()``,
``train()``, checkpoints and the results dict work as before. The algorithm's local
EnvRunner becomes an ``AuturiEnvRunner`` that owns one executor holding every env; with
``tune=True`` the online tuner measures a few layouts on the first iterations (their data is
trained on, nothing is wasted) and locks in the fastest. Each result carries the layout under
``result["env_runners"]["auturi"]``.

Run: ``python examples/rllib_ppo.py`` (about a minute on 2 cores, Ray's start included).
"""
from __future__ import annotations

import ray
from ray.rllib.algorithms.ppo import PPOConfig

import auturi


def main() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a new local instance
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        # RLlib's layout: 2 EnvRunners x 4 envs. auturi.wrap keeps the 8 envs (so the train
        # batch and the rollout fragment do not change) and starts tuning from that layout.
        .env_runners(num_env_runners=2, num_envs_per_env_runner=4)
        .training(train_batch_size_per_learner=1000, minibatch_size=250, num_epochs=4, lr=3e-3)
        .debugging(seed=0)
    )
    # The one line. The budget keeps the demo short: measure three layouts (RLlib's, the
    # serial one, the tuner's best guess), 3 iterations each after a warm-up, then lock in.
    # Plain auturi.wrap(config) searches more.
    options = {"min_samples": 3, "max_samples": 3, "max_research_trials": 1}
    algo = auturi.wrap(config, budget_trials=3, tuner_options=options).build_algo()
    try:
        for i in range(15):
            result = algo.train()
            er = result["env_runners"]
            a = er["auturi"]
            print(f"iter {i + 1:2d}  return {er.get('episode_return_mean', float('nan')):6.1f}  "
                  f"{a['steps_per_s']:7,.0f} steps/s  [{a['phase']}] {a['config']}")
        tuner = algo.env_runner.auturi.tuner
        if tuner is not None and tuner.locked is not None:
            print(f"tuner locked in: {tuner.locked.config} at {tuner.locked.mean:,.0f} steps/s")
    finally:
        algo.stop()   # ends the executor's workers
        ray.shutdown()


if __name__ == "__main__":   # good practice; Auturi's workers never re-run this script
    main()
