"""Both faces on a two-node Ray cluster (Ray's own cluster utilities: conftest's ``ray_cluster``):
``auturi.wrap(config)`` for RLlib and ``auturi.wrap(model)`` for SB3 with ``backend="ray"``.

RLlib: a config wrapped while connected to a multi-node cluster defaults to the ray backend,
its actors land on both nodes and its episodes equal the serial layout's; the per-runner
resources of the config place the actors (a custom resource only one node has pins them
there); a layout no node set can hold fails at ``build_algo()`` at once, named; a dead actor
fails ``train()``/``sample()`` with a WorkerError naming it (the chosen fault behaviour); a PPO
iteration trains and its result says where each actor ran. SB3: ``learn`` on the ray backend
fills the rollout buffer the serial layout does, and the status page lists the actors.
Every test checks that the Ray actors it started ended and left no shared memory.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.rllib")

import auturi  # noqa: E402
from auturi import Config, ConfigError, WorkerError  # noqa: E402
from tests.test_executor_ray import _alive, _segments_of  # noqa: E402

SEEN: set[int] = set()  # pids of the Ray actors the faces started
DEADLINE = 30.0


@pytest.fixture(scope="module", autouse=True)
def two_nodes(ray_cluster):
    """The suite's two-node test cluster (conftest's ``ray_cluster``), connected for this module."""
    return ray_cluster


@pytest.fixture(autouse=True)
def actors_leave_nothing():
    yield
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        left, segs = [p for p in SEEN if _alive(p)], _segments_of(SEEN)
        if not left and not segs:
            break
        time.sleep(0.1)
    assert not left, f"Ray actors still running: {left}"
    assert not segs, f"segments of Ray actors left in /dev/shm: {segs}"


def labels(places) -> list[str]:
    """Which test node each actor of ``places`` runs on; remembers the actors' pids."""
    SEEN.update(p["pid"] for p in places)
    label = {n["NodeID"]: next(k for k in ("node_a", "node_b") if k in n["Resources"])
             for n in ray.nodes() if n["Alive"]}
    return [label[p["node"]] for p in places]


def ppo(num_env_runners=2, per=2, batch=64, **resources):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=per, **resources)
            .training(train_batch_size_per_learner=batch, minibatch_size=batch, num_epochs=1).debugging(seed=5))


def episodes(runner, calls=2):
    out = []
    for _ in range(calls):
        for ep in runner.sample():
            out.append((ep.t_started, len(ep), bool(ep.is_terminated), np.asarray(ep.get_observations()),
                        np.asarray(ep.get_actions()), np.asarray(ep.get_rewards()),
                        np.asarray(ep.get_extra_model_outputs("action_logp"))))
    return out


# ------------------------------------------------------------------------------ RLlib
def test_rllib_defaults_to_ray_on_a_cluster_spreads_actors_equals_serial_and_trains():
    """num_env_runners=2 on a two-node cluster: backend left out is ray, RLlib's layout (one
    actor per EnvRunner) lands one actor on each node, and two sample() calls give the
    episodes of the serial layout (float outputs within rounding). Then, on the same actors
    (one start-up of two Ray actors fewer than two tests), one PPO iteration (its result says
    where the actors ran), and an actor killed: the next train() raises WorkerError naming it
    and its node; nothing is restarted (the chosen fault behaviour) and nothing is left
    behind."""
    from auturi.adapters.rllib import AuturiEnvRunner

    algo = auturi.wrap(ppo(), tune=False).build_algo()
    serial = None
    try:
        spread = algo.env_runner
        h = spread.auturi
        assert h.executor.backend == "ray" and h.config == Config(num_actors=2, envs_per_actor=2,
                                                                  policy_batch_size=2)
        assert sorted(labels(h.actor_places)) == ["node_a", "node_b"]
        serial = AuturiEnvRunner(config=auturi.wrap(ppo(), config=Config.serial(4), backend="serial"))
        serial.module.load_state_dict(spread.module.state_dict())
        got, want = episodes(spread), episodes(serial)
        info = h.info()
        result = algo.train()
        rep = result["env_runners"]["auturi"]
        victim = h.executor._actors[1]
        ray.kill(victim.handle, no_restart=True)
        with pytest.raises(WorkerError, match=r"ray actor 1 \(envs 2-3\) on node .* died"):
            algo.train()
    finally:
        if serial is not None:
            serial.stop()
        algo.stop()
    assert len(got) == len(want) > 4 and any(e[2] for e in want)
    for a, b in zip(got, want):
        assert a[:3] == b[:3]
        for x, y in zip(a[3:6], b[3:6]):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(a[6], b[6], rtol=1e-5, atol=1e-5)
    assert info["backend"] == "ray" and info["nodes"] == 2 and len(info["actors"]) == 2
    assert rep["backend"] == "ray" and rep["nodes"] == 2, rep


def test_rllib_custom_resources_per_env_runner_place_the_actors():
    """custom_resources_per_env_runner={"node_b": 0.5}: only node_b has it, so both actors run
    there; num_cpus_per_env_runner=3 raises each actor's bundle above its one process."""
    from auturi.adapters.rllib import AuturiEnvRunner

    runner = AuturiEnvRunner(config=auturi.wrap(
        ppo(custom_resources_per_env_runner={"node_b": 0.5}, num_cpus_per_env_runner=2), backend="ray", tune=False))
    try:
        assert labels(runner.auturi.actor_places) == ["node_b", "node_b"]
        assert len(runner.sample()) >= 2
    finally:
        runner.stop()


def test_rllib_a_layout_the_cluster_cannot_place_fails_at_once_naming_it():
    """Each actor asks for all of node_b: two cannot be placed. Without the check Ray would
    wait for resources that never come (start_timeout, 120 s)."""
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"cannot place .*node_b.*hold 1.*run fewer actors"):
        auturi.wrap(ppo(custom_resources_per_env_runner={"node_b": 1}), backend="ray", tune=False).build_algo()
    assert time.monotonic() - t0 < 60  # far below the placement timeout, on a busy machine too


# ------------------------------------------------------------------------------ SB3
def test_sb3_learn_on_the_cluster_equals_serial_and_the_page_lists_the_actors():
    """PPO on CartPole, two actors over the cluster (address given), against the serial
    layout: the same rollout buffers; the status snapshot lists both actors."""
    torch = pytest.importorskip("torch")
    from stable_baselines3 import PPO

    from tests.test_sb3_wrap import assert_same_buffer, cartpole, learn_snapshots

    torch.set_num_threads(1)
    out = []
    for kw in ({"backend": "serial", "config": Config.serial(4)},
               {"backend": "ray", "config": Config(num_actors=2, envs_per_actor=2),
                "address": ray.get_runtime_context().gcs_address, "status_port": 0}):
        model = PPO("MlpPolicy", cartpole(4, max_episode_steps=12), n_steps=16, seed=11, device="cpu",
                    n_epochs=1)
        auturi.wrap(model, tune=False, **kw)
        try:
            out.append(learn_snapshots(model, 16 * 4 * 2))
            if kw["backend"] == "ray":
                places = model.auturi.actor_places
                assert sorted(labels(places)) == ["node_a", "node_b"]
                assert model.auturi.snapshot.status()["actors"] == places
        finally:
            auturi.unwrap(model)
    assert out[0][0]["episode_starts"][1:].any()
    assert_same_buffer(out[0], out[1], exact_floats=False)


def test_faces_refuse_an_address_without_the_ray_backend():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    with pytest.raises(ValueError, match="needs backend='ray'"):
        auturi.wrap(PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), n_steps=8), address="auto")
    with pytest.raises(ValueError, match="needs backend='ray'"):
        auturi.wrap(ppo(), backend="shm", address="auto")


# ------------------------------------------------------------------------------ bench
def test_the_scaling_study_runs_on_the_cluster():
    """bench/ray_scaling.py on this cluster (the process is connected already), two actors
    only: both sides sample every env, and Auturi's actors spread over both nodes."""
    from bench import ray_scaling

    out = ray_scaling.run("cartpole", (2,), num_envs=4, steps=8, repeats=1, address=None)
    row = out["rows"][0]
    assert row["actors"] == 2 and row["envs_per_actor"] == 2
    assert row["auturi"]["steps_per_s"] > 0 and row["rllib"]["steps_per_s"] > 0
    assert row["auturi"]["nodes"] == 2
    assert ray.is_initialized()  # the module's connection is left as it was

