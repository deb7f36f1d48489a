"""``auturi.wrap(model)`` takes a model on any VecEnv SB3 ships, however it was built (issue 32, part 1).

A ``SubprocVecEnv`` keeps no env factories: its envs exist only in its worker processes. Each
is read there (``auturi.adapters.sb3.recover._RecipeProbe``) into the recipe a ``DummyVecEnv``'s
env gets here. One test per way of building the envs: ``make_vec_env`` from an id, from a
callable with ``wrapper_class``, ``env_kwargs`` and ``monitor_dir``; ``SubprocVecEnv([fn] * n)``
with each start method; ``make_atari_env`` with ``VecFrameStack`` and ``VecTransposeImage``;
rl-baselines3-zoo's ``create_envs`` with ``VecNormalize``. Each checks that the first rollout
of the wrapped model is the one SB3's own loop collects on the same VecEnv from the same seed,
both acting with the mode of the policy: same observations, actions, episode starts and
episodes logged; rewards, values and log-probs within float rounding (a truncated episode's
reward adds ``gamma * V(terminal observation)``). And one test of the error for an env that
cannot be copied.

The wrapped model runs on the VecEnv that SB3's own loop used just before: the rebuilt envs
must start as fresh envs seeded ``seed + i``, whatever state the live ones are in.
"""
from __future__ import annotations

import glob
import os
import threading

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
)

from auturi import Config
from auturi.adapters.sb3 import EnvRebuildError, unwrap_sb3, wrap_sb3
from auturi.adapters.sb3.recover import PROBE_ATTR

pytestmark = pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")

SEED, N_STEPS = 5, 12
EXACT = ("observations", "actions", "episode_starts")
ROUNDED = ("rewards", "values", "log_probs")


class ScaleReward(gym.Wrapper):
    """A wrapper whose constructor arguments gymnasium does not record (a ``wrapper_class``)."""

    def __init__(self, env: gym.Env, scale: float = 1.0):
        super().__init__(env)
        self.scale = scale

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward * self.scale, terminated, truncated, info


def short_cartpole(length: int = 100) -> gym.Env:
    """A callable for ``make_vec_env``: CartPole whose episodes end after ``length`` steps."""
    return gym.make("CartPole-v1", max_episode_steps=length)


class DriftEnv(gym.Env):
    """An unregistered env (rebuilt by copying it): a point drifting by its actions, episodes
    of a seeded random length that end terminated or truncated."""

    observation_space = gym.spaces.Box(-10, 10, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, speed: float = 0.5):
        self.speed = speed
        self.x, self.t, self.length = np.zeros(3, np.float32), 0, 5

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        self.t, self.length = 0, int(self.np_random.integers(3, 8))
        return self.x.copy(), {}

    def step(self, action):
        self.t += 1
        self.x = np.clip(self.x + self.speed * (int(action) - 1) + self.np_random.normal(0, 0.1, 3), -10, 10)
        self.x = self.x.astype(np.float32)
        end = self.t >= self.length
        terminated = end and bool(self.np_random.random() < 0.5)
        return self.x.copy(), float(self.x.sum()), terminated, end and not terminated, {}


def drift_env() -> gym.Env:
    return DriftEnv(speed=0.25)


class LockedEnv(DriftEnv):
    """Holds a handle no pickle copies (a lock), given by the function that built it."""

    def __init__(self, lock):
        super().__init__()
        self.lock = lock


class FirstRollout(BaseCallback):
    """The rollout buffer at the end of the first rollout (before the update flattens it)."""

    def __init__(self):
        super().__init__()
        self.buffer: dict[str, np.ndarray] | None = None

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.buffer is None:
            b = self.model.rollout_buffer
            self.buffer = {k: getattr(b, k).copy() for k in EXACT + ROUNDED}


def first_rollout(model, config: Config | None) -> tuple[dict[str, np.ndarray], list[tuple[float, int]]]:
    """One rollout (and its update) of ``model`` acting with the mode of its policy: SB3's own
    loop (``config=None``) or ``auturi.wrap(model, config=config)``. Returns the rollout buffer
    and the episodes logged, as (return, length)."""
    if config is None:
        forward = model.policy.forward
        model.policy.forward = lambda obs, deterministic=False: forward(obs, deterministic=True)
    else:
        wrap_sb3(model, config=config, deterministic=True)
    try:
        cb = FirstRollout()
        model.learn(N_STEPS * model.n_envs, callback=cb)
    finally:
        if config is not None:
            unwrap_sb3(model)
    return cb.buffer, [(e["r"], e["l"]) for e in model.ep_info_buffer]


def assert_wrap_collects_as_sb3(make_model, config: Config, want_episodes: bool = True) -> dict[str, np.ndarray]:
    """``make_model()`` twice over the same VecEnv (a fresh model, seeded ``SEED``): SB3's
    own first rollout, then the wrapped model's; they must match. Returns the wrapped one."""
    ref, ref_eps = first_rollout(make_model(), None)
    got, got_eps = first_rollout(make_model(), config)
    for k in EXACT:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    for k in ROUNDED:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=k)
    # (return, length) of each episode logged, in order (VecMonitor's returns are float32 sums,
    # its per-env equivalent's float64 sums rounded to 6 digits as Monitor's)
    assert [length for _, length in got_eps] == [length for _, length in ref_eps]
    np.testing.assert_allclose([r for r, _ in got_eps], [r for r, _ in ref_eps], rtol=1e-6)
    assert not want_episodes or len(ref_eps) > 0  # episodes ended (auto-reset, terminal observations)
    return got


@pytest.fixture(autouse=True)
def one_thread():
    """Torch on one thread: the box has 2 cores and workers share them."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def ppo(venv, policy: str = "MlpPolicy"):
    return lambda: PPO(policy, venv, n_steps=N_STEPS, batch_size=N_STEPS * venv.num_envs, n_epochs=1, seed=SEED,
                       device="cpu")


# ------------------------------------------------------------------ one test per builder
def test_make_vec_env_id_on_subproc():
    """``make_vec_env("CartPole-v1", vec_env_cls=SubprocVecEnv)`` (SB3's default start
    method), ``env_kwargs`` included; the search's start layout (an env worker per env)."""
    venv = make_vec_env("CartPole-v1", n_envs=2, seed=SEED, env_kwargs={"max_episode_steps": 5},
                        vec_env_cls=SubprocVecEnv)
    try:
        assert_wrap_collects_as_sb3(ppo(venv), Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2))
    finally:
        venv.close()


@pytest.mark.parametrize("vec_env_cls,vec_env_kwargs,config", [
    (DummyVecEnv, {}, Config.serial(2)),
    # fork: the start method is not what this test is about, and the cheapest (SB3's workers
    # import nothing); Auturi's env workers run the recipes read in SB3's
    (SubprocVecEnv, {"start_method": "fork"}, Config(num_actors=1, envs_per_actor=2, env_parallel_degree=2))],
    ids=["DummyVecEnv", "SubprocVecEnv"])
def test_make_vec_env_callable_wrapper_class_env_kwargs_monitor_dir(vec_env_cls, vec_env_kwargs, config, tmp_path):
    """``make_vec_env(callable, wrapper_class=, wrapper_kwargs=, env_kwargs=, monitor_dir=)``:
    the script's wrapper (outside SB3's ``Monitor``, which writes a file no pickle copies) runs
    where Auturi steps the envs, and the monitor files get the wrapped run's episodes after SB3's."""
    venv = make_vec_env(short_cartpole, n_envs=2, seed=SEED, env_kwargs={"length": 4}, wrapper_class=ScaleReward,
                        wrapper_kwargs={"scale": 3.0}, monitor_dir=str(tmp_path), vec_env_cls=vec_env_cls,
                        vec_env_kwargs=vec_env_kwargs)
    try:
        got = assert_wrap_collects_as_sb3(ppo(venv), config)
    finally:
        venv.close()
    going_on = got["episode_starts"][1:] == 0  # steps that ended no episode: the env's reward alone
    assert set(np.unique(got["rewards"][:-1][going_on])) == {3.0}  # scaled: ScaleReward ran
    rows = []
    for name in sorted(glob.glob(os.path.join(tmp_path, "*.monitor.csv"))):
        with open(name) as f:
            rows.append([line.split(",")[:2] for line in f.read().splitlines()[2:]])
    assert len(rows) == 2
    for r in rows:  # SB3's episodes, then the same ones again from the wrapped run
        assert len(r) % 2 == 0 and len(r) > 0 and r[: len(r) // 2] == r[len(r) // 2:], r


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_subproc_vec_env_of_a_function_list(start_method):
    """``SubprocVecEnv([fn] * n, start_method=...)`` with unregistered envs (copied from
    the worker by pickling): one of a module's class, one of a class defined in the test (as
    in a training script: cloudpickle ships it by value to the worker and back), and
    ``VecMonitor`` on top, with each start method."""

    class ScriptDrift(DriftEnv):
        def step(self, action):
            obs, reward, terminated, truncated, info = super().step(action)
            return obs, -reward, terminated, truncated, info

    venv = VecMonitor(SubprocVecEnv([drift_env, lambda: ScriptDrift(speed=0.75)], start_method=start_method))
    try:
        assert_wrap_collects_as_sb3(ppo(venv), Config.serial(2))
    finally:
        venv.close()


def test_make_atari_env_on_subproc_with_frame_stack_and_transpose():
    """``make_atari_env(..., vec_env_cls=SubprocVecEnv)`` under ``VecFrameStack``; PPO adds
    ``VecTransposeImage``."""
    pytest.importorskip("ale_py")
    # "module:id": gymnasium imports ale_py (which registers ALE/...) in SB3's workers too.
    venv = VecFrameStack(make_atari_env("ale_py:ALE/Pong-v5", n_envs=2, seed=SEED, vec_env_cls=SubprocVecEnv,
                                        vec_env_kwargs={"start_method": "fork"}), n_stack=4)  # fork: the cheapest
    try:
        got = assert_wrap_collects_as_sb3(ppo(venv, "CnnPolicy"), Config.serial(2), want_episodes=False)
    finally:
        venv.close()
    assert got["observations"].shape == (N_STEPS, 2, 4, 84, 84)
    assert len(np.unique(got["observations"][-1])) > 1  # frames of the game, not zeros


def test_rl_zoo_create_envs_with_vec_normalize(tmp_path):
    """rl-baselines3-zoo's ``ExperimentManager.create_envs``: ``make_vec_env`` over a
    closure of the registry's spec, a closure applying the ``env_wrapper`` classes, the log
    folder as ``monitor_dir``, the configured VecEnv class and its keywords, then ``VecNormalize``
    (observations kept raw here: with ``norm_obs`` Auturi's replicas act on the statistics of
    the rollout's start, see docs/adapters.md)."""
    spec = gym.spec("CartPole-v1")

    def make_env(**kwargs) -> gym.Env:
        return spec.make(**kwargs)

    wrapper_classes, wrapper_kwargs = [ScaleReward, gym.wrappers.TimeAwareObservation], [{"scale": 2.0}, {}]

    def wrap_env(env: gym.Env) -> gym.Env:
        for cls, kwargs in zip(wrapper_classes, wrapper_kwargs):
            env = cls(env, **kwargs)
        return env

    venv = make_vec_env(make_env, n_envs=2, seed=SEED, env_kwargs={"max_episode_steps": 6}, monitor_dir=str(tmp_path),
                        wrapper_class=wrap_env, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"start_method": "fork"},
                        monitor_kwargs={})
    venv = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=0.99)

    def make_model():
        venv.ret_rms = type(venv.ret_rms)()  # both runs start from the same (empty) statistics
        venv.returns = np.zeros(venv.num_envs)
        return ppo(venv)()

    try:
        got = assert_wrap_collects_as_sb3(make_model, Config.serial(2))
    finally:
        venv.close()
    assert got["observations"].shape == (N_STEPS, 2, 5)  # TimeAwareObservation ran
    assert not np.isin(got["rewards"], (0.0, 2.0)).all()  # normalised: not ScaleReward's raw 2.0


class CountingDrift(DriftEnv):
    """Keeps a log of its steps that a wrapper may read."""

    def __init__(self):
        super().__init__()
        self.log: list[int] = []

    def step(self, action):
        self.log.append(int(action))
        return super().step(action)


class RewardByLog(gym.Wrapper):
    """Reads the log of the env it wraps through an object it holds (not through ``env``)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.log = env.unwrapped.log

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward + len(self.log), terminated, truncated, info


def steps_of(env: gym.Env, seed: int, actions) -> list[tuple]:
    env.reset(seed=seed)
    return [tuple(np.asarray(x).tolist() for x in env.step(a)[:4]) for a in actions]


def test_a_script_wrapper_is_copied_alone_unless_it_shares_state_with_the_env_inside():
    """A wrapper that records no constructor arguments is copied without the env it wraps,
    which is rebuilt as layers (``ScaleReward`` over CartPole: a ``"state"`` layer); one whose
    state holds an object of the env inside (``RewardByLog``) is copied with that env, so the
    two go on sharing it. Either way the rebuilt env steps as the user's fresh one."""
    from auturi.adapters.sb3.recover import factories_from_vecenv

    actions = [0, 1, 2, 1, 0, 2, 2, 1]
    for fn, kind in [(lambda: ScaleReward(short_cartpole(), 3.0), "state"),
                     (lambda: RewardByLog(CountingDrift()), "pickle")]:
        venv = DummyVecEnv([fn])
        (factory,) = factories_from_vecenv(venv)
        assert kind in [factory.base[0]] + [layer[0] for layer in factory.layers], factory
        env = factory()
        n = env.action_space.n
        assert steps_of(env, 3, [a % n for a in actions]) == steps_of(fn(), 3, [a % n for a in actions])
        venv.close()


# ------------------------------------------------------------------ what cannot be rebuilt
def test_error_for_an_env_that_cannot_be_copied_and_the_vec_env_left_as_it_was():
    """An env holding a handle given by the lambda that built it (a lock: ``fork`` is the
    start method that lets such a lambda reach the worker) cannot be copied: the error names
    the env, the reason and ``env_fn=``; the SubprocVecEnv is left working, without the probe;
    with ``env_fn=`` the model trains."""
    lock = threading.Lock()
    venv = SubprocVecEnv([lambda: LockedEnv(lock)] * 2, start_method="fork")
    try:
        model = PPO("MlpPolicy", venv, n_steps=N_STEPS, batch_size=2 * N_STEPS, n_epochs=1, seed=SEED, device="cpu")
        with pytest.raises(EnvRebuildError, match=r"env 0 of the model's SubprocVecEnv: the env LockedEnv .*"
                                                  r"cannot be copied to another process by pickling .*lock.*env_fn="):
            wrap_sb3(model, config=Config.serial(2))
        assert "auturi" not in vars(model)
        assert venv.env_method("has_wrapper_attr", PROBE_ATTR) == [False, False]
        venv.reset()
        assert venv.step(np.array([0, 2]))[0].shape == (2, 3)
        wrap_sb3(model, config=Config.serial(2), env_fn=lambda: LockedEnv(threading.Lock()))
        try:
            model.learn(2 * N_STEPS)
            assert model.num_timesteps == 2 * N_STEPS
        finally:
            unwrap_sb3(model)
    finally:
        venv.close()
