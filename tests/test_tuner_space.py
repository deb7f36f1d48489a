"""The search space: exactly the valid configs, pruned points with their reasons, sizes."""
from __future__ import annotations

import itertools

import pytest

from auturi import Config
from auturi.tuner import space as space_mod
from auturi.tuner.space import MAX_PROCESSES_PER_CORE, build_space, divisors


def brute_force(n: int, cores: int) -> set[Config]:
    """Every knob combination that makes a valid Config and breaks no pruning rule."""
    out = set()
    for a, d, p, b in itertools.product(range(1, n + 1), repeat=4):
        if n % a:
            continue
        try:
            c = Config(num_actors=a, envs_per_actor=n // a, env_parallel_degree=d, policies_per_actor=p,
                       policy_batch_size=b)
        except ValueError:
            continue
        e = n // a
        if e % p or e % b:  # the space uses divisors for replicas and batch sizes
            continue
        if c.num_processes <= MAX_PROCESSES_PER_CORE * cores and p * b <= e:
            out.add(c)
    return out


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(16) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("n,cores", [(4, 2), (8, 2), (12, 4), (16, 8)])
def test_space_is_exactly_the_valid_unpruned_configs(n, cores):
    s = build_space(n, cores=cores, devices=["cpu"])
    assert set(s.configs) == brute_force(n, cores)
    assert len(s.configs) == len(set(s.configs))  # no duplicates
    for c in s.configs:
        assert c.num_envs == n
        assert c.envs_per_actor % c.env_parallel_degree == 0
        assert c.envs_per_actor % c.policy_batch_size == 0
        assert c.policies_per_actor * c.policy_batch_size <= c.envs_per_actor
    assert Config.serial(n) in s
    # every enumerated point is either kept or pruned with a reason
    total = sum(len(divisors(n // a)) ** 3 for a in divisors(n))
    assert len(s.configs) + len(s.pruned) == total
    assert all(isinstance(why, str) and why for _, why in s.pruned)


def test_pruned_points_keep_their_reason_with_the_numbers():
    s = build_space(16, cores=2, devices=["cpu"])
    c = Config(envs_per_actor=16, env_parallel_degree=16)  # 16 env workers on 2 cores
    assert c not in s
    assert c.num_processes > 4 * 2
    assert s.reason_pruned(c) == f"more processes ({c.num_processes}) than 4x cores (2)"
    c2 = Config(envs_per_actor=16, policies_per_actor=4, policy_batch_size=8)
    assert "policies_per_actor*policy_batch_size (32) > envs_per_actor (16)" in s.reason_pruned(c2)
    assert s.reason_pruned(Config.serial(16)) is None
    # more cores: the same point is kept
    assert c in build_space(16, cores=4, devices=["cpu"])


def test_cuda_points_are_pruned_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setattr(space_mod, "_cuda_device_count", lambda: 0)
    s = build_space(8, cores=4, devices=["cpu", "cuda"])
    assert all(c.policy_device == "cpu" for c in s.configs)
    cuda = [(c, why) for c, why in s.pruned if c.policy_device == "cuda"]
    assert cuda and all(why.startswith("cuda unavailable") for _, why in cuda)
    assert space_mod.available_devices() == ["cpu"]


def test_cuda_points_are_kept_when_a_gpu_exists(monkeypatch):
    monkeypatch.setattr(space_mod, "_cuda_device_count", lambda: 1)
    s = build_space(8, cores=4, devices=["cpu", "cuda", "cuda:1"])
    assert {c.policy_device for c in s.configs} == {"cpu", "cuda"}
    assert all("does not exist" in why for c, why in s.pruned if c.policy_device == "cuda:1")
    assert len([c for c in s.configs if c.policy_device == "cuda"]) == len([c for c in s.configs
                                                                            if c.policy_device == "cpu"])


def test_sizes_and_summary_report_counts_by_reason():
    s = build_space(16, cores=2, devices=["cpu"])
    sizes = s.sizes()
    assert sizes["configs"] == len(s.configs) and sizes["pruned"] == len(s.pruned)
    assert sum(sizes["pruned_by_reason"].values()) == len(s.pruned)
    assert "more processes than 4x cores" in sizes["pruned_by_reason"]
    text = s.summary()
    assert text.startswith(f"{len(s.configs)} configs for 16 envs on 2 cores (cpu); {len(s.pruned)} pruned")


def test_total_is_fixed_unless_a_range_is_asked_for():
    assert build_space(8, cores=8, devices=["cpu"]).totals == (8,)
    s = build_space(8, cores=8, devices=["cpu"], num_envs_options=[4, 16])
    assert s.totals == (4, 8, 16)
    assert {c.num_envs for c in s.configs} == {4, 8, 16}
    with pytest.raises(ValueError, match=">= 1"):
        build_space(8, num_envs_options=[0])


def test_neighbours_are_one_step_away_and_in_the_space():
    s = build_space(16, cores=8, devices=["cpu"])
    c = Config(envs_per_actor=16, env_parallel_degree=4, policy_batch_size=8)
    near = s.neighbours(c)
    assert c not in near and all(n in s for n in near)
    assert Config(envs_per_actor=16, env_parallel_degree=2, policy_batch_size=8) in near
    assert Config(envs_per_actor=16, env_parallel_degree=8, policy_batch_size=8) in near
    assert Config(envs_per_actor=16, env_parallel_degree=4, policy_batch_size=4) in near
    assert Config(envs_per_actor=16, env_parallel_degree=4, policy_batch_size=16) in near
    assert Config(envs_per_actor=16, env_parallel_degree=4, policies_per_actor=2, policy_batch_size=8) in near
    assert any(n.num_actors == 2 for n in near)  # the next actor count
    assert all(n.num_actors in (1, 2) for n in near)


def test_space_on_a_ray_cluster_bounds_actors_by_node_cpus():
    """With a cluster, the core budget is its total CPUs and an actor's processes must fit
    on one node: 2 nodes of 4 CPUs hold actors of at most 4 processes, 2 per node at 2."""
    from auturi.resources import ClusterResources

    cluster = ClusterResources(node_cpus=(4, 4), node_gpus=(0, 0))
    s = build_space(8, devices=["cpu"], cluster=cluster)
    assert s.cores == 8
    assert s.configs and all(c.processes_per_actor <= 4 for c in s.configs)
    assert all(sum(n // c.processes_per_actor for n in cluster.node_cpus) >= c.num_actors for c in s.configs)
    big = Config(num_actors=1, envs_per_actor=8, env_parallel_degree=8)  # 8 processes: no node has 8 CPUs
    assert big not in s and "largest node has 4 CPUs" in s.reason_pruned(big)
    small = Config(num_actors=4, envs_per_actor=2, env_parallel_degree=2)  # 2 CPUs each: 2 per node fit
    assert small in s
    crowded = Config(num_actors=4, envs_per_actor=2, env_parallel_degree=1, policies_per_actor=2,
                     policy_batch_size=1)  # 3 CPUs each: one per node, so 2 of 4 fit
    assert "2 fit" in s.reason_pruned(crowded)
    # the same space without a cluster, on 8 local cores, keeps the 8-process config
    assert big in build_space(8, cores=8, devices=["cpu"])
    # a CUDA policy needs a GPU per actor in the cluster
    gpu = build_space(4, cluster=ClusterResources(node_cpus=(8,), node_gpus=(1,)))
    assert "cuda" in gpu.devices
    assert Config(num_actors=1, envs_per_actor=4, policy_device="cuda") in gpu
    assert "do not fit" in gpu.reason_pruned(Config(num_actors=2, envs_per_actor=2, policy_device="cuda"))


def test_an_env_that_waits_gets_a_process_per_env_on_a_small_machine():
    """A remote simulator's processes hold no core while they wait: with the profile's CPU
    share the cap counts env-stepping processes by it (at least a quarter), so 16 envs on 2
    cores may run 16 env processes; replicas still count whole, and a computing env keeps
    the plain cap."""
    one_per_env = [Config(num_actors=1, envs_per_actor=16, env_parallel_degree=16), Config(num_actors=16, envs_per_actor=1)]
    plain, waits = build_space(16, cores=2, devices=["cpu"]), build_space(16, cores=2, devices=["cpu"], env_cpu_fraction=0.04)
    assert not any(c in plain for c in one_per_env) and all(c in waits for c in one_per_env)
    assert plain.reason_pruned(one_per_env[0]) == "more processes (15) than 4x cores (2)"
    assert set(plain.configs) < set(waits.configs) and waits.env_cpu_fraction == pytest.approx(0.04)
    replicas = Config(num_actors=1, envs_per_actor=16, env_parallel_degree=8, policies_per_actor=8, policy_batch_size=2)
    assert replicas not in waits  # 7 env workers at a quarter + 8 replicas whole: 9.75 > 8
    assert "counting env processes by their CPU share" in waits.reason_pruned(replicas)
    kinds = waits.sizes()["pruned_by_reason"]  # counted by kind, whatever the numbers
    assert set(kinds) == {"more processes than 4x cores", "policies_per_actor*policy_batch_size > envs_per_actor"}
    assert build_space(16, cores=2, devices=["cpu"], env_cpu_fraction=1.0).configs == plain.configs
