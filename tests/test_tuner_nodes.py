"""The model strategy across the nodes of a Ray cluster (issue 17, item 4): actors on other
nodes than the caller's cost a round trip per collect and share no memory with it, and each
node has its own cores. Synthetic profiles of a two-node cluster; no Ray needed."""
from __future__ import annotations

import pytest

from auturi import Config
from auturi.resources import ClusterResources
from auturi.tuner.profile import Profile, actors_per_node, cross_node_seconds, fit_overheads, predict
from auturi.tuner.space import build_space
from auturi.tuner.strategies import ModelStrategy

NODES = (4, 4)  # two nodes of 4 CPUs; the caller runs on the first


def _space(num_envs: int = 16):
    return build_space(num_envs, devices=["cpu"], cluster=ClusterResources(node_cpus=NODES))


def _nodes_used(config: Config) -> int:
    return sum(1 for a in actors_per_node(config, NODES) if a)


def _profile(**kw) -> Profile:
    base = dict(env_cpu_fraction=1.0, policy_seconds={"cpu": {b: 40e-6 + 2e-6 * b for b in (1, 2, 4, 8, 16)}},
                cores=sum(NODES), backend="ray", node_cores=NODES, num_steps=128)
    return Profile(**{**base, **kw})


def _model_best(prof: Profile, space) -> Config:
    """The model strategy's first proposal: with nothing measured, its best prediction."""
    strat = ModelStrategy(profile=prof)
    strat.prepare(space, num_steps=prof.num_steps)
    best = strat.propose([])
    assert best is not None
    assert best == max(space.configs, key=lambda c: predict(c, prof))
    return best


def test_actors_spread_over_the_nodes_caller_first_as_spread_placement_does():
    assert actors_per_node(Config.serial(8), NODES) == [1, 0]
    assert actors_per_node(Config(num_actors=2, envs_per_actor=4), NODES) == [1, 1]
    assert actors_per_node(Config(num_actors=3, envs_per_actor=4, env_parallel_degree=2), NODES) == [2, 1]
    # A node without a CPU for each of an actor's processes is passed over.
    assert actors_per_node(Config(num_actors=2, envs_per_actor=4, env_parallel_degree=4), (2, 8)) == [0, 2]


def test_a_cheap_env_with_big_rollouts_stays_on_the_callers_node():
    """(a) Atari-sized frames from a cheap env: shipping a remote actor's rollout costs more
    than the other node's cores save, so the best config is single-node."""
    prof = _profile(env_step_seconds=20e-6, obs_bytes=84 * 84 * 4)
    space = _space()
    best = _model_best(prof, space)
    assert _nodes_used(best) == 1, best
    # ... and the model still sees that the other node's cores would help without the network.
    free_network = prof.replace(cross_node_seconds=0.0, network_bytes_per_second=1e15)
    assert _nodes_used(max(space.configs, key=lambda c: predict(c, free_network))) == 2
    two = Config(num_actors=2, envs_per_actor=8, env_parallel_degree=4)
    assert cross_node_seconds(two, prof) > 8 * 128 * 84 * 84 * 4 / prof.network_bytes_per_second


def test_a_cpu_heavy_env_uses_both_nodes_when_one_nodes_cores_are_the_limit():
    """(b) 2 ms of CPU per step and small observations: one node's 4 cores cap throughput,
    the round trip is small next to a collect, so the best config uses both nodes, at about
    twice one node's cap."""
    prof = _profile(env_step_seconds=2e-3, obs_bytes=16)
    space = _space()
    best = _model_best(prof, space)
    assert _nodes_used(best) == 2, best
    one_node_best = max(predict(c, prof) for c in space.configs if _nodes_used(c) == 1)
    assert one_node_best <= NODES[0] / prof.env_step_seconds * 1.001  # one node's cores are its limit
    assert predict(best, prof) > 1.6 * one_node_best


def test_fit_overheads_refits_the_cross_node_round_trip_from_measurements():
    """The network's figures are priors: measured throughputs of single- and multi-node
    configs move them, and the refit model ranks as the measurements do."""
    truth = _profile(env_step_seconds=100e-6, obs_bytes=4096, cross_node_seconds=30e-3,
                     network_bytes_per_second=1e8)
    prior = truth.replace(cross_node_seconds=2e-3, network_bytes_per_second=1e9)
    space = _space()
    measured = [(c, predict(c, truth)) for c in space.configs[::7]]
    assert {_nodes_used(c) for c, _ in measured} == {1, 2}
    fitted = fit_overheads(prior, measured)
    truth_best = max(space.configs, key=lambda c: predict(c, truth))
    prior_best = max(space.configs, key=lambda c: predict(c, prior))
    fitted_best = max(space.configs, key=lambda c: predict(c, fitted))
    assert _nodes_used(prior_best) == 2 and _nodes_used(truth_best) == 1  # the prior alone is wrong here
    assert _nodes_used(fitted_best) == 1
    assert predict(fitted_best, truth) >= 0.95 * predict(truth_best, truth)
    for c, v in measured:
        assert predict(c, fitted) == pytest.approx(v, rel=0.15)


def test_profiles_round_trip_through_json_with_their_nodes():
    import json

    prof = _profile(env_step_seconds=1e-3, weights_bytes=1234)
    again = Profile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert again == prof and again.node_cores == NODES


class _RayExecutor:
    """What profiling reads of a ray executor: its backend, its policy, its last collect."""

    backend = "ray"
    last_num_steps = 32

    class policy:  # noqa: N801 - a stand-in object with the Policy method profiling calls
        @staticmethod
        def get_state():
            return {"w": bytes(10_000)}


def test_a_ray_executor_profiles_its_nodes_the_calls_cost_and_the_weights_it_ships(monkeypatch):
    import sys
    import types

    from auturi.tuner.profile import DEFAULT_RAY_ACTOR_COLLECT_SECONDS, collect_fields

    nodes = [{"NodeID": "b", "Alive": True, "Resources": {"CPU": 8.0}},
             {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 99.0}},
             {"NodeID": "a", "Alive": True, "Resources": {"CPU": 2.0}}]
    fake = types.SimpleNamespace(is_initialized=lambda: True, nodes=lambda: nodes,
                                 get_runtime_context=lambda: types.SimpleNamespace(get_node_id=lambda: "a"))
    monkeypatch.setitem(sys.modules, "ray", fake)
    got = collect_fields(_RayExecutor())
    assert got["node_cores"] == (2, 8)  # the caller's node first, dead nodes left out
    assert got["num_steps"] == 32 and got["actor_collect_seconds"] == DEFAULT_RAY_ACTOR_COLLECT_SECONDS
    assert got["weights_bytes"] >= 10_000
    given = collect_fields(_RayExecutor(), num_steps=1, node_cores=(4,))
    assert given["num_steps"] == 1 and given["node_cores"] == (4,) and "weights_bytes" not in given
    fake.is_initialized = lambda: False
    assert collect_fields(_RayExecutor())["node_cores"] == ()


def test_a_caller_on_a_cpu_less_head_node_pays_the_round_trip_for_every_layout():
    """``ray start --head --num-cpus=0``: no actor runs beside the caller, so no layout
    escapes the network, and the prediction stays finite."""
    prof = _profile(env_step_seconds=20e-6, obs_bytes=84 * 84 * 4, node_cores=(0, 8), cores=8)
    space = build_space(16, devices=["cpu"], cluster=ClusterResources(node_cpus=(0, 8)))
    assert all(actors_per_node(c, prof.node_cores)[0] == 0 for c in space.configs)
    assert all(cross_node_seconds(c, prof) > 0 for c in space.configs)
    assert 0 < predict(Config.serial(16), prof.replace(node_cores=(0, 0))) < float("inf")
