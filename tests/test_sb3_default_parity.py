"""Learning parity of ``auturi.wrap(model)``'s default path, online tuning on (issue 12, part 3).

The contract: the data never depends on the config. So an online tuner that reconfigures
every few collects (envs moving live between the caller, env workers and actor processes,
policy replicas with several batch sizes) must give the learner what ``Config.serial`` gives
it: the same observations, actions, rewards and episode starts in every rollout, the same
episodes logged, values, log-probs, returns and advantages within float rounding (a network
rounds differently for another batch shape), and so the same parameters after ``learn``
within rounding. And the serial wrapped run must be plain SB3's own loop, bit for bit, once
both act with the same random numbers (:class:`bench.parity.ExecutorNoise`): then a
learning gap between plain SB3 and ``auturi.wrap(model)`` is the random stream of the
actions, nothing the executor or the replay does (``docs/benchmarks.md``, learning parity).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import auturi
from auturi import Config
from auturi.tuner.space import SearchSpace
from bench.parity import ExecutorNoise

pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")

N_ENVS, N_STEPS, ROLLOUTS, SEED = 4, 16, 12, 3
# The layouts the online tuner is made to visit, one after another (grid order), before it
# locks in the fastest: every kind of move an env can make on a reconfigure.
LAYOUTS = [Config.serial(N_ENVS),
           Config(num_actors=2, envs_per_actor=2),                            # envs into actor processes
           Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2),     # back, half into an env worker
           Config(num_actors=1, envs_per_actor=4, policies_per_actor=2, policy_batch_size=2),  # replicas
           Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)]     # actors with env workers
EXACT = ("observations", "actions", "episode_starts")
# Computed by the network; rewards too, where a truncation adds gamma * V(terminal observation).
ROUNDED = ("rewards", "values", "log_probs", "returns", "advantages")
# Episodes end within rollouts; a short limit makes truncations (bootstrapped from
# V(terminal observation)) as common as terminations.
MAX_EPISODE_STEPS = 20


class Record(BaseCallback):
    """Every rollout buffer (before the update flattens it), every episode logged, and the
    layout each rollout ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.buffers: list[dict[str, np.ndarray]] = []
        self.episodes: list[tuple[float, int]] = []
        self.truncated = 0

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.episodes.append((info["episode"]["r"], info["episode"]["l"]))
                self.truncated += bool(info.get("TimeLimit.truncated"))
        return True

    def _on_rollout_end(self) -> None:
        b = self.model.rollout_buffer
        self.buffers.append({k: getattr(b, k).copy() for k in EXACT + ROUNDED})


def learn(kind: str) -> tuple[Record, dict[str, torch.Tensor], object]:
    """``ROLLOUTS`` rollouts of PPO on CartPole: ``kind`` ``serial`` (``auturi.wrap`` with
    ``Config.serial``), ``online`` (``auturi.wrap`` with the online tuner made to visit
    ``LAYOUTS``) or ``plain`` (SB3's own loop acting with the executor's noise)."""
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=SEED, env_kwargs={"max_episode_steps": MAX_EPISODE_STEPS})
    model = PPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=32, n_epochs=2, seed=SEED, device="cpu")
    rec, tuner = Record(), None
    if kind == "plain":
        with ExecutorNoise(model, SEED):
            model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=rec)
    else:
        if kind == "serial":
            auturi.wrap(model, config=Config.serial(N_ENVS))
        else:
            # min_samples 2 (the fewest the protocol takes), no time share, no cache, no
            # re-search: the grid's layouts in turn, each for one or two collects.
            space = SearchSpace(totals=(N_ENVS,), cores=2, devices=("cpu",), configs=LAYOUTS)
            auturi.wrap(model, strategy="grid", budget_trials=len(LAYOUTS), tuner_options={
                "space": space, "min_samples": 2, "max_samples": 2, "min_sample_seconds": 0, "lock_margin": 0,
                "warmup_collects": 0, "cache": False, "search_share": None, "drop_patience": 10_000})
            # The worker servers serve before learn: the tuner's first trial would otherwise wait
            # for them over some of these 12 rollouts, and the grid would not reach every layout.
            model.auturi.executor.warm_start()
            assert model.auturi.executor.wait_warm(timeout=120)
        try:
            model.learn(N_STEPS * N_ENVS * ROLLOUTS, callback=rec)
            tuner = model.auturi.tuner
        finally:
            model.auturi.close()
    env.close()
    params = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
    return rec, params, tuner


@pytest.fixture(scope="module")
def serial():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the box has 2 cores; one thread also keeps torch's CPU results fixed
    try:
        yield learn("serial")
    finally:
        torch.set_num_threads(n)


def assert_same_rollouts(ref: Record, got: Record, exact_floats: bool) -> None:
    assert len(got.buffers) == len(ref.buffers) == ROLLOUTS
    for i, (a, b) in enumerate(zip(ref.buffers, got.buffers)):
        for k in EXACT:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"rollout {i}: {k}")
        for k in ROUNDED:
            if exact_floats:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"rollout {i}: {k}")
            else:
                np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5, err_msg=f"rollout {i}: {k}")
    assert got.episodes == ref.episodes  # (return, length) of every episode, in order, and their count


def test_online_tuning_gives_the_serial_rollouts(serial):
    """The online tuner visits every layout of ``LAYOUTS`` (envs moving live at each
    reconfigure): every rollout, every episode logged and the final parameters are the serial
    run's."""
    ref, ref_params, _ = serial
    torch.set_num_threads(1)
    got, params, tuner = learn("online")
    assert {t.config for t in tuner.history} == set(LAYOUTS)
    moves = [r["executor"] for r in tuner.reconfigures]
    assert len(moves) >= len(LAYOUTS) - 1
    assert sum(m["moved"] for m in moves) > 0 and sum(m["recreated"] for m in moves) == 0  # live, never recreated
    # The episodes span reconfigures and both endings occur, bootstrapped or not.
    assert len(ref.episodes) > 2 * N_ENVS and 0 < ref.truncated < len(ref.episodes)
    assert_same_rollouts(ref, got, exact_floats=False)
    for k, v in ref_params.items():
        torch.testing.assert_close(params[k], v, rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def test_serial_wrap_is_plain_sb3_with_the_executors_noise(serial):
    """Plain SB3 acting with the executor's noise fills the same buffers, bit for bit, logs
    the same episodes and ends with the same parameters as the serial wrapped run: the replay
    (truncation bootstrap, episode starts, GAE) is SB3's own loop."""
    ref, ref_params, _ = serial
    torch.set_num_threads(1)
    got, params, _ = learn("plain")
    assert_same_rollouts(ref, got, exact_floats=True)
    for k, v in ref_params.items():
        assert torch.equal(params[k], v), k


def test_executor_noise_samples_like_sb3():
    """:class:`ExecutorNoise` changes only where the uniform numbers come from: actions
    follow the policy's distribution (a far-from-uniform one here) at SB3's frequencies."""
    env = make_vec_env("CartPole-v1", n_envs=N_ENVS, seed=SEED)
    model = PPO("MlpPolicy", env, n_steps=N_STEPS, seed=SEED, device="cpu")
    with torch.no_grad():
        model.policy.action_net.bias.copy_(torch.tensor([0.0, 1.5]))  # P(action 1) ~ 0.82
        model.policy.action_net.weight.zero_()
    obs = torch.zeros((N_ENVS, 4))
    noise = ExecutorNoise(model, SEED)
    with noise:
        acts = torch.cat([model.policy(obs)[0] for _ in range(N_STEPS * 50)]).float()
    assert noise.steps == N_STEPS * 50
    p1 = float(torch.sigmoid(torch.tensor(1.5)))
    assert abs(float(acts.mean()) - p1) < 0.03, (float(acts.mean()), p1)  # 3200 draws: SD 0.007
    assert "_get_action_dist_from_latent" not in vars(model.policy)  # uninstalled after the block
    env.close()
