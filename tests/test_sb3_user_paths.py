"""User scripts around ``auturi.wrap(model)`` that the other SB3 tests did not try
(2026-11-26; the findings and their repro scripts: /work/notes/sb3-findings.md):

- a callback (or a loop between ``learn`` calls) that changes the envs through the model's
  VecEnv (``env_method`` / ``set_attr``, a curriculum) changed envs nothing trains on, and
  ``get_attr`` read them: the calls now reach the envs that train (the executor's
  ``env_call``), with plain SB3's data;
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
import threading
import warnings
from typing import Any

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


# ------------------------------------------------------------------ env_method / set_attr / get_attr
class Curriculum(BaseCallback):
    """At each rollout's end: records the rollout's rewards, raises env 0's level
    (``env_method``) and env 1's (``set_attr``), and reads them back (``get_attr``)."""

    def __init__(self) -> None:
        super().__init__()
        self.rewards: list[np.ndarray] = []
        self.read: list[list] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        k = len(self.rewards) + 1
        self.rewards.append(self.model.rollout_buffer.rewards.copy())
        env = self.training_env  # through VecNormalize, when there is one
        assert env.env_method("set_level", k, indices=[0]) == [None]
        env.set_attr("level", 10 * k, indices=1)
        self.read.append(env.get_attr("level") + env.get_attr("level", [1]))


def curriculum_run(vecnorm: bool, config: auturi.Config | None) -> tuple[Curriculum, Any]:
    venv = DummyVecEnv([LevelEnv] * 2)
    model = ppo(VecNormalize(venv) if vecnorm else venv)
    if config is not None:
        model = auturi.wrap(model, config=config)
    cb = Curriculum()
    try:
        model.learn(4 * N_STEPS * 2, callback=cb)
        assert model.get_env().get_attr("level") == [4, 40]  # read after learn, between learns
    finally:
        if config is not None:
            model.auturi.close()
    return cb, venv


@pytest.mark.parametrize("vecnorm,config", [(False, auturi.Config.serial(2)), (True, TWO_ACTORS)],
                         ids=["serial", "vecnormalize-two_actors"])
def test_a_curriculum_through_env_method_and_set_attr_trains_on_plain_sb3s_rewards(vecnorm, config):
    """Plain SB3 trains at each level the callback sets; wrapped, the calls reached the
    model's own VecEnv, which is not stepped, and the learner kept getting level 0 rewards
    (2026-11-26; then an error). They now reach the envs that train, in this process or in
    actor processes: every rollout's rewards (VecNormalize's normalised ones too) and every
    read equal plain SB3's, bit for bit. ``close`` gives the VecEnv its own calls back."""
    want, _ = curriculum_run(vecnorm, None)
    got, venv = curriculum_run(vecnorm, config)
    assert len(got.rewards) == len(want.rewards) == 4
    for g, w in zip(got.rewards, want.rewards):
        np.testing.assert_array_equal(g, w)
    assert got.read == want.read == [[k, 10 * k, 10 * k] for k in (1, 2, 3, 4)]
    assert (want.rewards[-1][:, 1] != 0).all()  # the levels reached the rewards
    assert not {"env_method", "set_attr", "get_attr"} & set(vars(venv))
    assert venv.get_attr("level") == [0, 0]  # the model's own envs were not stepped, nor changed


class ClockEnv(gym.Env):
    """Observations that do not depend on the actions (or the seed): a wrapper's running
    statistics of them are the same whatever the policy did."""

    observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t * 0.5, 1.0], np.float32), 0.0, self.t >= 5, False, {}


def test_get_attr_reads_a_wrappers_statistics_from_the_envs_that_train():
    """gymnasium's NormalizeObservation as ``wrapper_class``: its ``obs_rms`` (what evaluation
    or deployment needs) read through the model's env equals plain SB3's after learn, bit for
    bit (it was the unstepped copy's: a count of 1, 2026-11-26)."""
    def stats(wrap_config):
        venv = make_vec_env(ClockEnv, 2, wrapper_class=gym.wrappers.NormalizeObservation)
        model = ppo(venv)
        if wrap_config is not None:
            model = auturi.wrap(model, config=wrap_config)
        try:
            model.learn(3 * N_STEPS * 2)
            return [(r.count, r.mean.copy(), r.var.copy()) for r in model.get_env().get_attr("obs_rms")]
        finally:
            if wrap_config is not None:
                model.auturi.close()

    want, got = stats(None), stats(TWO_ACTORS)  # in actor processes: the statistics come back pickled
    assert want[0][0] > 3 * N_STEPS
    for (gc, gm, gv), (wc, wm, wv) in zip(got, want):
        assert gc == wc
        np.testing.assert_array_equal(gm, wm)
        np.testing.assert_array_equal(gv, wv)


def test_env_calls_while_wrapped_keep_sb3s_errors_and_a_call_from_on_step_is_told_it_lands_later():
    """A missing attribute is an AttributeError, as from SB3's envs (``VecEnv.has_attr``
    relies on it), naming the env; an env's own exception names the env and the call (the
    first of ``indices`` that raised, although both actors' envs raised); a
    call from ``on_step`` (the replay of a collect that already ran) is told that it lands
    a rollout later than in plain SB3."""
    model = auturi.wrap(ppo(DummyVecEnv([LevelEnv] * 2)), config=TWO_ACTORS)
    try:
        env = model.get_env()
        assert env.has_attr("level") and not env.has_attr("no_such_thing")
        with pytest.raises(AttributeError, match=r"env 1: get_attr\('no_such_thing'\) raised AttributeError"):
            env.get_attr("no_such_thing", indices=[1])
        with pytest.raises(AuturiError, match=r"env 0: env_method\('set_level'\) raised TypeError"):
            env.env_method("set_level")  # a missing argument

        class OnStep(BaseCallback):
            def _on_step(self) -> bool:
                self.training_env.env_method("set_level", 2)
                return True

        with pytest.warns(UserWarning, match=r"env_method\('set_level'\) from a callback's on_step reaches the envs "
                                             r"after the whole collect"):
            model.learn(2 * N_STEPS * 2, callback=OnStep())
    finally:
        model.auturi.close()


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
    to ``model.save`` or close first. ``get_attr`` with positional indices is forwarded too."""
    import pickle

    model = auturi.wrap(ppo(DummyVecEnv([LevelEnv] * 2)), config=auturi.Config.serial(2))
    try:
        copy = pickle.loads(pickle.dumps(model.env))
        copy.env_method("set_level", 4, indices=[1])
        assert copy.get_attr("level") == [0, 4]
        model.env.env_method("set_level", 5, indices=[1])  # reaches the executor's envs, not the copy's
        assert model.env.get_attr("level", [1]) == [5] and copy.get_attr("level") == [0, 4]
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
        model.learn(N_STEPS * 2 * 40, callback=seen)  # the tuner profiles env 0 where its rules say so
        time_env(model.auturi.executor.env_fns[0], seconds=0.0, min_steps=300, max_steps=300)  # ~13 episodes
        assert timed, "time_env did not time the quiet copy"
    finally:
        model.auturi.close()
        model.env.close()
    written = sorted(int(x) for x in load_results(str(tmp_path))["l"])
    assert seen.lengths and written == sorted(seen.lengths)


def test_monitors_getters_reach_the_envs_that_train():
    """``env_method("get_episode_lengths")`` (SB3's ``Monitor`` getters) answers from the envs
    that train: each env's list holds the episodes the learner saw from it, in order."""

    class PerEnv(BaseCallback):
        def __init__(self):
            super().__init__()
            self.lengths: list[list[int]] = [[], []]

        def _on_step(self) -> bool:
            for i, info in enumerate(self.locals["infos"]):
                if "episode" in info:
                    self.lengths[i].append(int(info["episode"]["l"]))
            return True

    model = auturi.wrap(ppo(make_vec_env("CartPole-v1", 2, seed=0)), config=TWO_ACTORS)
    try:
        seen = PerEnv()
        model.learn(N_STEPS * 2 * 10, callback=seen)
        env = model.get_env()
        assert env.env_method("get_episode_lengths") == seen.lengths and all(seen.lengths)
        assert env.env_method("get_total_steps") == [N_STEPS * 10] * 2
        assert env.env_method("get_episode_rewards", indices=[1]) == [[float(x) for x in seen.lengths[1]]]
    finally:
        model.auturi.close()


def test_the_wrap_says_where_its_seconds_went(capsys, tmp_path, monkeypatch):
    """``model.auturi.wrap_seconds``: rebuilding the envs, starting the executor, the tuner's
    wrap-time look (the H200 box's wraps took 10-22 s, and nothing said where); ``verbose=1``
    prints it in one line."""
    monkeypatch.setenv("AUTURI_CACHE_DIR", str(tmp_path))
    fixed = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), n_steps=8, seed=0, verbose=1)
    fixed = auturi.wrap(fixed, config=auturi.Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2))
    tuned = auturi.wrap(PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), n_steps=8, seed=0))
    try:
        for h in (fixed.auturi, tuned.auturi):
            w = h.wrap_seconds
            assert set(w) == {"envs", "executor", "tuner", "moves", "total"}
            assert all(v >= 0 for v in w.values())
            assert w["total"] == pytest.approx(w["envs"] + w["executor"] + w["tuner"])
        assert fixed.auturi.wrap_seconds["tuner"] < 0.05 and fixed.auturi.wrap_seconds["moves"] == 0  # no tuner
        out = capsys.readouterr().out
        assert "auturi: wrapped in " in out and "executor started" in out and "env_degree=2" in out
        assert out.count("auturi: wrapped in ") == 1  # the second model is verbose=0
    finally:
        fixed.auturi.close()
        tuned.auturi.close()


def _first_obs(n: int, seed: int) -> np.ndarray:
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    return np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)])


@pytest.mark.parametrize("reseed", ["env.seed", "model.set_random_seed"])
def test_a_reseed_before_the_wrap_seeds_the_envs_that_train_and_one_after_it_warns(reseed):
    """SB3 resets env i with the VecEnv's pending seed s + i; a reseed after the model was
    built sets them. The wrap took the model's constructor seed instead, and a reseed after
    the wrap reached only the VecEnv nothing steps; both without a sign."""
    model = ppo(make_vec_env("CartPole-v1", n_envs=2, seed=0))
    (model.get_env().seed if reseed == "env.seed" else model.set_random_seed)(123)
    auturi.wrap(model, config=auturi.Config.serial(2))
    try:
        with pytest.warns(UserWarning, match=r"does not reseed the envs that train.*with 123 \+ i"):
            model.get_env().seed(7)
        model.learn(2 * N_STEPS)
        first = model.rollout_buffer.observations[[0, N_STEPS]]  # flattened env by env after training on it
        np.testing.assert_array_equal(first, _first_obs(2, 123))
    finally:
        model.auturi.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # closed: the VecEnv's own seed again, no warning
        model.get_env().seed(5)


def test_vec_monitor_episode_returns_equal_sb3s_and_keep_their_types():
    """SB3's VecMonitor sums the VecEnv's rewards into float32 returns and int32 lengths,
    unrounded; its stand-in in the envs that train summed Python floats rounded to 6 digits,
    as Monitor does: Pendulum's returns differed in the 7th digit, their types too."""
    from stable_baselines3.common.vec_env import VecMonitor

    from bench.parity import ExecutorNoise

    def run(wrap: bool) -> list:
        env = VecMonitor(DummyVecEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=N_STEPS)] * 2))
        model = ppo(env)
        if wrap:
            auturi.wrap(model, config=auturi.Config.serial(2))
            try:
                model.learn(2 * N_STEPS * 2)
            finally:
                model.auturi.close()
        else:
            with ExecutorNoise(model, 0):
                model.learn(2 * N_STEPS * 2)
        env.close()
        return [(e["r"], type(e["r"]), e["l"], type(e["l"])) for e in model.ep_info_buffer]

    plain, wrapped = run(False), run(True)
    assert len(plain) == 4 and wrapped == plain


def test_vec_monitors_stand_in_adds_a_subproc_vec_envs_float64_rewards_as_vec_monitor_does():
    """A SubprocVecEnv hands VecMonitor float64 rewards, added into its float32 array (in
    float64, then rounded); a DummyVecEnv float32 ones, added in float32."""
    from auturi.adapters.sb3.envs import EpisodeMonitor

    rewards = [0.1, 1e-8, 2.3, -7.123456789, 1e-9] * 5

    class Fixed(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(1), gym.spaces.Discrete(1)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return 0, {}

        def step(self, action):
            self.t += 1
            return 0, rewards[self.t - 1], self.t == len(rewards), False, {}

    for sums, reward_dtype in (("float32", np.float32), ("float64", np.float64)):
        env = EpisodeMonitor(Fixed(), vec_sums=sums)
        env.reset()
        info = {}
        while "episode" not in info:
            *_, info = env.step(0)
        ret = np.zeros(1, np.float32)  # VecMonitor's array, rewards of the VecEnv's dtype
        for r in rewards:
            ret += np.array([r], reward_dtype)
        assert info["episode"]["r"] == ret[0] and type(info["episode"]["r"]) is np.float32
        assert info["episode"]["l"] == len(rewards) and type(info["episode"]["l"]) is np.int32


class HangsInAFreshOne(LevelEnv):
    """Steps as LevelEnv, but an env made after ``HANG`` is set blocks in its 10th step: the
    wrap's drift check makes such a fresh env of the id and steps it (the model's own envs
    were made before)."""

    HANG = False

    def __init__(self):
        super().__init__()
        self.hangs, self.steps = HangsInAFreshOne.HANG, 0

    def step(self, action):
        self.steps += 1
        if self.hangs and self.steps == 10:
            threading.Event().wait()  # never set: a simulator that stopped answering
        return super().step(action)


def test_a_fresh_env_that_hangs_in_the_wraps_check_is_a_worker_error_naming_the_check(monkeypatch):
    """The wrap steps an env fresh from the id to see whether the live ones were changed after
    gym.make; an env hanging there hung the wrap with no word. It is watched now, as the
    caller's own collects are."""
    monkeypatch.setenv("AUTURI_WORKER_TIMEOUT", "1")
    gym.register("AuturiHangsFresh-v0", entry_point=HangsInAFreshOne, max_episode_steps=50)
    try:
        model = ppo(make_vec_env("AuturiHangsFresh-v0", n_envs=2, seed=0))
        monkeypatch.setattr(HangsInAFreshOne, "HANG", True)
        with pytest.raises(auturi.WorkerError, match=r"check of an env fresh from gym.make\('AuturiHangsFresh-v0'\).*"
                                                     r"made no progress"):
            auturi.wrap(model, config=auturi.Config.serial(2))
    finally:
        gym.registry.pop("AuturiHangsFresh-v0", None)


def test_a_setting_the_script_made_at_run_time_reaches_the_envs_workers_make(monkeypatch):
    """A registered env whose constructor reads a module setting the script set at run time
    (from its arguments, say): Auturi's workers run none of the script, so envs made there
    from the id had the import-time value, and the layout changed the rewards (2.0 in the
    caller, 1.0 in an env worker) with no sign of it. The wrap now makes one such env in a
    process like the workers, sees the difference and copies the live envs instead."""
    from tests import setting_probe_env

    monkeypatch.setitem(setting_probe_env.SETTINGS, "bonus", 1.0)
    model = ppo(make_vec_env(setting_probe_env.ID, n_envs=2, seed=0))
    auturi.wrap(model, config=auturi.Config(1, 2, 2, 1, "cpu", 2))  # env 1 in an env worker
    try:
        model.learn(2 * N_STEPS)
        assert set(model.rollout_buffer.rewards.ravel().tolist()) == {2.0}
    finally:
        model.auturi.close()


def test_a_subproc_vec_envs_envs_are_the_truth_for_a_setting_its_workers_lack(monkeypatch):
    """A SubprocVecEnv's workers ran none of this process's run-time setting: plain SB3
    trains on their envs (reward 1.0). Auturi made its envs from the id in this process (the
    serial layout: 2.0) and in its workers (1.0); the wrap now compares the live envs'
    settings with those and copies the live envs where they differ."""
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from tests import setting_probe_env

    monkeypatch.setitem(setting_probe_env.SETTINGS, "bonus", 1.0)
    env = make_vec_env(f"tests.setting_probe_env:{setting_probe_env.ID}", n_envs=2, seed=0,
                       vec_env_cls=SubprocVecEnv)
    try:
        assert env.get_attr("bonus") == [0.0, 0.0]  # what SB3 trains on
        for config in (auturi.Config.serial(2), auturi.Config(1, 2, 2, 1, "cpu", 2)):
            model = ppo(env)
            auturi.wrap(model, config=config)
            try:
                model.learn(2 * N_STEPS)
                assert set(model.rollout_buffer.rewards.ravel().tolist()) == {1.0}, config
            finally:
                model.auturi.close()
    finally:
        env.close()
