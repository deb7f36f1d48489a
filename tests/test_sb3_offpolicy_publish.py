"""The off-policy SB3 face's per-collect publish (``auturi.adapters.sb3``): the caller's
replica acts with the model's own policy (no copy, always the current weights), a publish is
skipped when nothing in it changed, and the tuner's log records are rebuilt only on change.
The buffer-level equality with SB3 under serial and two-actor layouts is in
``tests/test_sb3_offpolicy.py``."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import torch
from stable_baselines3 import TD3
from stable_baselines3.common.env_util import make_vec_env

from auturi import Config
from auturi.adapters.sb3 import unwrap_sb3, wrap_sb3
from auturi.adapters.sb3.handle import SB3Handle


def td3(learning_starts: int = 0, n_envs: int = 2):
    env = make_vec_env("Pendulum-v1", n_envs=n_envs, seed=5)
    return TD3("MlpPolicy", env, learning_starts=learning_starts, train_freq=1, buffer_size=500, batch_size=8,
               policy_kwargs={"net_arch": [8]}, seed=5, device="cpu")


def count_publishes(model) -> list:
    calls: list = []
    ex = model.auturi.executor
    own = ex.set_policy_state
    ex.set_policy_state = lambda state: (calls.append(state), own(state))[1]
    return calls


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_the_callers_replica_acts_with_the_models_current_weights(backend):
    """An in-place update of the model's actor between collects (as training makes) reaches
    the caller's replica with nothing published: its actions are the model's predict."""
    model = wrap_sb3(td3(), config=Config.serial(2), backend=backend, tune=False)
    try:
        adapter = model.auturi.adapter
        ex = model.auturi.executor
        ex.collect(1)
        with torch.no_grad():
            for p in model.policy.actor.parameters():
                p.mul_(-2.0)  # no publish after this
        rollout = ex.collect(1)
        expected, _ = model.predict(rollout.observations[0], deterministic=True)
        np.testing.assert_allclose(rollout.actions[0], expected, rtol=1e-6, atol=1e-6)
        assert adapter.shared and adapter.net is model.policy
        replica = pickle.loads(pickle.dumps(adapter))  # what another process gets: its own network
        assert not replica.shared and replica.net is not model.policy
    finally:
        unwrap_sb3(model)


def test_a_replaced_policy_is_followed():
    """``model.policy = other``: the caller's replica acts with the new one from the next collect."""
    import copy

    model = wrap_sb3(td3(learning_starts=0), config=Config.serial(2), backend="serial", tune=False)
    try:
        model.learn(4)
        other = copy.deepcopy(model.policy)
        with torch.no_grad():
            for p in other.actor.parameters():
                p.mul_(-3.0)
        model.policy, model.actor = other, other.actor
        rollout = model.auturi.collect(model, 1, {"auturi.warmup": np.array([0.0])})
        expected, _ = model.predict(rollout.observations[0], deterministic=True)
        np.testing.assert_allclose(rollout.actions[0], expected, rtol=1e-6, atol=1e-6)
    finally:
        unwrap_sb3(model)


def test_unsharing_keeps_the_models_weights():
    """Moving the caller's replica to another device than the model's gives it its own
    network, holding the model's weights at that moment (CUDA itself: tests that skip here)."""
    model = wrap_sb3(td3(), config=Config.serial(2), backend="serial", tune=False)
    try:
        adapter = model.auturi.adapter
        adapter.to("cpu")  # the model's own device: still shared
        assert adapter.shared
        adapter._unshare()
        assert not adapter.shared and adapter.net is not model.policy
        for (k, mine), theirs in zip(adapter.net.state_dict().items(), model.policy.state_dict().values()):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=k)
    finally:
        unwrap_sb3(model)


def test_a_publish_is_skipped_when_nothing_changed():
    """Before learning_starts neither weights nor settings move: one publish for the run.
    An in-place change of the weights, or of a setting, publishes again."""
    model = wrap_sb3(td3(learning_starts=10_000), config=Config.serial(2), backend="serial", tune=False)
    try:
        calls = count_publishes(model)
        model.learn(40)
        assert len(calls) == 1
        h = model.auturi
        settings = {"auturi.warmup": np.array([1.0])}
        h.collect(model, 1, settings)
        assert len(calls) == 2  # the settings differ from learn's (epsilon key): published
        h.collect(model, 1, settings)
        assert len(calls) == 2
        with torch.no_grad():
            next(model.policy.actor.parameters()).add_(1.0)
        h.collect(model, 1, settings)
        assert len(calls) == 3
        h.collect(model, 1, {"auturi.warmup": np.array([0.0])})
        assert len(calls) == 4
    finally:
        unwrap_sb3(model)


def test_published_weights_are_read_from_the_models_tensors_and_follow_a_new_storage():
    """The state is read from views found once; an assignment of new storage is seen."""
    model = wrap_sb3(td3(), config=Config.serial(2), backend="serial", tune=False)
    try:
        h = model.auturi
        first = h.state(model)
        weight = model.policy.actor.mu[0].weight
        assert np.shares_memory(first["actor.mu.0.weight"], weight.detach().numpy())
        weight.data = torch.full_like(weight, 3.0)  # new storage, as set_parameters does for some variables
        np.testing.assert_array_equal(h.state(model)["actor.mu.0.weight"], np.full(weight.shape, 3.0, np.float32))
    finally:
        unwrap_sb3(model)


def test_tuner_records_are_rebuilt_only_when_the_tuner_changed():
    """``result()`` builds a whole report: once per change of phase, trials or choice."""
    trial = SimpleNamespace(estimate=100.0, config="c", samples=[100.0], status="ok")
    res = SimpleNamespace(choice="c", reason="r", speedup=lambda versus: 1.5)
    tuner = SimpleNamespace(phase="locked", history=[trial], locked=trial, best=lambda: trial, results=0)

    def result():
        tuner.results += 1
        return res

    tuner.result = result
    h = SB3Handle.__new__(SB3Handle)
    h.tuner, h._locked_logged, h._tuner_log = tuner, False, ((), {})
    model = SimpleNamespace(verbose=0)
    first = h._tuner_records(model)
    assert h._tuner_records(model) == first and tuner.results == 1
    assert first["auturi/speedup_vs_serial"] == (1.5, None)
    trial.samples.append(140.0)  # the locked trial re-measured
    trial.estimate = 120.0
    assert h._tuner_records(model)["auturi/best_steps_per_second"] == (120.0, None) and tuner.results == 2


def test_cached_tuner_records_equal_fresh_ones_through_a_tuned_run():
    """Through a real online search (phases, trials, a lock-in), what the log gets each
    collect equals what rebuilding the records from the tuner gives."""
    from stable_baselines3 import DQN

    env = make_vec_env("CartPole-v1", n_envs=4, seed=2)
    model = DQN("MlpPolicy", env, learning_starts=0, train_freq=1, buffer_size=500, batch_size=8, seed=2,
                policy_kwargs={"net_arch": [8]}, device="cpu")
    # min_sample_seconds=0: a sample per collect, so trials end whatever this machine's speed (with
    # the 50 ms default a fast machine's 100 us collects never finished a trial in this run)
    wrap_sb3(model, backend="serial", budget_trials=3,
             tuner_options={"cache": False, "min_samples": 2, "max_samples": 2, "min_sample_seconds": 0})
    h = model.auturi
    cached = h._tuner_records
    seen: list = []

    def check(m):
        got = cached(m)
        kept, h._tuner_log = h._tuner_log, ((), {})
        fresh = cached(m)
        h._tuner_log = kept
        assert got == fresh
        seen.append((got["auturi/tuner_phase"][0], got["auturi/tuner_trials"][0]))
        return got

    h._tuner_records = check
    try:
        model.learn(1200)
    finally:
        unwrap_sb3(model)
    assert len(set(seen)) >= 2, seen  # the records changed along the run
