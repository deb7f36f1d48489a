"""User scripts around ``auturi.wrap(model)`` that the other SB3 tests did not try
(2026-11-26; the findings and their repro scripts: /work/notes/sb3-findings.md):

- a callback (or a loop between ``learn`` calls) that changes the envs through the model's
  VecEnv (``env_method`` / ``set_attr``, a curriculum) changed envs nothing trains on: now an
  error naming the fix; ``get_attr`` warns;
- an env id registered by the training script (``entry_point="__main__:MyEnv"``) failed in
  every worker process at the first collect;
- ``VecCheckNan`` around the model's env was refused; it now raises (or warns) as in SB3;
- a ``learn`` interrupted (Ctrl-C) inside a collect closed the executor, and the next
  ``learn`` said "a worker failed, or it was closed";
- an env made from a registered id and changed afterwards (``env_method`` before the wrap)
  was rebuilt without the change;
- off-policy callbacks missed SB3's loop locals (``num_collected_steps``, ``env``, ...);
- pickling a wrapped model failed on a semaphore; a model dropped without ``close()`` could
  segfault the process in ``gc.collect()``.
"""
from __future__ import annotations

import math
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from stable_baselines3 import PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecCheckNan, VecNormalize

import auturi
from auturi.errors import AuturiError

pytestmark = [pytest.mark.filterwarnings("ignore:You have specified a mini-batch size"),
              pytest.mark.filterwarnings("ignore:.*render_mode=.rgb_array. that is not in the possible")]

N_STEPS = 8
TWO_ACTORS = auturi.Config(num_actors=2, envs_per_actor=1)  # one process per env


class LevelEnv(gym.Env):
    """Rewards its level at every step: what a curriculum would change."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, level: int = 0):
        self.level = level

    def set_level(self, level: int) -> None:
        self.level = level

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), float(self.level), False, False, {}


def ppo(env, **kw):
    return PPO("MlpPolicy", env, n_steps=N_STEPS, batch_size=2 * N_STEPS, n_epochs=1, seed=0, device="cpu", **kw)


# ------------------------------------------------------------------ env_method / set_attr
class SetLevelAtRolloutEnd(BaseCallback):
    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.training_env.env_method("set_level", 3)


@pytest.mark.parametrize("vecnorm", [False, True])
def test_calls_that_change_the_envs_raise_while_wrapped_and_pass_again_after_close(vecnorm):
    """Plain SB3 trains at level 3 after the callback's ``env_method``; wrapped, the call
    reached the model's own VecEnv, which is not stepped, and the learner kept getting level
    0 rewards. It now raises, naming why and the fix; reads warn; ``close`` gives the VecEnv
    its own calls back (the same object, nothing left on it)."""
    venv = DummyVecEnv([LevelEnv] * 2)
    model = ppo(VecNormalize(venv) if vecnorm else venv)
    model = auturi.wrap(model, config=auturi.Config.serial(2))
    try:
        with pytest.raises(AuturiError, match=r"env_method\('set_level'\) on the model's VecEnv cannot reach the "
                                              r"envs that train.*model.auturi.close\(\)"):
            model.learn(2 * N_STEPS, callback=SetLevelAtRolloutEnd())
        env = model.get_env()  # VecNormalize passes the calls down to the guarded VecEnv
        with pytest.raises(AuturiError, match=r"set_attr\('level'\)"):
            env.set_attr("level", 3)
        with pytest.warns(UserWarning, match=r"get_attr\('level'\) reads the model's own VecEnv"):
            assert env.get_attr("level") == [0, 0]
        assert venv.envs[0].level == 0  # nothing reached the model's envs either
    finally:
        model.auturi.close()
    assert not {"env_method", "set_attr", "get_attr"} & set(vars(venv))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.get_env().env_method("set_level", 3)
        assert model.get_env().get_attr("level") == [3, 3]
    # Plain SB3 again (after close): its loop steps these envs, at the level just set.
    model.learn(N_STEPS * 2)
    got = model.get_vec_normalize_env().get_original_reward() if vecnorm else model.rollout_buffer.rewards
    assert np.all(got == 3.0)


def test_a_vec_env_reused_after_its_model_was_dropped_without_close_works_and_wraps_again():
    """A sweep that builds each trial's model on one SubprocVecEnv and drops it without
    ``close()``: the guard stayed on the VecEnv, so ``env_method`` raised with no model
    training and the next wrap (which reads a SubprocVecEnv's envs through ``set_attr``) was
    refused. The guard now stands aside once its model's handle is gone. And the collection
    itself: the executor, collected as cyclic garbage with its control block, wrote into the
    unmapped block from ``__del__`` and the process died (run after the tests above, 6 of 6);
    the handle's finalizer now closes the executor whole when the model is collected."""
    import gc
    import weakref

    from stable_baselines3.common.vec_env import SubprocVecEnv

    venv = make_vec_env(LevelEnv, 2, vec_env_cls=SubprocVecEnv)
    try:
        for trial in range(2):
            # No watchdog thread: while armed it holds a frame of the collect (and so the model)
            # until its next look, up to 1 s later, and the model would outlive gc.collect().
            model = auturi.wrap(ppo(venv), config=auturi.Config.serial(2), worker_timeout=math.inf)
            model.learn(2 * N_STEPS)
            handle = weakref.ref(model.auturi)
            del model
            gc.collect()
            assert handle() is None
            assert venv.env_method("set_level", trial + 1) == [None, None]
            assert venv.get_attr("level") == [trial + 1] * 2
    finally:
        venv.close()


def test_a_wrapped_models_env_still_pickles_and_the_model_says_why_it_does_not():
    """The guard must not make the VecEnv unpicklable (a closure did); a copy has the VecEnv's
    own calls. Pickling the wrapped model failed on the executor's semaphores with "Semaphore
    objects should only be shared between processes through inheritance": now the error says
    to ``model.save`` or close first. ``get_attr`` with positional indices still works."""
    import pickle

    model = auturi.wrap(ppo(DummyVecEnv([LevelEnv] * 2)), config=auturi.Config.serial(2))
    try:
        copy = pickle.loads(pickle.dumps(model.env))
        copy.env_method("set_level", 4, indices=[1])
        assert copy.get_attr("level") == [0, 4]
        with pytest.warns(UserWarning, match="reads the model's own VecEnv"):
            assert model.env.get_attr("level", [1]) == [0]
        with pytest.raises(TypeError, match=r"cannot be pickled.*model.save\(path\).*model.auturi.close\(\)"):
            pickle.dumps(model)
    finally:
        model.auturi.close()


# ------------------------------------------------------------------ "__main__:MyEnv" entry points
class ScriptEnv(LevelEnv):
    """Stands for a class of the training script: registered as ``__main__:...`` below."""


def test_an_id_the_script_registers_with_a_main_entry_point_is_made_in_the_workers(monkeypatch):
    """``gym.register("X-v0", entry_point="__main__:ScriptEnv")`` in the training script:
    Auturi's workers never run the script, so ``gym.make`` there failed with ``module
    '__main__' has no attribute`` at the first collect (the serial layout ran it). The recipe
    now ships the class the entry point names; the env keyword reaches every worker."""
    env_id = "AuturiScriptEnv-v0"
    monkeypatch.setattr(sys.modules["__main__"], "AuturiScriptEnvClass", ScriptEnv, raising=False)
    gym.register(env_id, entry_point="__main__:AuturiScriptEnvClass", max_episode_steps=5)
    try:
        model = auturi.wrap(ppo(make_vec_env(env_id, 2, env_kwargs={"level": 2})), config=TWO_ACTORS)
        try:
            model.learn(2 * N_STEPS)
            assert np.all(model.rollout_buffer.rewards == 2.0)
            assert [e["l"] for e in model.ep_info_buffer][:2] == [5, 5]  # the registered time limit holds
        finally:
            model.auturi.close()
        model.env.close()
    finally:
        gym.registry.pop(env_id, None)


# ------------------------------------------------------------------ VecCheckNan
class NanAt(gym.Wrapper):
    """Returns NaN (in the observation or the reward) at its ``at``-th step."""

    def __init__(self, env, at: int = 5, where: str = "obs"):
        super().__init__(env)
        self.n, self.at, self.where = 0, at, where

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.n += 1
        if self.n == self.at:
            if self.where == "obs":
                obs = np.full_like(obs, np.nan)
            else:
                reward = float("nan")
        return obs, reward, terminated, truncated, info


def nan_cartpole(n: int, where: str = "obs"):
    return make_vec_env("CartPole-v1", n, seed=0, wrapper_class=NanAt, wrapper_kwargs={"where": where})


@pytest.mark.parametrize("config", [auturi.Config.serial(2), TWO_ACTORS], ids=["serial", "two_actors"])
def test_vec_check_nan_raising_stops_at_the_env_step_that_returned_nan(config):
    """SB3's VecCheckNan(raise_exception=True) raises a ValueError at the step; wrapped, the
    replicas would act on the NaN first (PPO failed on NaN logits inside the collect), so the
    executor checks each step and the error, a ValueError too, names VecCheckNan and the env."""
    model = auturi.wrap(ppo(VecCheckNan(nan_cartpole(2), raise_exception=True)), config=config)
    try:
        with pytest.raises(ValueError, match=r"VecCheckNan\(raise_exception=True\).*env \d: step\(\) returned an "
                                             r"observation with \d non-finite"):
            model.learn(2 * N_STEPS)
    finally:
        model.auturi.close()


def test_vec_check_nan_warns_as_sb3_and_trains_on():
    """Warn mode (VecCheckNan's default) with a NaN reward: plain SB3 warns once, from the
    step, and trains on; so does the wrapped model, with SB3's message."""
    found = {}
    for wrapped in (False, True):
        model = ppo(VecCheckNan(nan_cartpole(2, where="reward")))
        if wrapped:
            model = auturi.wrap(model, config=auturi.Config.serial(2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.learn(2 * N_STEPS)
        found[wrapped] = [str(w.message).split(".")[0] for w in caught if "found nan" in str(w.message)]
        if wrapped:
            model.auturi.close()
        assert model.num_timesteps == 2 * N_STEPS
    assert found[True] == found[False] == ["found nan in rewards"]


def test_vec_check_nan_above_vec_normalize_is_accepted_and_vec_normalize_updates_as_in_sb3():
    """VecCheckNan outside VecNormalize (it changes no data) no longer trips the rule that
    VecNormalize must be outermost; the statistics move as in plain SB3."""
    counts = []
    for wrapped in (False, True):
        model = ppo(VecCheckNan(VecNormalize(make_vec_env("CartPole-v1", 2, seed=0)), raise_exception=True))
        if wrapped:
            model = auturi.wrap(model, config=auturi.Config.serial(2))
        model.learn(2 * N_STEPS)
        counts.append(model.get_vec_normalize_env().obs_rms.count)
        if wrapped:
            model.auturi.close()
    assert counts[0] == counts[1]


def test_vec_normalize_under_another_wrapper_names_the_order_to_build():
    """The refusal named ``VecNormalize(VecFrameStack(...))`` whatever the outer wrapper was."""
    from stable_baselines3.common.vec_env import VecMonitor

    model = ppo(VecMonitor(VecNormalize(DummyVecEnv([LevelEnv] * 2))))
    with pytest.raises(NotImplementedError, match=r"found under VecMonitor\); build the VecEnv as "
                                                  r"VecNormalize\(VecMonitor\(\.\.\.\)\) instead"):
        auturi.wrap(model, config=auturi.Config.serial(2))


# ------------------------------------------------------------------ Ctrl-C inside a collect
class InterruptAt(gym.Wrapper):
    """Raises KeyboardInterrupt (what Ctrl-C raises in the main thread) at its ``at``-th step."""

    def __init__(self, env, at: int = 12):
        super().__init__(env)
        self.n, self.at = 0, at

    def step(self, action):
        self.n += 1
        if self.n == self.at:
            raise KeyboardInterrupt
        return self.env.step(action)


def test_the_learn_after_a_ctrl_c_in_a_collect_says_so_and_close_then_wrap_continues():
    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", 1, seed=0, wrapper_class=InterruptAt), learning_starts=4,
                batch_size=8, train_freq=(4, "step"), seed=0, device="cpu")
    model = auturi.wrap(model, config=auturi.Config.serial(1))
    with pytest.raises(KeyboardInterrupt):
        model.learn(40)
    done = model.num_timesteps
    with pytest.raises(AuturiError, match=r"closed when a learn\(\) was interrupted \(KeyboardInterrupt, Ctrl-C\).*"
                                          r"model.auturi.close\(\).*auturi.wrap\(model\)"):
        model.learn(8, reset_num_timesteps=False)
    model.auturi.close()
    model = auturi.wrap(model, config=auturi.Config.serial(1))  # the recipe's wrapper counts afresh
    try:
        model.learn(8, reset_num_timesteps=False)
        assert model.num_timesteps == done + 8
    finally:
        model.auturi.close()


# ------------------------------------------------------------------ an id-made env changed after gym.make
class EzLevelEnv(LevelEnv, gym.utils.EzPickle):
    """Pickles by re-running its constructor (as gymnasium's MuJoCo envs and ale_py's
    AtariEnv do): a copy has the constructor's level, not the one set later."""

    def __init__(self, level: int = 0):
        LevelEnv.__init__(self, level)
        gym.utils.EzPickle.__init__(self, level)


@pytest.fixture
def registered():
    ids = {"AuturiLevelEnv-v0": LevelEnv, "AuturiEzLevelEnv-v0": EzLevelEnv}
    for env_id, cls in ids.items():
        gym.register(env_id, entry_point=cls, max_episode_steps=50)
    yield
    for env_id in ids:
        gym.registry.pop(env_id, None)


def test_a_registered_env_changed_after_gym_make_is_copied_with_the_change(registered):
    """``make_vec_env("X-v0")`` then ``env_method("set_level", 3)`` (before the wrap, or between
    close and a new wrap as the F1 error advises): plain SB3 trains at level 3; the workers
    made the env from its id, at level 0, with no sign of it. The change is now found and the
    live env copied; where a copy would drop it too, a warning names it and the fix."""
    venv = make_vec_env("AuturiLevelEnv-v0", 2)
    venv.env_method("set_level", 3, indices=[1])
    model = auturi.wrap(ppo(venv), config=TWO_ACTORS)
    try:
        model.learn(2 * N_STEPS)
        assert np.all(model.rollout_buffer.rewards[:, 0] == 0.0)
        assert np.all(model.rollout_buffer.rewards[:, 1] == 3.0)
    finally:
        model.auturi.close()

    venv = make_vec_env("AuturiEzLevelEnv-v0", 2)
    venv.env_method("set_level", 3)
    with pytest.warns(UserWarning, match=r"was changed after gym.make\('AuturiEzLevelEnv-v0'\) \(level=3 \(as made: "
                                         r"0\)\), and a copy of it by pickling does not keep \['level'\].*env_kwargs"):
        model = auturi.wrap(ppo(venv), config=auturi.Config.serial(2))
    model.auturi.close()


def test_an_id_made_env_that_was_only_stepped_is_still_made_from_its_id():
    """A plain SB3 run before the wrap moves the env's state attributes (CartPole's
    ``steps_beyond_terminated``), which are not changes: the recipe stays ``gym.make``."""
    from auturi.adapters.sb3.recover import factories_from_vecenv

    venv = make_vec_env("CartPole-v1", 2, seed=0)
    venv.reset()
    for _ in range(100):
        venv.step(np.array([0, 0]))  # pushes the cart over: episodes end
    assert [f.base[0] for f in factories_from_vecenv(venv)] == ["make", "make"]


# ------------------------------------------------------------------ off-policy callback locals
class LoopLocals(BaseCallback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def _on_step(self) -> bool:
        loc = self.locals
        self.seen.append((loc["num_collected_steps"], loc["num_collected_episodes"], loc["env"] is self.model.env,
                          loc["train_freq"].frequency, loc["learning_starts"], loc["continue_training"]))
        return True


def test_off_policy_callbacks_see_sb3s_loop_locals():
    """SB3's off-policy loop hands callbacks ``num_collected_steps``, ``num_collected_episodes``,
    ``env``, ``train_freq``, ``learning_starts`` and ``continue_training``; the replay lacked them
    (a KeyError in a callback that reads them). Now the same values, step by step."""
    seen = []
    for wrapped in (False, True):
        model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", 2, seed=0), learning_starts=6, batch_size=8,
                    train_freq=(3, "step"), seed=0, device="cpu")
        if wrapped:
            model = auturi.wrap(model, config=auturi.Config.serial(2))
        cb = LoopLocals()
        model.learn(24, callback=cb)
        seen.append(cb.seen)
        if wrapped:
            model.auturi.close()
    assert seen[0] == seen[1]
    assert [s[0] for s in seen[1]] == [1, 2, 3] * 4


# ------------------------------------------------------------------ the user's monitor files
class EpisodesSeen(BaseCallback):
    def __init__(self):
        super().__init__()
        self.lengths: list[int] = []

    def _on_step(self) -> bool:
        self.lengths += [int(info["episode"]["l"]) for info in self.locals["infos"] if "episode" in info]
        return True


def test_the_tuners_timing_writes_no_episode_into_the_users_monitor_files(tmp_path, monkeypatch):
    """``make_vec_env(monitor_dir=)`` files hold the learner's episodes and nothing else, as in
    plain SB3: the tuner times env 0 with random actions (wrap-time and rollout profiles), on a
    copy with the in-memory monitor (the files had ~23 extra random episodes in a 6,000-step run)."""
    from stable_baselines3.common.monitor import load_results

    from auturi.adapters.sb3.envs import EnvFactory
    from auturi.tuner.timing import time_env

    timed = []
    quiet = EnvFactory.for_timing
    monkeypatch.setattr(EnvFactory, "for_timing", lambda self: timed.append(self) or quiet(self))
    model = ppo(make_vec_env("CartPole-v1", 2, monitor_dir=str(tmp_path), seed=0))
    auturi.wrap(model, tuner_options={"cache": False})
    try:
        seen = EpisodesSeen()
        model.learn(N_STEPS * 2 * 40, callback=seen)
        assert timed, "the tuner timed no env: nothing here was checked"
        time_env(model.auturi.executor.env_fns[0], seconds=0.0, min_steps=300, max_steps=300)  # ~13 episodes
    finally:
        model.auturi.close()
        model.env.close()
    written = sorted(int(x) for x in load_results(str(tmp_path))["l"])
    assert seen.lengths and written == sorted(seen.lengths)
