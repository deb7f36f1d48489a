"""The executor's central contract: every backend and config gives the serial rollout.

One suite over every backend, ``serial``, ``shm`` and ``ray`` (as SB3 tests every VecEnv; Ray
on the suite's two-node test cluster, see conftest's ``ray_cluster``): data equality bit for
bit with a batch-independent policy, across consecutive collects whose episodes end
mid-rollout and continue; plus seeding, terminal observations, reconfigure truncation and weight updates.
It runs on envs that compute with their action (``ActionDtypeEnv``), so it also holds every
path to handing each env the action as SB3's DummyVecEnv does (a numpy scalar or array of
the actions' dtype), and the serial loop to a DummyVecEnv-style reference loop.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from auturi import Config, make_executor
from auturi.envs import ActionDtypeEnv, CountingEnv, env_seed
from auturi.executor.noise import reference_noise
from tests.helpers import CONFIGS, N, ObsHashPolicy, assert_same, counting, ids, run

__all__ = ["CONFIGS", "N", "assert_same", "counting", "ids", "run"]  # other modules import them from here

BACKENDS = ["serial", "shm", "ray"]


@pytest.fixture
def backend(request):
    """The backend under test; ``ray`` runs on the suite's Ray test cluster (conftest's
    ``ray_cluster``, connected at the first ray test and skipped only when Ray is not installed)."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    return request.param


# The envs of the suite: CountingEnv, and envs whose steps depend on the action's type and dtype.
ENVS = {
    "counting": functools.partial(CountingEnv),
    "dtype-discrete": functools.partial(ActionDtypeEnv, action="discrete"),
    "dtype-box": functools.partial(ActionDtypeEnv, action="box"),
    "dtype-multidiscrete": functools.partial(ActionDtypeEnv, action="multidiscrete"),
    "dtype-multibinary": functools.partial(ActionDtypeEnv, action="multibinary"),
}
EVERY_CONFIG_ENVS = ["counting", "dtype-discrete", "dtype-box"]  # the rest: one hybrid config, below
HYBRID = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1)
# Ray runs every config on CountingEnv and the dtype envs on one layout below: inside an actor
# the same ActorHost as shm's hands each env its action, so every config x dtype env again
# would only add Ray actor start-ups. HYBRID's Ray case (and its weight update, the Ray case of
# test_weight_updates_reach_every_replica) is the first collects of test_executor_ray's
# test_num_steps_change_weight_update_and_reconfigure_across_nodes, on the same cluster with the
# same env, seed and collects (one executor for the three: two Ray start-ups of 2 actors fewer).
EVERY_CONFIG_CASES = [pytest.param(e, b, c, id=f"{e}-{b}-{ids(c)}")
                      for e in EVERY_CONFIG_ENVS for b in ("serial", "shm") for c in CONFIGS] + \
                     [pytest.param("counting", "ray", c, id=f"counting-ray-{ids(c)}") for c in CONFIGS if c != HYBRID]
HYBRID_SPACES = ["box_action", "image_obs", "dtype-multidiscrete", "dtype-multibinary"]
HYBRID_CASES = [(s, b) for b in BACKENDS for s in HYBRID_SPACES] + [(s, "ray") for s in ("dtype-discrete", "dtype-box")]
# Each space on Ray goes through one Ray actor with an env worker inside it: what Ray adds to
# shm for a space (the actor's columns, their dtypes kept, copied into the caller's rollout at
# the actor's env offset) does not depend on the number of actors, which the every-config
# cases vary (1, 2 and 4 on CountingEnv), nor on where the policy runs, which shm's HYBRID case
# covers for every space. Two actors took ~2 s more per space (a busy 2-core box, 2026-11-26).
RAY_SPACES_CONFIG = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2)


@pytest.fixture(scope="module")
def serial_refs():
    """The serial rollout of each env of ENVS, made once."""
    cache = {}

    def get(env: str = "counting"):
        if env not in cache:
            cache[env] = run("serial", Config.serial(N), ENVS[env])
        return cache[env]

    return get


@pytest.fixture(scope="module")
def serial_reference(serial_refs):
    return serial_refs("counting")


@pytest.mark.parametrize("env", list(ENVS))
def test_serial_matches_a_dummy_vec_env_loop(env, serial_refs):
    """The oracle: a hand-written loop that steps the envs as SB3's DummyVecEnv does (env i
    gets ``actions[i]`` of the policy's action array, auto-reset at an episode's end)."""
    serial_reference = serial_refs(env)
    seed = 3
    envs = [ENVS[env]() for _ in range(N)]
    pol = ObsHashPolicy(envs[0].action_space)
    obs = np.stack([e.reset(seed=env_seed(seed, i, 0))[0] for i, e in enumerate(envs)])
    starts = np.ones(N, bool)
    done_steps = 0
    for r in serial_reference:
        T = r.num_steps
        noise = np.stack([reference_noise(seed, i, done_steps, T, 1) for i in range(N)], axis=1)
        for t in range(T):
            np.testing.assert_array_equal(r.observations[t], obs)
            np.testing.assert_array_equal(r.episode_starts[t], starts)
            actions, extras = pol.act(obs, noise[t])
            np.testing.assert_array_equal(r.actions[t], actions)
            np.testing.assert_array_equal(r.extras["values"][t], extras["values"])
            new_obs = []
            for i, e in enumerate(envs):
                o, rew, te, tr, info = e.step(actions[i])  # DummyVecEnv.step_wait: self.actions[env_idx]
                assert r.rewards[t, i] == rew and r.terminated[t, i] == te and r.truncated[t, i] == tr
                if te or tr:
                    np.testing.assert_array_equal(r.final_observations[(t, i)], o)
                    assert r.final_infos[(t, i)] == info
                    o, _ = e.reset()
                new_obs.append(o)
                starts[i] = te or tr
            obs = np.stack(new_obs)
        np.testing.assert_array_equal(r.last_observations, obs)
        np.testing.assert_array_equal(r.last_episode_starts, starts)
        done_steps += T
    # episodes really did end mid-rollout and continue across collects
    assert sum(len(r.final_observations) for r in serial_reference) >= 4
    if env.startswith("dtype"):  # ActionDtypeEnv's flag: every step's action was a numpy value
        stepped = ~np.concatenate([r.episode_starts for r in serial_reference])
        assert stepped.any() and (np.concatenate([r.observations for r in serial_reference])[stepped][:, 3] == 1).all()
    assert not serial_reference[1].episode_starts[0].all()


@pytest.mark.parametrize("env,backend,config", EVERY_CONFIG_CASES, indirect=["backend"])
def test_every_config_gives_the_serial_rollout(env, backend, config, serial_refs):
    assert_same(run(backend, config, ENVS[env]), serial_refs(env))


# Layouts whose actor overlaps env stepping with inference (ActorPlan.overlap: a policy on a
# device, env workers, more than one forward pass a row): batches spread over the env shares,
# env workers queueing several batches' steps. An emulated CUDA device makes the plan overlap
# (ObsHashPolicy runs anywhere); Ray would ask its cluster for a GPU, so serial and shm only.
OVERLAPPED_CONFIGS = [
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2,
           policy_device="cuda"),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=1, policy_batch_size=1,
           policy_device="cuda"),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=4, policies_per_actor=2, policy_batch_size=1,
           policy_device="cuda"),
    Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1,
           policy_device="cuda"),
]


@pytest.mark.parametrize("config", OVERLAPPED_CONFIGS, ids=ids)
@pytest.mark.parametrize("env,backend", [(e, b) for e in EVERY_CONFIG_ENVS for b in ("serial", "shm")],
                         indirect=["backend"])
def test_overlapped_configs_give_the_serial_rollout(env, backend, config, serial_refs):
    from auturi.executor.layout import plan_layout
    from auturi.testing.emulated_gpu import emulated_gpu

    assert all(ap.overlap for ap in plan_layout(config, cores=[0, 1]).actors)
    with emulated_gpu():
        got = run(backend, config, ENVS[env])
    assert_same(got, serial_refs(env))


@pytest.mark.parametrize("space,backend", HYBRID_CASES, indirect=["backend"])
def test_box_actions_and_image_observations(backend, space, serial_refs):
    if space == "box_action":
        env_fn = counting(action="box")
    elif space == "image_obs":
        env_fn = counting(obs_shape=(3, 8, 8), obs_dtype=np.uint8)
    else:
        env_fn = ENVS[space]
    ref = run("serial", Config.serial(N), env_fn)
    got = run(backend, RAY_SPACES_CONFIG if backend == "ray" else HYBRID, env_fn)
    assert_same(got, ref)
    assert got[0].observations.dtype == (np.uint8 if space == "image_obs" else np.float32)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_changing_num_steps_between_collects(backend, serial_reference):
    cfg = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=2)
    ref = run("serial", Config.serial(N), steps=(3, 9, 4))
    assert_same(run(backend, cfg, steps=(3, 9, 4)), ref)


def test_a_layout_that_does_not_fit_beside_the_last_starts_on_a_new_control_block(monkeypatch):
    """Many processes to many others (one env a worker to one actor an env): the old workers
    do not leave room for the new ones on the control block, so all end and the new layout
    starts on a fresh block (its slots all free), with the serial rollout's data."""
    from auturi.executor.shm import executor as shm_executor

    monkeypatch.setattr(shm_executor, "MIN_SLOTS", 16)  # 64 by default: the same at 32-35 processes
    steps = (3, 4, 5, 3)
    env_fn = counting()
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=8, config=Config.serial(8),
                       backend="serial", seed=3) as ex:
        want = [ex.collect(s) for s in steps]
    # serial (a block of 16 slots), 11 processes (fit), 8 (do not fit beside the 11), 14
    layouts = [Config.serial(8), Config(1, 8, 8, 4, "cpu", 2), Config(8, 1, 1, 1, "cpu", 1),
               Config(2, 4, 4, 4, "cpu", 1)]
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=8, config=layouts[0],
                       backend="shm", seed=3) as ex:
        got = [ex.collect(steps[0])]
        for cfg, s in zip(layouts[1:], steps[1:]):
            ex.reconfigure(cfg)
            got.append(ex.collect(s))
    assert_same(got, want)


def test_num_envs_comes_from_the_config_when_left_out():
    cfg = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=1)
    policy = ObsHashPolicy(CountingEnv().action_space)
    with make_executor(CountingEnv, policy, config=cfg, backend="serial", seed=1) as ex:
        assert ex.num_envs == 4 and ex.collect(3).observations.shape[:2] == (3, 4)
    with pytest.raises(ValueError, match="pass num_envs=N, a config"):
        make_executor(CountingEnv, policy, backend="serial")
    with pytest.raises(ValueError, match="num_envs=8 but 4 env factories"):
        make_executor([CountingEnv] * 4, policy, config=Config.serial(8), backend="serial")


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_seeding(backend):
    """The backend's run with seed 1 is the serial run with seed 1, bit for bit (so the same
    seed gives the same data), and differs from the serial runs with seed 2 and with the
    default seed (0): the seed reaches every env wherever it steps, not a default or a fixed
    one. One run of the backend: more runs of it would add only their start-ups (Ray: ~5 s)."""
    cfg = Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2)
    got = run(backend, cfg, seed=1, steps=(6,))
    assert_same(got, run("serial", Config.serial(N), seed=1, steps=(6,)))
    for other in (2, 0):
        ref = run("serial", Config.serial(N), seed=other, steps=(6,))
        assert not np.array_equal(got[0].observations, ref[0].observations)


@pytest.mark.parametrize("backend", ["serial", "shm"], indirect=True)
def test_weight_updates_reach_every_replica(backend, serial_reference):
    """HYBRID's collects give the serial rollout; then a weight update reaches every replica of
    every actor. (Ray's case, on the executor of its HYBRID every-config case too, with the
    same checks: test_executor_ray's test_num_steps_change_weight_update_and_reconfigure_across_nodes.)"""
    env_fn = counting()
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, config=HYBRID, backend=backend,
                       seed=3) as ex:
        before = [ex.collect(s) for s in (7, 7, 5)]
        ex.set_policy_state({"w": np.array(1e6)})
        after = ex.collect(4)
    assert_same(before, serial_reference)
    # every env (so every replica of every actor) saw the new weight from the first step on
    assert all((r.extras["values"] < 1e5).all() for r in before)
    assert (after.extras["values"] > 1e5).all()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_reconfigure_goes_on_with_or_restarts_every_episode(backend):
    env_fn = counting(max_len=50)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, backend=backend) as ex:
        first = ex.collect(3)
        assert not first.last_episode_starts.any()  # episodes are running
        seconds = ex.reconfigure(Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2))
        assert seconds >= 0.0 and ex.last_reconfigure_seconds == seconds
        second = ex.collect(3)
        assert ex.reconfigure(ex.config) == 0.0  # same config: nothing to do
    # each env either goes on with its episode (its first row is its last observation, no
    # start) or was recreated and starts a new one: never a silent jump
    went_on = ~second.episode_starts[0]
    np.testing.assert_array_equal(second.observations[0][went_on], first.last_observations[went_on])
    if backend == "ray":  # the envs moved to new Ray actors: recreated, new episodes
        assert second.episode_starts[0].all()
        assert not np.array_equal(second.observations[0], first.last_observations)
    else:  # serial never moves an env; shm moves an env that pickles (CountingEnv does) live
        assert went_on.all()


def test_torch_mlp_policy_within_rounding():
    """A real network: identical discrete actions and data, values within float rounding."""
    torch = pytest.importorskip("torch")
    from auturi import TorchPolicy
    from auturi.nets import MLPActorCritic

    torch.manual_seed(0)
    env_fn = counting()
    policy = TorchPolicy(functools.partial(MLPActorCritic, 4, 3), env_fn().action_space)
    ref = run("serial", Config.serial(N), env_fn, policy=policy)
    cfg = Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1)
    assert_same_within_rounding(run("shm", cfg, env_fn, policy=policy), ref, rtol=1e-5, atol=1e-6)


def assert_same_within_rounding(got, ref, rtol, atol):
    """The contract for neural networks: identical data and discrete actions; values and
    log-probs within float rounding (they round differently for different batch shapes)."""
    for ra, rb in zip(ref, got):
        for k in ("observations", "actions", "rewards", "terminated", "truncated", "episode_starts"):
            np.testing.assert_array_equal(getattr(ra, k), getattr(rb, k), err_msg=k)
        for k in ("values", "log_probs"):
            np.testing.assert_allclose(ra.extras[k], rb.extras[k], rtol=rtol, atol=atol)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda_available(), reason="requires a CUDA GPU")
@pytest.mark.parametrize("config", [
    Config(num_actors=1, envs_per_actor=4, policy_device="cuda"),
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1,
           policy_device="cuda"),
    Config(num_actors=2, envs_per_actor=2, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1,
           policy_device="cuda"),
], ids=ids)
def test_cuda_replicas_match_the_cpu_serial_rollout(config):
    """Replicas on the GPU: same data as the CPU serial run, values within float rounding."""
    import torch

    from auturi import TorchPolicy
    from auturi.nets import MLPActorCritic

    torch.manual_seed(0)
    env_fn = counting()
    policy = TorchPolicy(functools.partial(MLPActorCritic, 4, 3), env_fn().action_space)
    ref = run("serial", Config.serial(N), env_fn, policy=policy)
    assert_same_within_rounding(run("shm", config, env_fn, policy=policy), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", [
    Config(num_actors=1, envs_per_actor=4, env_parallel_degree=2, policies_per_actor=2, policy_batch_size=1),
    Config(num_actors=2, envs_per_actor=2),
], ids=ids)
def test_envpool_id_as_the_env_side(config):
    """An EnvPool id runs EnvPool's threaded pool inside each env host, same data as serial."""
    pytest.importorskip("envpool")
    from auturi.envs.envpool import EnvPoolSource

    def go(backend, cfg):
        policy = ObsHashPolicy(EnvPoolSource("CartPole-v1").action_space)
        with make_executor("envpool:CartPole-v1", policy, num_envs=N, config=cfg, backend=backend, seed=5) as ex:
            return [ex.collect(s) for s in (30, 20)]

    ref = go("serial", Config.serial(N))
    assert sum(len(r.final_observations) for r in ref) > 0  # episodes ended and were reset
    assert_same(go("shm", config), ref)


# ------------------------------------------------------------- calls on the live envs
def curriculum(backend, layouts, refuse=None):
    """Collects with calls on the live envs between them, as a curriculum makes them, under
    ``layouts`` (the first, then a reconfigure to each of the others): a level set on envs 1
    and 3 before their first reset (they then move before it), a collect, reads, a level set
    on env 0 (``set_attr``) and on envs 3 and 2 (negative indices), a reconfigure (the changed
    envs move mid-episode), a collect, reads (one index repeated). ``refuse``: a layout tried
    before the last collect, which must be refused (the executor goes on as it was).
    Returns the rollouts and every call's answer."""
    from auturi.errors import LostEnvChangesError
    from tests.env_call_envs import LevelEnv

    env_fn = functools.partial(LevelEnv)
    with make_executor(env_fn, ObsHashPolicy(env_fn().action_space), num_envs=N, config=layouts[0], backend=backend,
                       seed=3) as ex:
        answers = [ex.env_method("set_level", 10, indices=[1, 3])]
        ex.reconfigure(layouts[1])
        got = [ex.collect(7)]
        answers.append(ex.get_attr("steps"))
        ex.set_attr("level", 20, indices=0)
        answers.append(ex.env_method("set_level", 30, indices=[-1, 2]))
        ex.reconfigure(layouts[2])
        if refuse is not None:
            with pytest.raises(LostEnvChangesError, match=r"would recreate env\(s\) \[0, 1, 2, 3\].*lose those "
                                                          r"changes.*restarts the Ray actors") as info:
                ex.reconfigure(refuse)
            assert info.value.intact and ex.config == layouts[2]
        got.append(ex.collect(6))
        answers += [ex.get_attr("level"), ex.get_attr("steps", indices=[3, 0, 3])]
    return got, answers


@pytest.fixture(scope="module")
def curriculum_reference():
    got, answers = curriculum("serial", [Config.serial(N)] * 3)
    assert answers == [[10, 10], [7] * 4, [30, 30], [20, 10, 30, 30], [13, 13, 13]]
    # the levels reached the data: CountingEnv's own rewards are below 2
    first, second = got[0].rewards, got[1].rewards
    assert (first[:, [1, 3]] >= 10).all() and (first[:, [0, 2]] < 10).all()
    assert (second[:, 0] >= 20).all() and (second[:, 1] < 20).all() and (second[:, 2:] >= 30).all()
    return got, answers


ENV_CALL_CASES = [
    # the changed envs: from the caller to the caller and an env worker before their first
    # reset, then into actor processes, env workers and replicas' layout
    pytest.param("shm", (Config.serial(N), Config(1, 4, 2), HYBRID), id="shm-serial-D2-hybrid"),
    # pickled (EXPORT) from actor processes before their first reset, then all back to the caller
    pytest.param("shm", (Config(4, 1), Config(1, 4, 4), Config.serial(N)), id="shm-A4-D4-serial"),
    pytest.param("serial", (HYBRID, Config(4, 1), Config.serial(N)), id="serial-hybrid-A4-serial"),
]


@pytest.mark.parametrize("backend,layouts", ENV_CALL_CASES, indirect=["backend"])
def test_env_calls_between_collects_give_the_serial_rollout_and_answers(backend, layouts, curriculum_reference):
    got, answers = curriculum(backend, layouts)
    assert answers == curriculum_reference[1]
    assert_same(got, curriculum_reference[0])


@pytest.mark.parametrize("backend", ["ray"], indirect=True)
def test_env_calls_on_ray_actors_give_the_serial_rollout_and_a_restart_that_would_lose_them_is_refused(
        backend, curriculum_reference):
    """Calls reach the envs inside each Ray actor's executor; a batch change keeps the Ray
    actors (and their envs); a new actor count would restart them with new envs: refused."""
    layouts = (Config(2, 2, 2, 1, "cpu", 1), Config(2, 2, 2, 1, "cpu", 2), Config(2, 2, 2, 1, "cpu", 1))
    got, answers = curriculum(backend, layouts, refuse=Config(1, 4))
    assert answers == curriculum_reference[1]
    assert_same(got, curriculum_reference[0])
